package fleet_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/mesh"
	"github.com/gorgo-llm/gorgo/internal/proxy"
	"github.com/gorgo-llm/gorgo/internal/tenant"
)

// Two routers over the same replicas share their requests over NATS; one
// router's bus connection is cut mid-run: every request is still served,
// and each router saw the other's requests while the bus was up.
func TestMeshRoutersSurviveABusCut(t *testing.T) {
	url := startBus(t)
	a, b := startReplica(t, 5*time.Millisecond, emulator.Faults{}), startReplica(t, 5*time.Millisecond, emulator.Faults{})
	us, usURL := startProxy(t, testConfig{Fleet: fleet.Config{Region: "us", Mesh: &mesh.Config{URL: url, Heartbeat: 100 * time.Millisecond}}}, a, b)
	eu, euURL := startProxy(t, testConfig{Fleet: fleet.Config{Region: "eu", Mesh: &mesh.Config{URL: url, Heartbeat: 100 * time.Millisecond}}}, a, b)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []string
	served := 0
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 15 {
				target := usURL
				if (w+i)%2 == 1 {
					target = euURL
				}
				res := chat(t, target, fmt.Sprintf("worker %d asks question %d about the mesh", w, i), 8)
				mu.Lock()
				if res.Status != 200 || !res.Done {
					failed = append(failed, fmt.Sprintf("%d/%d: %d %s", w, i, res.Status, res.Err))
				}
				served++
				if served == 30 { // mid-run: cut eu's bus
					eu.Bus().Conn().Close()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d failed requests: %v", len(failed), failed)
	}
	if _, applied, _ := us.Bus().Counts(); applied == 0 {
		t.Error("us never mirrored eu's requests")
	}
	if _, applied, _ := eu.Bus().Counts(); applied == 0 {
		t.Error("eu never mirrored us's requests")
	}
	if eu.Bus().Connected() || eu.Bus().Mirrors() != 0 {
		t.Errorf("eu after the cut: connected %v, %d mirrors kept", eu.Bus().Connected(), eu.Bus().Mirrors())
	}
	// us forgets the quiet router's requests (five heartbeats).
	deadline := time.Now().Add(10 * time.Second)
	for us.Bus().Mirrors() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("us still mirrors %d of eu's requests", us.Bus().Mirrors())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A request is shared while it is served, streamed or not (found in
// review: a non-streaming request was announced only with its answer's
// headers, which come with its end).
func TestMeshSharesWhileServing(t *testing.T) {
	url := startBus(t)
	a := startReplica(t, 5*time.Millisecond, emulator.Faults{})
	_, usURL := startProxy(t, testConfig{Fleet: fleet.Config{Region: "us", Mesh: &mesh.Config{URL: url, Heartbeat: 100 * time.Millisecond}}}, a)
	eu, _ := startProxy(t, testConfig{Fleet: fleet.Config{Region: "eu", Mesh: &mesh.Config{URL: url, Heartbeat: 100 * time.Millisecond}}}, a)
	for _, stream := range []bool{true, false} {
		var peak atomic.Int64
		done := make(chan time.Duration)
		go func() {
			start := time.Now()
			resp, err := http.Post(usURL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(strings.Repeat("long prompt words ", 400), 400, stream)))
			if err == nil {
				var buf [4096]byte
				for {
					if _, err := resp.Body.Read(buf[:]); err != nil {
						break
					}
				}
				resp.Body.Close()
			}
			done <- time.Since(start)
		}()
		var took time.Duration
	loop:
		for {
			select {
			case took = <-done:
				break loop
			default:
				if n := int64(eu.Bus().Mirrors()); n > peak.Load() {
					peak.Store(n)
				}
				time.Sleep(time.Millisecond)
			}
		}
		if peak.Load() == 0 {
			t.Errorf("stream=%v: the request (%v) was never mirrored at eu", stream, took)
		}
	}
	// What a router counts of the others' dispatches it has not heard of
	// is a gauge per replica (here both routers' legs to a are alike: ~0).
	if n := testutil.CollectAndCount(eu.reg, "gorgo_replica_unheard_tokens"); n != 1 {
		t.Errorf("%d gorgo_replica_unheard_tokens series, want 1 (replica a)", n)
	}
	// And its calibration of the other's, per origin: us's alone.
	if n := testutil.CollectAndCount(eu.reg, "gorgo_mesh_calibration", "gorgo_mesh_calibration_decisions"); n != 2 {
		t.Errorf("%d gorgo_mesh_calibration series, want 2 (us's ratio and decisions)", n)
	}
}

// A tenant's budget is the mesh's: what it spent at one router counts at
// the others.
func TestMeshSharesBudgets(t *testing.T) {
	url := startBus(t)
	a := startReplica(t, 2*time.Millisecond, emulator.Faults{})
	cfg := func(region string) testConfig {
		return testConfig{Fleet: fleet.Config{Region: region, Mesh: &mesh.Config{URL: url, Heartbeat: 100 * time.Millisecond},
			Tenants: map[string]tenant.Config{"team": {RequestsPerMinute: 2}}}, Proxy: proxy.Config{TenantHeader: "trust"}}
	}
	_, usURL := startProxy(t, cfg("us"), a)
	eu, euURL := startProxy(t, cfg("eu"), a)
	send := func(url string) int {
		req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(chatBody("one of the team's", 2, false)))
		req.Header.Set(tenant.TenantHeader, "team")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := send(usURL); code != 200 {
		t.Fatalf("the team's first request at us: %d", code)
	}
	// us told its charge before its dispatch: once eu mirrors the
	// request it has the charge.
	eventually(t, "eu to hear of us's request", func() bool { _, applied, _ := eu.Bus().Counts(); return applied >= 2 })
	if code := send(euURL); code != 200 {
		t.Fatalf("the team's second request, at eu: %d", code)
	}
	if code := send(euURL); code != 429 {
		t.Errorf("the team's third request in the minute, at eu: %d, want 429", code)
	}
}

// A client's abort through one router reaches the other routers of the
// mesh: the engines it reaches abort their requests too, and each relays
// such an abort rather than fail it over (2026-12-06: eu sent its request,
// aborted by the engine before its first token, to the next replica, and
// charged the first with a failure).
func TestMeshSharesAborts(t *testing.T) {
	url := startBus(t)
	e := newHeldRollout()
	a, b := fakeUpstream(t, e.handler(nil)), fakeUpstream(t, e.handler(nil))
	cfg := func(region string) testConfig {
		return testConfig{Fleet: fleet.Config{Region: region, ProbeInterval: time.Hour, Mesh: &mesh.Config{URL: url, Heartbeat: 100 * time.Millisecond}}}
	}
	_, usURL := startProxy(t, cfg("us"), a, b)
	eu, euURL := startProxy(t, cfg("eu"), a, b)
	t.Cleanup(e.answer) // before the servers close: a failed test does not hang
	type result struct {
		code int
		body string
	}
	done := make(chan result, 1)
	go func() {
		code, body := do(t, "POST", euURL+"/generate", `{"text":"hi","rid":"r1"}`)
		done <- result{code, body}
	}()
	<-e.arrived
	_, before, _ := eu.Bus().Counts()
	if code, body := do(t, "POST", usURL+"/abort_request", `{"abort_all":true}`); code != 200 {
		t.Fatalf("abort at us: %d %s", code, body)
	}
	eventually(t, "eu to hear us's abort", func() bool { _, applied, _ := eu.Bus().Counts(); return applied > before })
	e.answer() // the engine answers the abort
	res := <-done
	if res.code != 200 || !strings.Contains(res.body, `"type":"abort"`) || e.generates.Load() != 1 {
		t.Errorf("eu answered %d %.200s after %d /generate sent, want the abort relayed after 1", res.code, res.body, e.generates.Load())
	}
}

// The engine may answer an abort through another router before the bus
// brings its news: the router waits for it (abort_grace) before it takes
// the engine's abort for the engine's own (review, 2026-12-06: nothing
// ordered the two).
func TestMeshAbortNewsAfterTheEngine(t *testing.T) {
	url := startBus(t)
	e := newHeldRollout()
	// The engine ends its request before its answer to the abort.
	a, b := fakeUpstream(t, e.handler(e.answer)), fakeUpstream(t, e.handler(e.answer))
	cfg := func(region string) testConfig {
		return testConfig{Fleet: fleet.Config{Region: region, ProbeInterval: time.Hour,
			Mesh: &mesh.Config{URL: url, Heartbeat: 100 * time.Millisecond, AbortGrace: mesh.MaxAbortGrace}}}
	}
	_, usURL := startProxy(t, cfg("us"), a, b)
	eu, euURL := startProxy(t, cfg("eu"), a, b)
	t.Cleanup(e.answer)
	if eu.AbortGrace() != mesh.MaxAbortGrace {
		t.Fatalf("abort grace %v", eu.AbortGrace())
	}
	done := make(chan string, 1)
	go func() {
		_, body := do(t, "POST", euURL+"/generate", `{"text":"hi","rid":"r1"}`)
		done <- body
	}()
	<-e.arrived
	if code, body := do(t, "POST", usURL+"/abort_request", `{"rid":"r1"}`); code != 200 {
		t.Fatalf("abort at us: %d %s", code, body)
	}
	if body := <-done; !strings.Contains(body, `"type":"abort"`) || e.generates.Load() != 1 {
		t.Errorf("eu answered %.200s after %d /generate sent, want the abort relayed after 1", body, e.generates.Load())
	}
}

// startBus runs a NATS server for a test's mesh and returns its URL.
func startBus(t *testing.T) string {
	t.Helper()
	url, stop, err := mesh.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return url
}

// heldRollout is an SGLang engine whose /generate waits in its queue until
// answer, then answers as SGLang answers a request aborted there.
type heldRollout struct {
	generates atomic.Int64
	arrived   chan struct{} // one per /generate received
	release   chan struct{}
	once      sync.Once
}

func newHeldRollout() *heldRollout {
	return &heldRollout{arrived: make(chan struct{}, 4), release: make(chan struct{})}
}

// answer lets the held requests end (at most once).
func (e *heldRollout) answer() { e.once.Do(func() { close(e.release) }) }

// handler serves the engine; onAbort, if set, is called for its
// /abort_request.
func (e *heldRollout) handler(onAbort func()) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/abort_request":
			if onAbort != nil {
				onAbort()
			}
		case "/generate":
			e.generates.Add(1)
			e.arrived <- struct{}{}
			<-e.release
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"text":"","meta_info":{"id":"r1","finish_reason":{"type":"abort","message":"Abort in waiting queue"},"prompt_tokens":3,"completion_tokens":0,"cached_tokens":0}}`)
		}
	}
}
