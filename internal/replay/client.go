package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/trace"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

const (
	// DefaultModel is the model named in requests when none is given and
	// the target does not list any.
	DefaultModel = "default"
	// SessionHeader carries the request's session id to the router.
	SessionHeader = "X-Session-ID"
	// TenantHeader and PriorityHeader carry the request's tenant and
	// priority (tenant.TenantHeader, tenant.PriorityHeader).
	TenantHeader   = "X-Gorgo-Tenant"
	PriorityHeader = "X-Gorgo-Priority"
	// ReplicaHeader is the response header in which gorgo's proxy names the
	// replica that served a request.
	ReplicaHeader = "X-Gorgo-Replica"
	// OutputTokensHeader asks gorgo's engine emulator for exactly this many
	// output tokens; other servers ignore it.
	OutputTokensHeader = "X-Gorgo-Output-Tokens"
)

// maxErrorBody bounds how much of an error response is read (bytes).
const maxErrorBody = 64 << 10

// ParseTarget checks a server's base URL (http or https, with a host, no
// query or fragment) and returns it without a trailing "/" or "/v1": the
// replayer appends "/v1/...".
func ParseTarget(s string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("target %q: %w", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("target %q: want an http:// or https:// base URL such as http://127.0.0.1:8080", s)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("target %q: no host", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("target %q: a base URL has no query or fragment", s)
	}
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v1")
	u.RawPath = ""
	return u, nil
}

// NewHTTPClient returns a client for long streams: no overall timeout
// (cancel through the request's context), no transparent compression
// (which could hold back events), and as many idle connections per host as
// maxInflight (at least 64), so that a replay at its cap reuses connections.
func NewHTTPClient(maxInflight int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = max(maxInflight, DefaultMaxInflight)
	t.MaxIdleConns = max(t.MaxIdleConns, t.MaxIdleConnsPerHost)
	t.DisableCompression = true
	return &http.Client{Transport: t}
}

// ErrRefused is Models' error when the target refuses the client: it
// asks for an API key (WithAPIKey), or does not take the one given.
var ErrRefused = errors.New("refused the client")

// WithAPIKey returns hc sending key as a bearer token with each request,
// as OpenAI's clients send theirs (a router or server that asks for
// client keys); with key empty, hc itself.
func WithAPIKey(hc *http.Client, key string) *http.Client {
	if key == "" {
		return hc
	}
	c := *hc
	next := c.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	c.Transport = bearer{key: key, next: next}
	return &c
}

// bearer is a transport that sets each request's Authorization.
type bearer struct {
	key  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context()) // a RoundTripper must not change its request
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.next.RoundTrip(r)
}

