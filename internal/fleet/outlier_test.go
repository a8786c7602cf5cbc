package fleet

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/router"
)

// available counts the replicas decisions may choose.
func available(f *Fleet) int {
	n := 0
	for _, st := range f.Router().Replicas() {
		if st.Available() {
			n++
		}
	}
	return n
}

// upFleet is a test fleet of replicas up (probed) from the config.
func upFleet(t *testing.T, cfg Config, ids ...string) *Fleet {
	t.Helper()
	cfg.Policy, cfg.ProbeInterval, cfg.ScrapeInterval = "round-robin", time.Hour, time.Hour
	f, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var reps []ReplicaConfig
	for _, id := range ids {
		reps = append(reps, rc(id, "http://"+id+":1", "us"))
	}
	want(t, f, SourceConfig, reps...)
	for _, id := range ids {
		f.Router().ObserveRTT(id, time.Millisecond)
		f.probed(f.Upstream(id))
	}
	if n := available(f); n != len(ids) {
		t.Fatalf("%d of %d replicas available", n, len(ids))
	}
	return f
}

// A wave of failed requests over the whole fleet (a poison request tried
// on every replica, a fleet-wide overload) ejects at most
// max_ejection_percent of it (default 50%, at least one): the rest stay,
// and healthy probes keep them up. Failing probes eject whatever the
// share.
func TestEjectionsByRequestsAreCapped(t *testing.T) {
	for _, c := range []struct {
		percent, replicas, ejected int
	}{
		{0, 3, 1}, // the default, 50%: 1.5 rounded down
		{0, 2, 1},
		{0, 4, 2},
		{0, 1, 1}, // at least one
		{10, 3, 1},
		{100, 3, 3},
	} {
		ids := []string{"a", "b", "c", "d"}[:c.replicas]
		f := upFleet(t, Config{MaxEjectionPercent: c.percent}, ids...)
		for range 3 {
			for _, id := range ids { // each request tried on every replica
				f.Failure(id)
			}
		}
		for _, id := range ids {
			f.probed(f.Upstream(id)) // /health answers 200
		}
		if got := c.replicas - available(f); got != c.ejected {
			t.Errorf("max_ejection_percent %d, %d replicas: %d ejected, want %d", c.percent, c.replicas, got, c.ejected)
		}
	}

	// Probes failing eject a replica whatever the share.
	f := upFleet(t, Config{}, "a", "b", "c")
	for range 3 {
		for _, id := range []string{"a", "b", "c"} {
			f.probeFailed(id)
		}
	}
	if n := available(f); n != 0 {
		t.Errorf("%d replicas available after their probes failed, want none", n)
	}

	// A replica down by its probes counts in the share: requests then
	// eject no other.
	f = upFleet(t, Config{}, "a", "b", "c")
	for range 3 {
		f.probeFailed("a")
	}
	for range 3 {
		f.Failure("b")
		f.Failure("c")
	}
	if st, _ := f.Router().Replica("a"); st.Available() {
		t.Error("a, its probes failing, is available")
	}
	if n := available(f); n != 2 {
		t.Errorf("%d replicas available, want b and c", n)
	}

	// A replica whose ejection is over but that no probe has brought back
	// yet is still out: it counts in the share (found in review: only the
	// ejection's window counted, so more than the share could be out for
	// up to a probe interval).
	f = upFleet(t, Config{EjectionTime: time.Nanosecond, MaxEjectionTime: time.Nanosecond}, "a", "b", "c")
	for range 3 {
		f.Failure("a")
	}
	time.Sleep(time.Millisecond) // a's window is over; no probe since
	for range 3 {
		f.Failure("b")
	}
	if n := available(f); n != 2 {
		t.Errorf("%d replicas available with a not yet back, want 2 (b not ejected)", n)
	}
	f.probed(f.Upstream("a"))
	for range 3 {
		f.Failure("b")
	}
	if n := available(f); n != 2 {
		t.Errorf("%d replicas available once a is back and b failed, want 2 (a and c)", n)
	}
}

// An operator removes admin replica x while it is busy (it is leaving),
// then undrains it: x is the admin API's again, and a later Add of another
// replica leaves it alone.
func TestUndrainedAdminReplicaStays(t *testing.T) {
	f := newTestFleet(t)
	if err := f.Add(SourceAdmin, rc("x", "http://x:1", "us")); err != nil {
		t.Fatal(err)
	}
	tk := dispatchTo(t, f, "x") // in flight: x leaves only once it ends
	if err := f.Remove("x"); err != nil {
		t.Fatal(err)
	}
	if err := f.Undrain("x"); err != nil {
		t.Fatal(err)
	}
	if err := f.Add(SourceAdmin, rc("y", "http://y:1", "us")); err != nil {
		t.Fatal(err)
	}
	f.Router().Finish(&tk)
	for _, id := range []string{"x", "y"} {
		if st, err := f.Router().Replica(id); err != nil || st.State != router.Active {
			t.Errorf("%s: %v (%v), want active", id, st.State, err)
		}
	}
	// Still the admin API's to remove.
	if err := f.Remove("x"); err != nil {
		t.Fatal(err)
	}
	if got := ids(f); !slices.Equal(got, []string{"y"}) {
		t.Errorf("replicas %v, want y", got)
	}
}

