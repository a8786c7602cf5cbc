package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/route"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// Headers the proxy reads and sets.
const (
	// SessionHeader names the conversation a request belongs to (else the
	// request's "user" field is used).
	SessionHeader = "X-Session-ID"
	// ReplicaHeader, on every forwarded response, names the replica that
	// served it.
	ReplicaHeader = "X-Gorgo-Replica"
)

// maxBody bounds a request body.
const maxBody = 32 << 20

// prefixKeyTokens is how many leading prompt tokens simple session
// affinity hashes (the paper's 256).
const prefixKeyTokens = 256

// inbound is what the proxy reads of a chat or completion request; the
// body is forwarded untouched.
type inbound struct {
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	User                string          `json:"user"`
}

func writeError(w http.ResponseWriter, status int, typ, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": fmt.Sprintf(format, args...), "type": typ, "param": nil, "code": status}})
}

// parse reads a request into the router's view of it.
func (s *Server) parse(r *http.Request, chat bool) (body []byte, req route.Request, stream bool, err error) {
	body, err = io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		return nil, req, false, fmt.Errorf("reading the request: %w", err)
	}
	var in inbound
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, req, false, fmt.Errorf("malformed JSON: %w", err)
	}
	var text []byte
	if chat {
		if len(in.Messages) == 0 {
			return nil, req, false, errors.New("messages: at least one message is required")
		}
		msgs := make([]prompt.Message, len(in.Messages))
		for i, m := range in.Messages {
			c, err := prompt.ContentText(m.Content)
			if err != nil {
				return nil, req, false, fmt.Errorf("messages[%d]: %w", i, err)
			}
			msgs[i] = prompt.Message{Role: m.Role, Content: c}
		}
		text = prompt.Chat(nil, msgs)
	} else {
		var p string
		if err := json.Unmarshal(in.Prompt, &p); err != nil {
			var list []string
			if err := json.Unmarshal(in.Prompt, &list); err != nil || len(list) != 1 {
				return nil, req, false, errors.New("prompt: a string (or a list of one string) is required")
			}
			p = list[0]
		}
		text = []byte(p)
	}
	req.PromptTokens = s.est.Tokens(text)
	req.Blocks = s.est.Blocks(text, s.cfg.BlockTokens, nil)
	req.PrefixKey = xxhash.Sum64(text[:min(len(text), s.est.Bytes(prefixKeyTokens))])
	req.SessionKey = r.Header.Get(SessionHeader)
	if req.SessionKey == "" {
		req.SessionKey = in.User
	}
	switch {
	case in.MaxCompletionTokens != nil:
		req.MaxOutputTokens = *in.MaxCompletionTokens
	case in.MaxTokens != nil:
		req.MaxOutputTokens = *in.MaxTokens
	}
	return body, req, in.Stream, nil
}

// handleCompletion serves POST /v1/chat/completions (chat) and
// /v1/completions.
func (s *Server) handleCompletion(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		received := time.Now()
		body, req, stream, err := s.parse(r, chat)
		if err != nil {
			s.m.requests.WithLabelValues("", "400").Inc()
			writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
			return
		}
		skip := make([]bool, len(s.reps))
		var lastStatus int
		var lastBody []byte
		var lastErr error
		for attempt := 0; attempt < s.cfg.MaxAttempts; attempt++ {
			decided := time.Now()
			t, err := s.rt.RouteExcept(s.now(), &req, s.rng, skip)
			s.m.decision.Observe(time.Since(decided).Seconds())
			if err != nil {
				break // nothing left to try
			}
			u := s.reps[t.Replica]
			sent := time.Now()
			resp, err := s.send(r, u, body)
			if err != nil {
				s.rt.Finish(&t)
				if r.Context().Err() != nil { // the client left: not the replica's fault
					s.m.requests.WithLabelValues(u.cfg.ID, "499").Inc()
					return
				}
				s.failed(t.Replica)
				s.m.retries.WithLabelValues(u.cfg.ID).Inc()
				skip[t.Replica], lastErr = true, err
				continue
			}
			if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
				lastBody, _ = io.ReadAll(io.LimitReader(resp.Body, 64<<10))
				resp.Body.Close()
				s.rt.Finish(&t)
				if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
					s.failed(t.Replica) // 503 and 429 say "busy", not "broken"
				}
				s.m.retries.WithLabelValues(u.cfg.ID).Inc()
				skip[t.Replica], lastStatus, lastErr = true, resp.StatusCode, nil
				continue
			}
			s.relay(w, r, resp, &t, u, received, sent, stream)
			return
		}
		switch {
		case lastStatus != 0:
			s.m.requests.WithLabelValues("", strconv.Itoa(lastStatus)).Inc()
			writeError(w, lastStatus, "ServiceUnavailableError", "every replica tried failed; the last said: %s", wire.ErrorMessage(lastBody))
		case lastErr != nil:
			s.m.requests.WithLabelValues("", "502").Inc()
			writeError(w, http.StatusBadGateway, "BadGatewayError", "every replica tried failed; the last: %v", lastErr)
		default:
			s.m.requests.WithLabelValues("", "503").Inc()
			writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "no healthy replica")
		}
	}
}

// hopByHop are the headers a proxy must not forward.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Accept-Encoding"}