// Models asks GET {target}/v1/models for the ids of the models the server
// serves, its base models before its adapters. An error means the target could not be reached (or the request
// was cancelled) or refused the client (401, 403: no key, or not one it
// takes); a server that answers without a usable list gives no ids and
// no error.
func Models(ctx context.Context, hc *http.Client, target *url.URL) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target.JoinPath("v1", "models").String(), nil)
	if err != nil {
		return nil, fmt.Errorf("asking for models: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("target %s unreachable: %w", target.Redacted(), unwrapURL(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return nil, fmt.Errorf("target %s %w (%d: %s)", target.Redacted(), ErrRefused, resp.StatusCode, wire.ErrorMessage(msg))
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil
	}
	var list struct {
		Data []struct {
			ID     string `json:"id"`
			Parent string `json:"parent"`
		} `json:"data"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&list) != nil {
		return nil, nil
	}
	// Base models first: an adapter (an entry whose parent names its
	// base, as vLLM and gorgo list them) is no default for a replay.
	var ids, adapters []string
	for _, m := range list.Data {
		switch {
		case m.ID == "":
		case m.Parent != "":
			adapters = append(adapters, m.ID)
		default:
			ids = append(ids, m.ID)
		}
	}
	return append(ids, adapters...), nil
}

// unwrapURL drops the "Post \"url\": " prefix of a *url.Error, which every
// record would otherwise repeat.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// wireMessage is a chat message as sent.
type wireMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatBody is the JSON body of a chat completion request.
type chatBody struct {
	Model         string         `json:"model"`
	Messages      []wireMessage  `json:"messages"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
	IgnoreEOS     bool           `json:"ignore_eos"`
	User          string         `json:"user,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// encodeChat returns the request body for msgs: streamed with usage
// (unless whole: stream false, its usage in the answer), ignore_eos and
// max_tokens = max(outputTokens, 1).
func encodeChat(model string, msgs []prompt.Message, outputTokens int, session string, whole bool) ([]byte, error) {
	b := chatBody{Model: model, MaxTokens: max(outputTokens, 1), Stream: !whole, IgnoreEOS: true, User: session}
	if !whole {
		b.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	b.Messages = make([]wireMessage, len(msgs))
	for i, m := range msgs {
		b.Messages[i] = wireMessage(m)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&b); err != nil {
		return nil, fmt.Errorf("encoding request: %w", err)
	}
	return buf.Bytes(), nil
}

// outcome is what one streamed request measured. Times are offsets from
// the moment it was sent; zero when the event never came.
type outcome struct {
	status      int
	replica     string
	ttft, e2e   time.Duration
	itl         time.Duration
	tokenChunks int
	usage       *wire.Usage // the last usage seen, merged
	finished    bool        // [DONE] or a finish_reason was seen
	err         error
	newConn     bool // sent over a connection opened for it
	whole       bool // asked whole (stream false)
}

// sender posts chat completions to one target and measures the streams.
type sender struct {
	hc    *http.Client
	url   string
	clock Clock
}

// send posts body and reads the stream, or the whole answer (whole), to
// its end. sent is when the request was handed to the client (on
// s.clock).
func (s *sender) send(ctx context.Context, body []byte, r *trace.Request, sent time.Time, whole bool) outcome {
	o := outcome{whole: whole}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { o.newConn = !info.Reused }})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		o.err = fmt.Errorf("building request: %w", err)
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if whole {
		req.Header.Set("Accept", "application/json")
	}
	if r.Session != "" {
		req.Header.Set(SessionHeader, r.Session)
	}
	// The trace's tenant and priority, as a trusted gateway would name
	// them (the router takes X-Gorgo-Tenant only where it trusts it).
	if r.Tenant != "" {
		req.Header.Set(TenantHeader, r.Tenant)
	}
	if r.Priority != "" {
		req.Header.Set(PriorityHeader, r.Priority)
	}
	req.Header.Set(OutputTokensHeader, strconv.Itoa(max(r.OutputTokens, 1)))
	resp, err := s.hc.Do(req)
	if err != nil {
		o.e2e = s.clock.Now().Sub(sent)
		o.err = sendError(ctx, err)
		return o
	}
	defer resp.Body.Close()
	o.status = resp.StatusCode
	o.replica = resp.Header.Get(ReplicaHeader)
	if resp.StatusCode/100 != 2 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		o.e2e = s.clock.Now().Sub(sent)
		msg := wire.ErrorMessage(data)
		if msg == "" {
			msg = http.StatusText(resp.StatusCode)
		}
		o.err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, msg)
		return o
	}
	if whole {
		s.readWhole(ctx, resp, sent, r.OutputTokens, &o)
	} else {
		s.read(ctx, resp, sent, &o)
	}
	return o
}

// maxWholeAnswer bounds a whole answer read (bytes) of a request asking
// for at most maxTokens: a megabyte, and 256 bytes a token, far more than
// a token's text escaped in JSON, so that a hostile or broken server
// cannot have the replayer hold more than that for each request in
// flight.
func maxWholeAnswer(maxTokens int) int64 { return 1<<20 + 256*int64(max(maxTokens, 1)) }

// wholeAnswer is what the replayer reads of a whole chat completion
// (wire.PeekBody reads its completion and cached tokens as the router
// does).
type wholeAnswer struct {
	Choices []struct {
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens int `json:"prompt_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// readWhole reads a whole (non-streamed) 2xx answer to a request for at
// most maxTokens into o: its first token reaches the client with its end,
// so its TTFT is its E2E, and it has no inter-token latency. An answer
// whose choice ended with finish_reason "abort" or "error" failed, as a
// stream that ends so does.
func (s *sender) readWhole(ctx context.Context, resp *http.Response, sent time.Time, maxTokens int, o *outcome) {
	limit := maxWholeAnswer(maxTokens)
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	o.e2e = s.clock.Now().Sub(sent)
	switch {
	case err != nil:
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		o.err = fmt.Errorf("reading the answer: %w", err)
		return
	case int64(len(data)) > limit:
		o.err = fmt.Errorf("an answer longer than %d bytes (%d tokens asked)", limit, maxTokens)
		return
	}
	var a wholeAnswer
	if err := json.Unmarshal(data, &a); err != nil {
		o.err = fmt.Errorf("the answer is not a chat completion: %w", err)
		return
	}
	if len(a.Choices) == 0 && len(a.Error) > 0 && string(a.Error) != "null" { // an error in a 2xx
		o.err = fmt.Errorf("the answer is an error: %s", wire.ErrorMessage(data))
		return
	}
	for _, c := range a.Choices {
		if c.FinishReason == "abort" || c.FinishReason == "error" { // vLLM's: the engine gave up on the request
			o.err = fmt.Errorf("the answer ended with finish_reason %q", c.FinishReason)
			return
		}
	}
	n, cached := wire.PeekBody(data)
	if n == 0 {
		o.err = errors.New("the answer has no usage of at least a completion token: its tokens cannot be counted")
		return
	}
	o.finished, o.ttft, o.tokenChunks = true, o.e2e, n
	o.usage = &wire.Usage{CompletionTokens: n, CachedTokens: cached}
	if a.Usage != nil {
		o.usage.PromptTokens = a.Usage.PromptTokens
	}
}

// read consumes the event stream of a 2xx response into o.
func (s *sender) read(ctx context.Context, resp *http.Response, sent time.Time, o *outcome) {
	st := wire.NewStream(resp.Body)
	var first, last time.Time
	events := 0
	for {
		ev, err := st.Next()
		now := s.clock.Now()
		if err == io.EOF {
			o.e2e = now.Sub(sent)
			if !o.finished {
				if events == 0 {
					o.err = fmt.Errorf("no server-sent events in the response (Content-Type %q)", resp.Header.Get("Content-Type"))
				} else {
					o.err = errors.New("stream ended before [DONE] or a finish_reason")
				}
			}
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				err = context.Cause(ctx)
			}
			o.err = fmt.Errorf("reading stream: %w", err)
			o.e2e = now.Sub(sent)
			break
		}
		events++
		if ev.Done {
			o.finished = true
			o.e2e = now.Sub(sent)
			break
		}
		if ev.Err != "" {
			o.err = fmt.Errorf("error in stream: %s", ev.Err)
			o.e2e = now.Sub(sent)
			break
		}
		if ev.HasToken() {
			o.tokenChunks++
			if o.tokenChunks == 1 {
				first = now
				o.ttft = now.Sub(sent)
			}
			last = now
		}
		switch ev.FinishReason {
		case "":
		case "abort", "error": // vLLM's: the engine gave up on the request
			o.finished = true
			if o.err == nil {
				o.err = fmt.Errorf("stream ended with finish_reason %q", ev.FinishReason)
			}
		default:
			o.finished = true
		}
		if u := ev.Usage; u != nil {
			if o.usage == nil {
				o.usage = &wire.Usage{CachedTokens: -1}
			}
			o.usage.PromptTokens, o.usage.CompletionTokens = u.PromptTokens, u.CompletionTokens
			if u.CachedTokens >= 0 {
				o.usage.CachedTokens = u.CachedTokens
			}
		}
		o.e2e = now.Sub(sent)
	}
	if o.err == nil && o.tokenChunks == 0 {
		// Every replayed request asks for a token at least (ignore_eos):
		// an answer without one has no time to first token to record.
		o.err = errors.New("stream finished without a generated token")
	}
	// Per token, not per event: an engine may stream several tokens in one
	// event, and the usage, when it came, says how many there were.
	if tokens := o.tokenChunks; tokens >= 2 {
		if o.usage != nil && o.usage.CompletionTokens > tokens {
			tokens = o.usage.CompletionTokens
		}
		o.itl = last.Sub(first) / time.Duration(tokens-1)
	}
}

// sendError describes a failed round trip: the context's error when the
// replay was stopped, else the transport's error without the URL prefix.
func sendError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("sending: %w", context.Cause(ctx))
	}
	err = unwrapURL(err)
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return fmt.Errorf("connecting: %w", err)
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("sending: connection closed before a response: %w", err)
	}
	return fmt.Errorf("sending: %w", err)
}
