package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// received is a chat completion request as the fake server saw it.
type received struct {
	Path    string
	Session string
	Body    struct {
		Model         string        `json:"model"`
		Messages      []wireMessage `json:"messages"`
		MaxTokens     int           `json:"max_tokens"`
		Stream        bool          `json:"stream"`
		StreamOptions *struct {     // nil: not sent
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		IgnoreEOS bool   `json:"ignore_eos"`
		User      string `json:"user"`
	}
}

// fakeServer is an OpenAI-compatible test server: it lists one model and
// answers chat completions with handle, after recording them.
type fakeServer struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []received
}

func newFakeServer(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, rec received)) *fakeServer {
	t.Helper()
	f := &fakeServer{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","object":"model"},{"id":"other"}]}`)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		rec := received{Path: r.URL.Path, Session: r.Header.Get(SessionHeader)}
		if err := json.NewDecoder(r.Body).Decode(&rec.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.reqs = append(f.reqs, rec)
		f.mu.Unlock()
		handle(w, r, rec)
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) received() []received {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]received(nil), f.reqs...)
}

// sse writes server-sent events, flushing each at once.
type sse struct {
	w http.ResponseWriter
}

func startSSE(w http.ResponseWriter) sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	return sse{w}
}

func (s sse) data(v string) {
	fmt.Fprintf(s.w, "data: %s\n\n", v)
	s.w.(http.Flusher).Flush()
}

func (s sse) content(text string) {
	s.data(fmt.Sprintf(`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`, text))
}

func (s sse) finish() {
	s.data(`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`)
}

func (s sse) usage(prompt, completion, cached int) {
	s.data(fmt.Sprintf(`{"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`,
		prompt, completion, prompt+completion, cached))
}

func (s sse) done() { s.data("[DONE]") }

// quick answers at once with n tokens, usage and [DONE].
func quick(w http.ResponseWriter, n int) {
	s := startSSE(w)
	for i := range n {
		s.content(fmt.Sprintf("t%d ", i))
	}
	s.finish()
	s.usage(10, n, 0)
	s.done()
}

// manualClock is a Clock that jumps to every time it is asked to sleep to.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	c.mu.Unlock()
	return ctx.Err()
}
