package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

var vllmMetrics = servetest.VLLMMetrics

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
	held := fakeUpstream(t, servetest.NewPausable().Handler(0))
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

func sglangMetrics(w http.ResponseWriter) {
	fmt.Fprint(w, `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 1
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 1
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="m"} 50
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 100
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 7
`)
}

const chunk = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n"

// A full SGLang engine: one stream decodes (its tokens flow through the
// router all along), the next waits in the engine's queue until it ends.
// SGLang's token counters move only when a request ends; the tokens read
// are the replica's progress, and it is not ejected (review, 2026-12-06:
// only an answer's beginning counted).
func TestBusyReplicaStreamingIsNoStall(t *testing.T) {
	finished := make(chan struct{})
	busy := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			sglangMetrics(w)
			return
		}
		if r.Method != http.MethodPost { // a probe's question (GET /is_sleeping)
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		if r.Header.Get("X-Test") == "queued" {
			select { // waits for a slot
			case <-r.Context().Done():
				return
			case <-finished:
			}
		} else {
			defer close(finished)
			for range 20 { // decodes for 2 s, a token every 100 ms
				fmt.Fprint(w, chunk)
				w.(http.Flusher).Flush()
				time.Sleep(100 * time.Millisecond)
			}
		}
		fmt.Fprint(w, chunk+"data: [DONE]\n\n")
	})
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: 50 * time.Millisecond, ScrapeInterval: 50 * time.Millisecond, StallTimeout: 400 * time.Millisecond}}, busy)
	eventually(t, "probed", func() bool { return stateOr(s, "a").Available() })
	first := make(chan int, 1)
	go func() { code, _, _ := post(t, url, chatBody("x", 1, true)); first <- code }()
	time.Sleep(200 * time.Millisecond)
	code, body, _ := post(t, url, chatBody("y", 1, true), "X-Test", "queued")
	if code != 200 {
		t.Errorf("the queued stream: %d %.200s", code, body)
	}
	if c := <-first; c != 200 {
		t.Errorf("the decoding stream: %d", c)
	}
	if !stateOr(s, "a").Healthy {
		t.Error("a replica streaming tokens through the router all along was ejected as stalled")
	}
}

// vLLM counts a request's prompt tokens when its prefill completes (V1's
// IterationStats: no output for a partial prefill), so on an engine with
// one long prompt to prefill its counters stand still until the first
// token. A request's wait counts towards a stall only past twice its
// forecast first token, which a long prompt's prefill is part of (review,
// 2026-12-06: a long prefill was ejected, and its request retried on the
// next replica, ejecting it in turn).
func TestLongPrefillIsNoStall(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			prefill := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/metrics" {
					vllmMetrics(w, 7) // standing still during the prefill
					return
				}
				if stream {
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(200)
					w.(http.Flusher).Flush()
				}
				select {
				case <-r.Context().Done():
					return
				case <-time.After(1500 * time.Millisecond): // the prefill
				}
				if stream {
					fmt.Fprint(w, chunk+"data: [DONE]\n\n")
					return
				}
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
			})
			s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: 50 * time.Millisecond, ScrapeInterval: 50 * time.Millisecond, StallTimeout: 400 * time.Millisecond}}, prefill)
			eventually(t, "probed", func() bool { return stateOr(s, "a").Available() })
			// 40,000 tokens: a forecast of 2.5 s at the profile's rate,
			// longer than the stall timeout, as the prefill is.
			if code, body, _ := post(t, url, chatBody(strings.Repeat("long ", 32000), 1, stream)); code != 200 {
				t.Errorf("%d %.200s", code, body)
			}
			if !stateOr(s, "a").Healthy {
				t.Error("a vLLM replica in a long prefill was ejected as stalled")
			}
		})
	}
}

// A pause through the router reaches every replica at once; one answers
// at once, another takes long (vLLM's /pause waits for its requests to
// end in mode "wait"). The one paused first holds its requests as asked
// meanwhile: no stall (review, 2026-12-06: a replica was held only once
// every replica had answered).
func TestPauseAnsweredFirstIsNoStall(t *testing.T) {
	engine := servetest.NewPausable()
	a, b := fakeUpstream(t, engine.Handler(0)), fakeUpstream(t, engine.Handler(3*time.Second)) // b's requests drain
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: 50 * time.Millisecond, ScrapeInterval: 50 * time.Millisecond, StallTimeout: 300 * time.Millisecond}}, a, b)
	eventually(t, "probed", func() bool { return stateOr(s, "a").Available() && stateOr(s, "b").Available() })
	pause := make(chan int, 1)
	go func() { code, _ := do(t, "POST", url+"/pause", `{"mode":"wait"}`); pause <- code }()
	eventually(t, "the pause to reach the engines", engine.Paused)
	var wg sync.WaitGroup
	for i := 0; i < 10 && stateOr(s, "a").InFlight == 0; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); post(t, url, chatBody(fmt.Sprint("prompt ", i), 1, true)) }()
		time.Sleep(100 * time.Millisecond)
	}
	if stateOr(s, "a").InFlight == 0 {
		t.Fatal("no request reached a: the test proves nothing")
	}
	<-pause
	do(t, "POST", url+"/resume", ``)
	wg.Wait()
	if !stateOr(s, "a").Healthy {
		t.Error("the replica paused first was ejected while the pause went on elsewhere")
	}
}
