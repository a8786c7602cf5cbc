package proxy

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gorgo-llm/gorgo/internal/emulator"
)

// A replica that fails every request but answers its probes is ejected and
// stays out for its ejection time: probes do not bring it back early, so
// it does not flap. After the ejection time it comes back, fails again,
// and is ejected for longer.
func TestFailingReplicaIsEjectedNotFlapping(t *testing.T) {
	broken := startReplica(t, 2*time.Millisecond, emulator.Faults{FailFraction: 1})
	good := startReplica(t, 40*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, Config{FailureThreshold: 2, ProbeInterval: 20 * time.Millisecond, EjectionTime: time.Hour, MaxEjectionTime: time.Hour}, broken, good)
	for i := range 3 {
		if res := chat(t, url, "question "+string(rune('0'+i)), 2); res.status != 200 || res.replica != "b" {
			t.Fatalf("request %d: %+v", i, res)
		}
	}
	if stateOr(s, "a").Healthy {
		t.Fatal("the failing replica is still up after two failures in a row")
	}
	// Many probes succeed meanwhile; none brings it back.
	before := broken.served()
	for i := range 20 {
		time.Sleep(20 * time.Millisecond)
		if stateOr(s, "a").Healthy {
			t.Fatalf("a probe brought the ejected replica back after %d probe intervals", i)
		}
		chat(t, url, "more", 1)
	}
	if broken.served() != before {
		t.Errorf("the ejected replica took %d requests", broken.served()-before)
	}
	if n := testutil.ToFloat64(s.m.ejections.WithLabelValues("a")); n != 1 {
		t.Errorf("%v ejections, want 1", n)
	}
}

// Ejection times grow with each ejection.
func TestEjectionTimeGrows(t *testing.T) {
	broken := startReplica(t, 2*time.Millisecond, emulator.Faults{FailFraction: 1})
	good := startReplica(t, 40*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, Config{FailureThreshold: 1, ProbeInterval: 10 * time.Millisecond, EjectionTime: 50 * time.Millisecond, MaxEjectionTime: time.Hour}, broken, good)
	var lengths []time.Duration
	for len(lengths) < 3 {
		chat(t, url, "try", 1) // a, if it is back, fails once and is ejected again
		u := s.upstream("a")
		u.mu.Lock()
		n, until := u.health.ejections, u.health.until
		u.mu.Unlock()
		if n > len(lengths) {
			lengths = append(lengths, time.Until(until))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The 1st ejection is 50 ms, the 2nd 100, the 3rd 150 (measured from
	// just after each began).
	if !(lengths[1] > lengths[0] && lengths[2] > lengths[1] && lengths[2] > 100*time.Millisecond) {
		t.Errorf("ejection lengths %v, want growing (50, 100, 150 ms)", lengths)
	}
}

// A frozen replica holds a non-streaming request only until the first-byte
// limit; the request is then served by another replica.
func TestFrozenReplicaNonStreamingFailsOver(t *testing.T) {
	frozen := startReplica(t, 2*time.Millisecond, emulator.Faults{HangAfter: 1})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, Config{ProbeInterval: time.Hour, FirstByteTimeout: 300 * time.Millisecond}, frozen, good)
	if res := chat(t, url, "while it still answers", 1); res.status != 200 || res.replica != "a" {
		t.Fatalf("first request: %+v", res)
	}
	client := &http.Client{Timeout: 20 * time.Second} // the failure would be a hang
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("after it froze", 3, false)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(ReplicaHeader) != "b" {
		t.Errorf("status %d from %q: %.200s", resp.StatusCode, resp.Header.Get(ReplicaHeader), body)
	}
}

// Requests waiting for the first byte of a replica that gets ejected are
// tried elsewhere at once, not when their own limits run out.
func TestEjectionCutsWaitingRequests(t *testing.T) {
	frozen := startReplica(t, 2*time.Millisecond, emulator.Faults{HangAfter: 1})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, Config{ProbeInterval: time.Hour, FirstByteTimeout: time.Hour, HeaderTimeout: time.Hour, FailureThreshold: 1}, frozen, good)
	if res := chat(t, url, "while it still answers", 1); res.status != 200 || res.replica != "a" {
		t.Fatalf("first request: %+v", res)
	}
	type result struct {
		status  int
		replica string
	}
	done := make(chan result, 2)
	for _, stream := range []bool{false, true} {
		go func() {
			resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("stuck", 2, stream)))
			if err != nil {
				done <- result{}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			done <- result{resp.StatusCode, resp.Header.Get(ReplicaHeader)}
		}()
	}
	eventually(t, "both requests to wait on the frozen replica", func() bool { return stateOr(s, "a").InFlight == 2 })
	s.Failure("a") // as a failed probe would: the threshold is 1
	for range 2 {
		select {
		case r := <-done:
			if r.status != 200 || r.replica != "b" {
				t.Errorf("after the ejection: %+v, want 200 from b", r)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a request still waits on the ejected replica")
		}
	}
}

// A client that reads a stream to [DONE] and closes its connection at once
// was served completely: 200, with its TTFT and E2E measured, not a 499.
func TestCompleteStreamIsNot499(t *testing.T) {
	slowEnd := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":" hi"}}]}`+"\n\n")
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
		io.WriteString(w, "data: [DONE]\n\n")
		w.(http.Flusher).Flush()
		// The engine is slow to end its response after [DONE].
		select {
		case <-r.Context().Done():
		case <-time.After(2 * time.Second):
		}
	})
	s, url := startProxy(t, Config{ProbeInterval: time.Hour}, slowEnd)
	var logs syncBuffer
	s.SetAccessLog(slog.New(slog.NewTextHandler(&logs, nil)))
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hi", 2, true)))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	var got []byte
	for !strings.Contains(string(got), "[DONE]") {
		n, err := resp.Body.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil && !strings.Contains(string(got), "[DONE]") {
			t.Fatalf("read %q: %v", got, err)
		}
	}
	resp.Body.Close() // gone right after [DONE]
	eventually(t, "the access log line", func() bool { return strings.Contains(logs.String(), "msg=request") })
	if line := logs.String(); !strings.Contains(line, "status=200") {
		t.Errorf("a complete stream logged as %s", line)
	}
	if _, m := do(t, "GET", url+"/metrics", ""); !strings.Contains(m, `gorgo_e2e_seconds_count{replica="a"} 1`) || !strings.Contains(m, `gorgo_ttft_seconds_count{replica="a"} 1`) {
		t.Error("the complete stream is missing from gorgo_e2e_seconds or gorgo_ttft_seconds")
	}
}