// A replica of a source that is gone (a DNS group taken out of the
// config), undrained while it was leaving, becomes the admin API's.
func TestUndrainedReplicaOfAGoneSourceIsTheAdminsAPIs(t *testing.T) {
	f := newTestFleet(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() { cancel(); <-done }()
	src := &fakeSource{name: SourceDNS + "engines", sets: make(chan []ReplicaConfig)}
	f.setSources([]Source{src})
	src.sets <- []ReplicaConfig{rc("x", "http://127.0.0.1:1", "us")}
	deadline := time.Now().Add(20 * time.Second)
	for !slices.Equal(ids(f), []string{"x"}) {
		if time.Now().After(deadline) {
			t.Fatal("gave up waiting for the source's replica")
		}
		time.Sleep(5 * time.Millisecond)
	}
	tk := dispatchTo(t, f, "x")
	f.setSources(nil) // x leaves with its source, once its request ends
	if st, _ := f.Router().Replica("x"); st.State != router.Removing {
		t.Fatalf("x %v, want removing", st.State)
	}
	if err := f.Undrain("x"); err != nil {
		t.Fatal(err)
	}
	f.Router().Finish(&tk)
	if u := f.Upstream("x"); u == nil || u.Source() != SourceAdmin {
		src := "none"
		if u != nil {
			src = u.Source()
		}
		t.Fatalf("x's source %s, want %s", src, SourceAdmin)
	}
	if err := f.Add(SourceAdmin, rc("y", "http://127.0.0.1:2", "us")); err != nil {
		t.Fatal(err)
	}
	if st, err := f.Router().Replica("x"); err != nil || st.State != router.Active {
		t.Errorf("x: %v (%v), want active", st.State, err)
	}
}

// A reload naming a replica whose api_key_env is unset is refused whole,
// as a start with it is: nothing of it applies.
func TestReloadWithAnUnsetAPIKeyIsRefused(t *testing.T) {
	const env = "GORGO_TEST_UNSET_API_KEY"
	t.Setenv(env, "")
	f := newTestFleet(t)
	want(t, f, SourceConfig, rc("a", "http://a:1", "us"))
	next := f.Config()
	bad := rc("z", "http://z:1", "us")
	bad.APIKeyEnv = env
	next.Replicas = []ReplicaConfig{rc("b", "http://b:1", "us"), bad}
	next.FailureThreshold = 7
	if _, _, err := f.Prepare(next); err == nil || !strings.Contains(err.Error(), env) {
		t.Fatalf("Prepare: %v, want the unset variable named", err)
	}
	if got := ids(f); !slices.Equal(got, []string{"a"}) || f.Config().FailureThreshold != 3 {
		t.Errorf("after the refused reload: replicas %v, failure_threshold %d", got, f.Config().FailureThreshold)
	}
	if _, err := New(next, Options{}); err == nil {
		t.Error("New accepts it")
	}
	t.Setenv(env, "sk-test")
	applyReload(t, f, next)
	if u := f.Upstream("z"); u == nil || u.APIKey() != "sk-test" {
		t.Errorf("z %v, want its key", u)
	}
}

// A reload whose settings that need a restart could not start (an unknown
// policy, max_attempts below 1, a negative ttft_slo) is refused, as the
// start would refuse the file (2026-12-06, a user's test: each was taken,
// its value kept for the restart, and the restart then failed).
func TestReloadRefusesWhatARestartWould(t *testing.T) {
	f := newTestFleet(t)
	for _, c := range []struct {
		name string
		edit func(*Config)
	}{
		{"policy nope", func(c *Config) { c.Policy = "nope" }},
		{"max_attempts -4", func(c *Config) { c.MaxAttempts = -4 }},
		{"ttft_slo -5s", func(c *Config) { c.TTFTSLO = -5 * time.Second }},
	} {
		next := f.Config()
		c.edit(&next)
		if _, err := New(next, Options{}); err == nil {
			t.Fatalf("%s: New accepts it", c.name)
		}
		if _, restart, err := f.Prepare(next); err == nil {
			t.Errorf("%s: the reload was taken (restart %q), the start would refuse the file", c.name, restart)
		}
	}
	// A restart-only setting changed to a valid value is taken for the
	// restart, as before.
	next := f.Config()
	next.MaxAttempts = 5
	if _, restart, err := f.Prepare(next); err != nil || len(restart) != 1 || !strings.Contains(restart[0], "max_attempts") {
		t.Errorf("max_attempts 5: restart %q, %v", restart, err)
	}
}
