package servetest

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// VLLMMetrics writes a vLLM engine's /metrics: a request running, its
// token counters at tokens.
func VLLMMetrics(w http.ResponseWriter, tokens int64) {
	fmt.Fprintf(w, `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 100
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} %d
`, tokens)
}

// Pausable is a fake vLLM engine, or several sharing one pause: POST
// /pause holds the chat streams that come until POST /resume (as vLLM's
// development mode does in mode "keep"), and its /metrics counters stand
// still throughout.
type Pausable struct {
	paused, hung atomic.Bool
	once         sync.Once
	resumed      chan struct{}
}

// Hang has the engine hold every chat stream from now on, for ever, its
// health passing.
func (p *Pausable) Hang() { p.hung.Store(true) }

// NewPausable returns an engine not paused.
func NewPausable() *Pausable { return &Pausable{resumed: make(chan struct{})} }

// Paused reports whether a pause reached the engine.
func (p *Pausable) Paused() bool { return p.paused.Load() }

// Handler serves the engine, its /pause answered after delay (vLLM's
// pause in mode "wait" waits for its requests to end).
func (p *Pausable) Handler(delay time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/metrics":
			VLLMMetrics(w, 7)
			return
		case r.URL.Path == "/pause":
			p.paused.Store(true)
			time.Sleep(delay)
			fmt.Fprint(w, `{}`)
			return
		case r.URL.Path == "/resume":
			p.once.Do(func() { close(p.resumed) })
			fmt.Fprint(w, `{}`)
			return
		case r.Method != http.MethodPost: // a probe's question (GET /is_sleeping)
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		if p.hung.Load() {
			<-r.Context().Done()
			return
		}
		if p.paused.Load() {
			select {
			case <-r.Context().Done():
				return
			case <-p.resumed:
			}
		}
		fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}
}
