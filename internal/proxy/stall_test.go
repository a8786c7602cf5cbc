package proxy

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
)

// vllmMetrics is a vLLM engine's /metrics with the given token counters.
func vllmMetrics(w http.ResponseWriter, tokens int64) {
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

// A replica that hangs with its health checks passing (vLLM's /health asks
// only whether its engine process lives) is ejected once a request has
// waited stall_timeout for its answer to begin with nothing else begun,
// and the requests it holds are served elsewhere: a stream that got its
// headers and no event, and, where the engine's counters show it stands
// still, a request whose whole answer would come at its end (2026-12-06,
// a user's test: such a replica held requests until first_byte_timeout,
// 5 min, and drew new ones, looking idle).
func TestHungReplicaWithPassingHealthIsEjected(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stream  bool
		metrics bool
	}{
		{"a stream, without metrics", true, false},
		{"a whole answer, its engine's counters standing still", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hung := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/metrics" {
					if !tc.metrics {
						http.NotFound(w, r)
						return
					}
					vllmMetrics(w, 7)
					return
				}
				if tc.stream { // vLLM sends a stream's headers at once
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(200)
					w.(http.Flusher).Flush()
				}
				<-r.Context().Done()
			})
			good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
			s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: 50 * time.Millisecond, ScrapeInterval: 50 * time.Millisecond, StallTimeout: 400 * time.Millisecond}}, hung, good)
			eventually(t, "both replicas probed", func() bool { return stateOr(s, "a").Available() && stateOr(s, "b").Available() })
			if code, body, replica := post(t, url, chatBody("x", 1, tc.stream)); code != 200 || replica != "b" {
				t.Errorf("status %d from %q: %.200s", code, replica, body)
			}
			if hung.Served() == 0 {
				t.Error("the hung replica was never tried: the test proves nothing")
			}
			if stateOr(s, "a").Healthy {
				t.Error("the hung replica is not ejected")
			}
		})
	}
}

// A whole answer that takes longer than stall_timeout is not a stall by
// itself: it comes at its end. Without the engine's counters, or with
// counters that move, the replica keeps it (and its health).
func TestLongWholeAnswerIsNoStall(t *testing.T) {
	for _, tc := range []struct {
		name    string
		metrics bool
	}{
		{"without metrics", false},
		{"its engine's counters moving", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tokens atomic.Int64
			slow := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/metrics" {
					if !tc.metrics {
						http.NotFound(w, r)
						return
					}
					vllmMetrics(w, tokens.Add(1))
					return
				}
				select {
				case <-r.Context().Done():
					return
				case <-time.After(1500 * time.Millisecond):
				}
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
			})
			good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
			s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: 50 * time.Millisecond, ScrapeInterval: 50 * time.Millisecond, StallTimeout: 400 * time.Millisecond}}, slow, good)
			eventually(t, "both replicas probed", func() bool { return stateOr(s, "a").Available() && stateOr(s, "b").Available() })
			if code, body, replica := post(t, url, chatBody("x", 1, false)); code != 200 || replica != "a" {
				t.Errorf("status %d from %q: %.200s", code, replica, body)
			}
			if !stateOr(s, "a").Healthy {
				t.Error("the slow replica was ejected")
			}
		})
	}
}

// An engine paused through the router (vLLM's /pause, until /resume)
// holds its requests as it was asked to: no stall, however long.
func TestPausedReplicaIsNoStall(t *testing.T) {
	resumed := make(chan struct{})
	var paused atomic.Bool
	held := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			vllmMetrics(w, 7)
			return
		case "/pause":
			paused.Store(true)
			fmt.Fprint(w, `{}`)
			return
		case "/resume":
			if paused.Swap(false) {
				close(resumed)
			}
			fmt.Fprint(w, `{}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		if paused.Load() {
			select {
			case <-r.Context().Done():
				return
			case <-resumed:
			}
		}
		fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: 50 * time.Millisecond, ScrapeInterval: 50 * time.Millisecond, StallTimeout: 300 * time.Millisecond}}, held, good)
	eventually(t, "both replicas probed", func() bool { return stateOr(s, "a").Available() && stateOr(s, "b").Available() })
	if code, body := do(t, "POST", url+"/pause", `{"mode":"keep"}`); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
	type result struct {
		code          int
		body, replica string
	}
	done := make(chan result, 1)
	go func() {
		code, body, replica := post(t, url, chatBody("x", 1, true))
		done <- result{code, body, replica}
	}()
	time.Sleep(time.Second) // three stall timeouts, probed every 50 ms
	if code, body := do(t, "POST", url+"/resume", ``); code != 200 {
		t.Fatalf("resume: %d %s", code, body)
	}
	if r := <-done; r.code != 200 || r.replica != "a" {
		t.Errorf("status %d from %q: %.200s", r.code, r.replica, r.body)
	}
	if !stateOr(s, "a").Healthy {
		t.Error("the paused replica was ejected")
	}
}
