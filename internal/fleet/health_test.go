package fleet_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/proxy"
)

// A replica that fails every request but answers its probes is ejected and
// stays out for its ejection time: probes do not bring it back early, so
// it does not flap. After the ejection time it comes back, fails again,
// and is ejected for longer.
func TestFailingReplicaIsEjectedNotFlapping(t *testing.T) {
	broken := startReplica(t, 2*time.Millisecond, emulator.Faults{FailFraction: 1})
	good := startReplica(t, 40*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{FailureThreshold: 2, ProbeInterval: 20 * time.Millisecond, EjectionTime: time.Hour, MaxEjectionTime: time.Hour}}, broken, good)
	// Until a has failed twice: on a loaded machine its probed round trip
	// may rise past b's, and a request go to b first.
	for i := 0; broken.Served() < 2; i++ {
		if i == 50 {
			t.Fatalf("the router tried the failing replica %d times in 50 requests", broken.Served())
		}
		if res := chat(t, url, fmt.Sprintf("question %d", i), 2); res.Status != 200 || res.Replica != "b" {
			t.Fatalf("request %d: %+v", i, res)
		}
	}
	if stateOr(s, "a").Healthy {
		t.Fatal("the failing replica is still up after two failures in a row")
	}
	// Many probes succeed meanwhile; none brings it back.
	before := broken.Served()
	for i := range 20 {
		time.Sleep(20 * time.Millisecond)
		if stateOr(s, "a").Healthy {
			t.Fatalf("a probe brought the ejected replica back after %d probe intervals", i)
		}
		chat(t, url, "more", 1)
	}
	if broken.Served() != before {
		t.Errorf("the ejected replica took %d requests", broken.Served()-before)
	}
	if n := s.metric("gorgo_replica_ejections_total", "replica", "a"); n != 1 {
		t.Errorf("%v ejections, want 1", n)
	}
}

// Ejection times grow with each ejection: ejection_time, twice it, three
// times it. What is left of each ejection is read just after the request
// that caused it (which still had to be served elsewhere), so each reading
// is its ejection's length less that delay; with 1 s steps it still
// exceeds the length of the ejection before it unless that delay passes
// a second (400 ms steps were passed under the race detector on a loaded
// machine).
func TestEjectionTimeGrows(t *testing.T) {
	const step = time.Second
	broken := startReplica(t, 2*time.Millisecond, emulator.Faults{FailFraction: 1})
	good := startReplica(t, 40*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{FailureThreshold: 1, ProbeInterval: 10 * time.Millisecond, EjectionTime: step, MaxEjectionTime: time.Hour}}, broken, good)
	var left []time.Duration
	deadline := time.Now().Add(60 * time.Second)
	for len(left) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %d ejections", len(left))
		}
		chat(t, url, "try", 1) // a, if it is back, fails once and is ejected again
		if _, n, until := s.Upstream("a").Health(); n == len(left)+1 && !until.IsZero() {
			left = append(left, time.Until(until))
		}
		time.Sleep(10 * time.Millisecond)
	}
	for k := 1; k < 3; k++ {
		if left[k] <= time.Duration(k)*step {
			t.Errorf("ejection %d had %v left just after it began, want more than ejection %d's %v (all: %v)", k+1, left[k], k, time.Duration(k)*step, left)
		}
	}
}

// A frozen replica holds a non-streaming request only until the first-byte
// limit; the request is then served by another replica.
func TestFrozenReplicaNonStreamingFailsOver(t *testing.T) {
	frozen := startReplica(t, 2*time.Millisecond, emulator.Faults{HangAfter: 1})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: proxy.Config{FirstByteTimeout: time.Second}}, frozen, good) // long enough for b on a busy machine
	if res := chat(t, url, "while it still answers", 1); res.Status != 200 || res.Replica != "a" {
		t.Fatalf("first request: %+v", res)
	}
	client := &http.Client{Timeout: 20 * time.Second} // the failure would be a hang
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("after it froze", 3, false)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(proxy.ReplicaHeader) != "b" {
		t.Errorf("status %d from %q: %.200s", resp.StatusCode, resp.Header.Get(proxy.ReplicaHeader), body)
	}
}

// Requests waiting for the first byte of a replica that gets ejected are
// tried elsewhere at once, not when their own limits run out.
func TestEjectionCutsWaitingRequests(t *testing.T) {
	frozen := startReplica(t, 2*time.Millisecond, emulator.Faults{HangAfter: 1})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, FailureThreshold: 1}, Proxy: proxy.Config{FirstByteTimeout: time.Hour, HeaderTimeout: time.Hour}}, frozen, good)
	if res := chat(t, url, "while it still answers", 1); res.Status != 200 || res.Replica != "a" {
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
			done <- result{resp.StatusCode, resp.Header.Get(proxy.ReplicaHeader)}
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

// When a replica's round trip jumps while gorgo serves, its probes see it
// and traffic moves away.
func TestRTTJumpMovesTraffic(t *testing.T) {
	// Round trips far apart, before and after: a busy machine's probe of
	// a few dozen ms late does not reorder them.
	near, other := startReplica(t, 5*time.Millisecond, emulator.Faults{}), startReplica(t, 150*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: 20 * time.Millisecond, RTTAlpha: 0.5}}, near, other)
	if res := chat(t, url, "before", 1); res.Replica != "a" {
		t.Fatalf("before the jump: %+v", res)
	}
	near.Link.Set(600*time.Millisecond, 0)
	eventually(t, "the router to see the jump", func() bool { return stateOr(s, "a").RTT > 400*time.Millisecond })
	for i := range 3 {
		if res := chat(t, url, fmt.Sprint("after ", i), 1); res.Status != 200 || res.Replica != "b" {
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
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ScrapeInterval: 10 * time.Millisecond}}, up)
	eventually(t, "scrape errors to be counted", func() bool {
		return s.metric("gorgo_scrape_errors_total", "replica", "a") >= 2
	})
	if code, _ := do(t, "POST", url+"/v1/chat/completions", chatBody("still there?", 1, false)); code != 200 {
		t.Errorf("status %d", code)
	}
}

// With every replica down, a client gets 503 with Retry-After at once.
func TestAllReplicasDown(t *testing.T) {
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
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
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, slow, fast)
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
	if a, b := slow.Served(), fast.Served(); b < 3*a/2 {
		t.Errorf("the slow replica took %d requests, the fast one %d: want the fast one to take at least 1.5 times as many", a, b)
	} else {
		t.Logf("slow %d, fast %d", a, b)
	}
}
