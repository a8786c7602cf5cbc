package fleet_test

import (
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/mesh"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// A trainer pauses the fleet's engines through one router of a mesh: the
// other router's requests held by the paused engine are not cut, nor the
// replica ejected there (review, 2026-12-06: a pause was known only to
// the router it went through).
func TestPauseThroughAnotherMeshRouterIsNoStall(t *testing.T) {
	bus := startBus(t)
	// Two replicas of one engine's pause: a request held at either has
	// the other to go to, were its replica ejected.
	pausable := servetest.NewPausable()
	a, b := fakeUpstream(t, pausable.Handler(0)), fakeUpstream(t, pausable.Handler(0))
	cfg := func(region string) testConfig {
		return testConfig{Fleet: fleet.Config{Region: region, ProbeInterval: 50 * time.Millisecond, ScrapeInterval: 50 * time.Millisecond, StallTimeout: 600 * time.Millisecond,
			Mesh: &mesh.Config{URL: bus, Heartbeat: 100 * time.Millisecond}}}
	}
	_, usURL := startProxy(t, cfg("us"), a, b)
	eu, euURL := startProxy(t, cfg("eu"), a, b)
	eventually(t, "probed", func() bool { return stateOr(eu, "a").Available() && stateOr(eu, "b").Available() })
	if code, body := do(t, "POST", usURL+"/pause", `{"mode":"keep"}`); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
	done := make(chan int, 1)
	go func() {
		code, _ := do(t, "POST", euURL+"/v1/chat/completions", chatBody("x", 1, true), "Content-Type", "application/json")
		done <- code
	}()
	time.Sleep(time.Second) // the trainer's weight update
	if code, body := do(t, "POST", usURL+"/resume", ``); code != 200 {
		t.Fatalf("resume: %d %s", code, body)
	}
	if code := <-done; code != 200 {
		t.Errorf("the request through the other router: %d", code)
	}
	if !stateOr(eu, "a").Healthy || !stateOr(eu, "b").Healthy {
		t.Error("the other router ejected a paused replica")
	}
}