// When a replica's round trip jumps while gorgo serves, its probes see it
// and traffic moves away.
func TestRTTJumpMovesTraffic(t *testing.T) {
	near, other := startReplica(t, 5*time.Millisecond, emulator.Faults{}), startReplica(t, 60*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, Config{ProbeInterval: 20 * time.Millisecond, RTTAlpha: 0.5}, near, other)
	if res := chat(t, url, "before", 1); res.replica != "a" {
		t.Fatalf("before the jump: %+v", res)
	}
	near.link.Set(400*time.Millisecond, 0)
	eventually(t, "the router to see the jump", func() bool { return stateOr(s, "a").RTT > 200*time.Millisecond })
	for i := range 3 {
		if res := chat(t, url, fmt.Sprint("after ", i), 1); res.status != 200 || res.replica != "b" {
			t.Errorf("after the jump: %+v", res)
		}
	}
}

// A replica whose /metrics is down or garbage still serves; the failures
// are counted (and logged once per streak).
func TestGarbageMetricsDoNotStopRouting(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			io.WriteString(w, "this is { not an exposition\n")
			return
		}
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"completion_tokens":1}}`)
	})
	s, url := startProxy(t, Config{ScrapeInterval: 10 * time.Millisecond}, up)
	eventually(t, "scrape errors to be counted", func() bool {
		return testutil.ToFloat64(s.m.scrapeErrors.WithLabelValues("a")) >= 2
	})
	if code, _ := do(t, "POST", url+"/v1/chat/completions", chatBody("still there?", 1, false)); code != 200 {
		t.Errorf("status %d", code)
	}
}

// With every replica down, a client gets 503 with Retry-After at once.
func TestAllReplicasDown(t *testing.T) {
	s, url := startProxy(t, Config{ProbeInterval: time.Hour}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	s.Router().Drain("a")
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("x", 1, true)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "no available replica") {
		t.Errorf("%d, Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// A replica five times slower than its peer holds its requests longer, so
// its queue is longer and it gets less of the traffic.
func TestSlowReplicaGetsLessTraffic(t *testing.T) {
	slow := startReplica(t, 10*time.Millisecond, emulator.Faults{Slowdown: 5})
	fast := startReplica(t, 10*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, Config{ProbeInterval: time.Hour}, slow, fast)
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 { // 8 clients
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				body := chatBody(fmt.Sprintf("question %d: %s", i, strings.Repeat("context ", 150)), 30, false)
				resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}()
	}
	for i := range 120 {
		work <- i
	}
	close(work)
	wg.Wait()
	if a, b := slow.served(), fast.served(); b < 3*a/2 {
		t.Errorf("the slow replica took %d requests, the fast one %d: want the fast one to take at least 1.5 times as many", a, b)
	} else {
		t.Logf("slow %d, fast %d", a, b)
	}
}