// send forwards the request to replica u.
func (s *Server) send(r *http.Request, u *upstream, body []byte) (*http.Response, error) {
	target := u.cfg.URL + r.URL.Path
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	up, err := http.NewRequestWithContext(r.Context(), r.Method, target, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	up.Header = r.Header.Clone()
	for _, h := range hopByHop {
		up.Header.Del(h)
	}
	return s.client.Do(up)
}

// relay streams a replica's answer to the client, timing it and feeding
// the outcome back. Once bytes reached the client, a failure aborts the
// client's connection rather than pretend the answer ended well.
func (s *Server) relay(w http.ResponseWriter, r *http.Request, resp *http.Response, t *router.Ticket, u *upstream, received, sent time.Time, stream bool) {
	defer resp.Body.Close()
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
	h.Set(ReplicaHeader, u.cfg.ID)
	w.WriteHeader(resp.StatusCode)
	code := strconv.Itoa(resp.StatusCode)
	fl, _ := w.(http.Flusher)

	var (
		first, last time.Time
		tokens      int
		cached      = -1
		readErr     error
	)
	if resp.StatusCode != http.StatusOK {
		_, readErr = io.Copy(w, resp.Body) // an engine's 4xx: the client's problem
	} else if stream {
		br := bufio.NewReaderSize(resp.Body, 32<<10)
		var event []byte
		for {
			line, err := br.ReadSlice('\n')
			if len(line) > 0 {
				if _, werr := w.Write(line); werr != nil {
					readErr = werr
					break
				}
				event = append(event, line...)
				if len(bytes.TrimRight(line, "\r\n")) == 0 { // end of an event
					if fl != nil {
						fl.Flush()
					}
					n, c := scanEvent(event)
					if n > 0 {
						now := time.Now()
						if first.IsZero() {
							first = now
							s.rt.FirstToken(t, now.Sub(sent))
						}
						last, tokens = now, tokens+n
					}
					if c >= 0 {
						cached = c
					}
					event = event[:0]
				}
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil {
				if err != io.EOF {
					readErr = err
				}
				break
			}
		}
		if fl != nil {
			fl.Flush()
		}
	} else {
		data, err := io.ReadAll(resp.Body)
		readErr = err
		if _, werr := w.Write(data); werr != nil && readErr == nil {
			readErr = werr
		}
		first, last = time.Now(), time.Now()
		s.rt.FirstToken(t, first.Sub(sent))
		var v struct {
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
				Details          *struct {
					Cached *int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal(data, &v) == nil && v.Usage != nil {
			tokens = v.Usage.CompletionTokens
			if v.Usage.Details != nil && v.Usage.Details.Cached != nil {
				cached = *v.Usage.Details.Cached
			}
		}
	}
	end := time.Now()
	s.rt.Finish(t)
	if cached >= 0 {
		s.rt.CachedReport(t, cached)
	}
	failed := readErr != nil || first.IsZero() && resp.StatusCode == http.StatusOK
	switch {
	case r.Context().Err() != nil:
		code = "499"
	case readErr != nil:
		code = "502"
		s.failed(t.Replica)
	}
	s.m.requests.WithLabelValues(u.cfg.ID, code).Inc()
	if s.log != nil {
		attrs := []any{"replica", u.cfg.ID, "status", code, "prompt_tokens", t.PromptTokens, "est_cached_tokens", t.EstCachedTokens,
			"cached_tokens", cached, "output_tokens", tokens, "e2e_ms", ms(end.Sub(received))}
		if !first.IsZero() {
			attrs = append(attrs, "ttft_ms", ms(first.Sub(received)))
		}
		if readErr != nil {
			attrs = append(attrs, "error", readErr.Error())
		}
		s.log.Info("request", attrs...)
	}
	if !first.IsZero() {
		s.m.ttft.WithLabelValues(u.cfg.ID).Observe(first.Sub(received).Seconds())
		s.m.e2e.WithLabelValues(u.cfg.ID).Observe(end.Sub(received).Seconds())
	}
	if l, ok := s.policy.(route.Learner); ok && resp.StatusCode == http.StatusOK && code != "499" {
		o := route.Outcome{Failed: failed}
		if !failed {
			o.TTFT, o.E2E = first.Sub(sent), end.Sub(sent)
			if tokens > 1 {
				o.ITL = last.Sub(first) / time.Duration(tokens-1)
			}
		}
		l.Learn(t.Tag, o)
	}
	if readErr != nil && r.Context().Err() == nil {
		panic(http.ErrAbortHandler) // headers are out: cut the stream, don't fake its end
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// scanEvent reads one SSE event: how many tokens it carries and the cached
// tokens its usage reports (-1 if none).
func scanEvent(event []byte) (tokens, cached int) {
	cached = -1
	for _, line := range bytes.Split(event, []byte("\n")) {
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if len(data) == 0 || string(data) == "[DONE]" {
			continue
		}
		ev, err := wire.ParseChunk(data)
		if err != nil {
			continue
		}
		if ev.HasToken() {
			tokens++
		}
		if ev.Usage != nil && ev.Usage.CachedTokens >= 0 {
			cached = ev.Usage.CachedTokens
		}
	}
	return tokens, cached
}
