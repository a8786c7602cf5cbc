package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
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
	Messages            []prompt.WireMessage `json:"messages"`
	Prompt              json.RawMessage      `json:"prompt"`
	MaxTokens           *int                 `json:"max_tokens"`
	MaxCompletionTokens *int                 `json:"max_completion_tokens"`
	Stream              bool                 `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	User string `json:"user"`
}

func writeError(w http.ResponseWriter, status int, typ, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": fmt.Sprintf(format, args...), "type": typ, "param": nil, "code": status}})
}

// parse reads a request into the router's view of it (for /admin/decide).
func (s *Server) parse(r *http.Request, chat bool) (body []byte, req route.Request, stream bool, err error) {
	body, req, stream, _, err = s.parseUsage(r, chat)
	return body, req, stream, err
}

// parseUsage is parse, and for a stream that did not ask for usage it
// rewrites the body to ask for it (the engine's cached-token report feeds
// the router's prefix index); the caller must then keep the usage chunk
// from the client (injected).
func (s *Server) parseUsage(r *http.Request, chat bool) (body []byte, req route.Request, stream, injected bool, err error) {
	body, req, stream, in, err := s.parseBody(r, chat)
	if err != nil || !stream || (in.StreamOptions != nil && in.StreamOptions.IncludeUsage) {
		return body, req, stream, false, err
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return body, req, stream, false, nil
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := fields["stream_options"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &opts) != nil {
			return body, req, stream, false, nil
		}
	}
	opts["include_usage"] = json.RawMessage("true")
	fields["stream_options"], _ = json.Marshal(opts)
	rewritten, err := json.Marshal(fields)
	if err != nil {
		return body, req, stream, false, nil
	}
	return rewritten, req, stream, true, nil
}

// parseBody reads a request into the router's view of it.
func (s *Server) parseBody(r *http.Request, chat bool) (body []byte, req route.Request, stream bool, in inbound, err error) {
	body, err = io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		return nil, req, false, in, fmt.Errorf("reading the request: %w", err)
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, req, false, in, fmt.Errorf("malformed JSON: %w", err)
	}
	var text []byte
	if chat {
		text, err = prompt.ChatRequestBytes(in.Messages)
	} else {
		text, err = prompt.CompletionBytes(in.Prompt)
	}
	if err != nil {
		return nil, req, false, in, err
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
	return body, req, in.Stream, in, nil
}

// handleCompletion serves POST /v1/chat/completions (chat) and
// /v1/completions.
func (s *Server) handleCompletion(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		received := time.Now()
		body, req, stream, injected, err := s.parseUsage(r, chat)
		if err != nil {
			status := http.StatusBadRequest
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				status = http.StatusRequestEntityTooLarge
			}
			s.m.requests.WithLabelValues("", strconv.Itoa(status)).Inc()
			writeError(w, status, "BadRequestError", "%v", err)
			return
		}
		skip := make([]bool, len(s.reps))
		var last *attemptError
		for range s.cfg.MaxAttempts {
			decided := time.Now()
			t, err := s.rt.Dispatch(s.now(), &req, s.rng, skip)
			s.m.decision.Observe(time.Since(decided).Seconds())
			if err != nil {
				break // nothing left to try
			}
			u := s.reps[t.Replica]
			a, aerr := s.attempt(r, u, body, stream)
			if aerr != nil {
				s.rt.Finish(&t)
				if r.Context().Err() != nil { // the client left: not the replica's fault
					s.m.requests.WithLabelValues(u.cfg.ID, "499").Inc()
					return
				}
				last = aerr
				if aerr.broken {
					s.failed(t.Replica)
				}
				s.m.retries.WithLabelValues(u.cfg.ID).Inc()
				skip[t.Replica] = true
				continue
			}
			s.rt.Accepted(&t, &req)
			s.relay(w, r, a, &t, u, received, stream, injected)
			return
		}
		if last == nil {
			s.m.requests.WithLabelValues("", "503").Inc()
			writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "no healthy replica")
			return
		}
		s.m.requests.WithLabelValues("", strconv.Itoa(last.status)).Inc()
		if ra := last.retryAfter; ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		typ := "ServiceUnavailableError"
		switch last.status {
		case http.StatusTooManyRequests:
			typ = "RateLimitError"
		case http.StatusBadGateway, http.StatusGatewayTimeout:
			typ = "BadGatewayError"
		case http.StatusInternalServerError:
			typ = "InternalServerError"
		}
		writeError(w, last.status, typ, "every replica tried failed; the last (%s): %s", last.replica, last.msg)
	}
}

// attemptError is why an attempt on a replica failed before anything was
// sent to the client.
type attemptError struct {
	replica    string
	status     int    // what to answer if no replica is left
	msg        string // the replica's error message, or the transport error
	retryAfter string
	// broken: the failure counts against the replica (it refused, hung,
	// broke, or answered 5xx); a 503 or 429 only says it is busy.
	broken bool
}

func (e *attemptError) Error() string { return e.replica + ": " + e.msg }

// answer is a replica's answer, read far enough to be sure it is one: for
// a stream, its first event; otherwise the whole body.
type answer struct {
	resp   *http.Response
	head   []byte    // the first event, or the whole body
	headAt time.Time // when head was read
	sent   time.Time
	br     *bufio.Reader
	idle   *time.Timer // cancels the upstream request when it stalls
	cancel context.CancelFunc
}

func (a *answer) close() {
	a.idle.Stop()
	a.resp.Body.Close()
	a.cancel()
}

// attempt sends the request to replica u and reads its answer until it is
// sure the answer can be relayed: a status other than 5xx and 429, and for
// a successful stream its first event. Until then nothing has reached the
// client, so any failure lets the caller try another replica.
func (s *Server) attempt(r *http.Request, u *upstream, body []byte, stream bool) (*answer, *attemptError) {
	ctx, cancel := context.WithCancel(r.Context())
	fail := func(status int, broken bool, msg string) (*answer, *attemptError) {
		cancel()
		return nil, &attemptError{replica: u.cfg.ID, status: status, broken: broken, msg: msg}
	}
	// A stream's headers come at once, even for a queued request, so a
	// replica that sends none is hung. A non-streaming answer's headers come
	// with its last token: no limit there.
	var hung atomic.Bool
	var headerTimer *time.Timer
	if stream && s.cfg.HeaderTimeout > 0 {
		headerTimer = time.AfterFunc(s.cfg.HeaderTimeout, func() {
			if hung.CompareAndSwap(false, true) {
				cancel()
			}
		})
	}
	sent := time.Now()
	resp, err := s.send(r.WithContext(ctx), u, body)
	if headerTimer != nil && !hung.CompareAndSwap(false, true) {
		if resp != nil {
			resp.Body.Close()
		}
		return fail(http.StatusGatewayTimeout, true, fmt.Sprintf("no response headers within %v", s.cfg.HeaderTimeout))
	}
	if err != nil {
		return fail(http.StatusBadGateway, true, err.Error())
	}
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		busy := resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests
		a, e := fail(resp.StatusCode, !busy, wire.ErrorMessage(data))
		e.retryAfter = resp.Header.Get("Retry-After")
		return a, e
	}
	a := &answer{resp: resp, sent: sent, cancel: cancel, br: bufio.NewReaderSize(resp.Body, 32<<10)}
	idle := s.cfg.StreamIdleTimeout
	if idle <= 0 {
		idle = time.Duration(math.MaxInt64)
	}
	a.idle = time.AfterFunc(idle, cancel)
	if resp.StatusCode == http.StatusOK && stream {
		a.head, err = readEvent(a.br, nil)
	} else {
		a.head, err = io.ReadAll(a.br)
		if err == nil {
			err = io.EOF // the whole body is in head
		}
	}
	a.headAt = time.Now()
	if err != nil && err != io.EOF || len(a.head) == 0 && resp.StatusCode == http.StatusOK {
		a.close()
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, &attemptError{replica: u.cfg.ID, status: http.StatusBadGateway, broken: true, msg: "the answer broke before its first event: " + err.Error()}
	}
	return a, nil
}

// readEvent appends to dst the lines of one SSE event, through the blank
// line that ends it (or the end of the stream).
func readEvent(br *bufio.Reader, dst []byte) ([]byte, error) {
	for {
		line, err := br.ReadSlice('\n')
		dst = append(dst, line...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return dst, err
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 && len(dst) > len(line) {
			return dst, nil
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			dst = dst[:0] // a stray blank line before any field
		}
	}
}

// hopByHop are the headers a proxy must not forward.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Accept-Encoding"}

// copyHeaders copies a replica's response headers for the client.
func copyHeaders(dst, src http.Header) {
	for k, v := range src {
		dst[k] = v
	}
	for _, k := range hopByHop {
		dst.Del(k)
	}
}

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

// relay sends a replica's answer to the client as it comes, timing it and
// feeding the outcome back. Once bytes reached the client, a failure
// aborts the client's connection rather than pretend the answer ended well.
func (s *Server) relay(w http.ResponseWriter, r *http.Request, a *answer, t *router.Ticket, u *upstream, received time.Time, stream, injected bool) {
	defer a.close()
	copyHeaders(w.Header(), a.resp.Header)
	w.Header().Set(ReplicaHeader, u.cfg.ID)
	w.WriteHeader(a.resp.StatusCode)
	code := strconv.Itoa(a.resp.StatusCode)
	fl, _ := w.(http.Flusher)
	ok := a.resp.StatusCode == http.StatusOK

	var (
		first, last time.Time
		tokens      int
		cached      = -1
		relayErr    error // the replica's
		clientErr   error
	)
	// note reads an event's tokens and usage; it reports whether the event
	// is the usage chunk the client did not ask for.
	note := func(event []byte, at time.Time) (hide bool) {
		n, c, usageOnly := scanEvent(event)
		if n > 0 {
			if first.IsZero() {
				first = at
				s.rt.FirstToken(t, at.Sub(a.sent))
			}
			last, tokens = at, tokens+n
		}
		if c >= 0 {
			cached = c
		}
		return injected && usageOnly
	}
	if !stream || !ok {
		_, clientErr = w.Write(a.head)
		if ok {
			tokens, cached = scanBody(a.head)
		}
	} else {
		event, at := a.head, a.headAt
		for {
			if !note(event, at) {
				if _, err := w.Write(event); err != nil {
					clientErr = err
					break
				}
				if fl != nil {
					fl.Flush()
				}
			}
			var err error
			event, err = readEvent(a.br, event[:0])
			at = time.Now()
			if s.cfg.StreamIdleTimeout > 0 {
				a.idle.Reset(s.cfg.StreamIdleTimeout)
			}
			if err != nil {
				if len(event) > 0 && !note(event, at) {
					_, _ = w.Write(event)
				}
				if err != io.EOF {
					relayErr = err
				}
				break
			}
		}
		if fl != nil {
			fl.Flush()
		}
	}
	end := time.Now()
	s.rt.Finish(t)
	if cached >= 0 {
		s.rt.CachedReport(t, cached)
	}
	switch {
	case r.Context().Err() != nil || clientErr != nil:
		code = "499"
	case relayErr != nil:
		code = "502"
		s.failed(t.Replica)
	}
	s.m.requests.WithLabelValues(u.cfg.ID, code).Inc()
	if s.log != nil {
		attrs := []any{"replica", u.cfg.ID, "status", code, "stream", stream, "prompt_tokens", t.PromptTokens,
			"est_cached_tokens", t.EstCachedTokens, "cached_tokens", cached, "output_tokens", tokens, "e2e_ms", ms(end.Sub(received))}
		if !first.IsZero() {
			attrs = append(attrs, "ttft_ms", ms(first.Sub(received)))
		}
		if relayErr != nil {
			attrs = append(attrs, "error", relayErr.Error())
		}
		s.log.Info("request", attrs...)
	}
	if ok && code != "499" {
		s.m.e2e.WithLabelValues(u.cfg.ID).Observe(end.Sub(received).Seconds())
	}
	// Only a stream says when its first token came: a non-streaming answer
	// is timed by its end, which is no TTFT.
	if stream && ok && code != "499" {
		if !first.IsZero() {
			s.m.ttft.WithLabelValues(u.cfg.ID).Observe(first.Sub(received).Seconds())
		}
		if l, isLearner := s.policy.(route.Learner); isLearner {
			o := route.Outcome{Failed: relayErr != nil || first.IsZero()}
			if !o.Failed {
				o.TTFT, o.E2E = first.Sub(a.sent), end.Sub(a.sent)
				if tokens > 1 {
					o.ITL = last.Sub(first) / time.Duration(tokens-1)
				}
			}
			l.Learn(t.Tag, o)
		}
	}
	if relayErr != nil && r.Context().Err() == nil && clientErr == nil {
		panic(http.ErrAbortHandler) // headers are out: cut the stream, don't fake its end
	}
}

// scanBody reads a non-streaming answer's usage: completion tokens and the
// cached tokens (-1 if not reported).
func scanBody(data []byte) (tokens, cached int) {
	cached = -1
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
	return tokens, cached
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// scanEvent reads one SSE event: how many tokens it carries, the cached
// tokens its usage reports (-1 if none), and whether it is a usage chunk
// and nothing else (no token, no finish reason).
func scanEvent(event []byte) (tokens, cached int, usageOnly bool) {
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
		usageOnly = ev.Usage != nil && !ev.HasToken() && ev.FinishReason == ""
	}
	return tokens, cached, usageOnly
}
