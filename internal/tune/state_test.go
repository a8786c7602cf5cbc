package tune

import (
	"encoding/json"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// newGuarded is the default policy's online tuner, as gorgo serve's
// (guarded on p95 E2E), from the given weights.
func newGuarded(t *testing.T, weights policy.Values) *Online {
	t.Helper()
	o, err := NewOnline(OnlineConfig{Base: policy.DefaultName, BaseParams: weights, StartFromBase: weights != nil,
		ES: Config{Seed: 1, Guards: []Guard{{Metric: "e2e-p95", MaxRatio: 1.05}}}})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// A tuner's state resumes in a tuner with the same start: its incumbent
// routes, its step size and its guard's drift are what they were, and a
// fleet change still falls back to the start.
func TestStateRestores(t *testing.T) {
	a := newGuarded(t, nil)
	start := a.Incumbent()
	a.mu.Lock()
	for i := range a.es.inc {
		a.es.inc[i] *= 1.5 // as if it had learned
	}
	a.es.sigma, a.es.drift[0] = 0.12, 1.03
	a.mu.Unlock()
	st := a.State()
	if !st.Moved() || st.Sigma != 0.12 || st.Drift["e2e-p95"] != 1.03 || st.Policy != policy.DefaultName {
		t.Fatalf("state %+v", st)
	}
	// As written to a file and read back.
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var read State
	if err := json.Unmarshal(data, &read); err != nil || !read.Equal(st) {
		t.Fatalf("read back %+v (%v), want %+v", read, err, st)
	}

	b := newGuarded(t, nil)
	read.Fleet = []string{"a", "b"}
	if err := b.Restore(read); err != nil {
		t.Fatal(err)
	}
	if got, want := b.Incumbent(), a.Incumbent(); !maps.Equal(got, want) {
		t.Errorf("restored incumbent %v, want %v", got, want)
	}
	if got := b.State(); !got.Equal(read) {
		t.Errorf("restored state %+v, want %+v (its fleet the replicas it knows)", got, read)
	}
	// An operator who configured another first step size means it.
	c, err := NewOnline(OnlineConfig{Base: policy.DefaultName, ES: Config{Seed: 1, Sigma: 0.1, Guards: []Guard{{Metric: "e2e-p95", MaxRatio: 1.05}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Restore(read); err != nil || c.Sigma() != 0.1 {
		t.Errorf("restored with --sigma 0.1: step %v (%v), want 0.1", c.Sigma(), err)
	}
	if b.Round().Candidate == nil {
		t.Error("no candidate drawn after the restore")
	}
	// One of the state's replicas joining late (its engine slower to come
	// up than the router) is no change of the fleet it was learned on (a
	// user's test: it threw the resumed state away); another is.
	b.FleetChanged(policy.FleetChange{Why: "replica a added", Joined: "a"})
	if got := b.Incumbent(); !maps.Equal(got, a.Incumbent()) {
		t.Errorf("after one of its replicas joined, the incumbent is %v, want the resumed %v", got, a.Incumbent())
	}
	b.FleetChanged(policy.FleetChange{Why: "replica c added", Joined: "c"})
	if got := b.Incumbent(); !maps.Equal(got, start) {
		t.Errorf("after a fleet change the incumbent is %v, want the start %v", got, start)
	}
	if n, _ := b.Resets(); n != 1 {
		t.Errorf("%d fallbacks counted, want 1", n)
	}
	// After that change what it learns is of another fleet: a replica the
	// resumed state knew joining now is news (a review: it kept weights
	// learned without it), and the state names no replica it knows.
	if got := b.State().Fleet; len(got) != 0 {
		t.Errorf("after a fallback the state's fleet is %v, want none known", got)
	}
	b.mu.Lock()
	b.es.inc[0] *= 1.3 // it learns
	b.moved = true
	b.mu.Unlock()
	b.FleetChanged(policy.FleetChange{Why: "replica b added", Joined: "b"})
	if n, _ := b.Resets(); n != 2 {
		t.Errorf("a replica the state knew joining after a fallback: %d fallbacks, want 2", n)
	}
	// So after a StartFrom.
	d := newGuarded(t, nil)
	if err := d.Restore(read); err != nil {
		t.Fatal(err)
	}
	if err := d.StartFrom(policy.Values{"decode": 0.5}); err != nil {
		t.Fatal(err)
	}
	if got := d.State().Fleet; len(got) != 0 {
		t.Errorf("after StartFrom the state's fleet is %v, want none known", got)
	}
	// A state written before first_sigma was: its step is taken.
	legacy := read
	legacy.FirstSigma = 0
	e := newGuarded(t, nil)
	if err := e.Restore(legacy); err != nil || e.Sigma() != read.Sigma {
		t.Errorf("a state without first_sigma: step %v (%v), want %v", e.Sigma(), err, read.Sigma)
	}
}

// A state is not resumed, and nothing changes, where it is not this
// tuner's to resume: another policy's, another start's (the operator's
// weights changed since), values out of bounds, a guard's drift missing.
func TestStateRefused(t *testing.T) {
	a := newGuarded(t, nil)
	good := a.State()
	edit := func(f func(*State)) State {
		s := good
		s.Start, s.Incumbent, s.Drift = maps.Clone(good.Start), maps.Clone(good.Incumbent), maps.Clone(good.Drift)
		f(&s)
		return s
	}
	name := a.ES().Config().Params[0].Name
	cases := []struct {
		state State
		want  string
	}{
		{edit(func(s *State) { s.Policy = "gorgo" }), "tuner's of gorgo"},
		{edit(func(s *State) { s.Start[name] *= 2 }), "started from"},
		{edit(func(s *State) { delete(s.Start, name) }), "started from"},
		{edit(func(s *State) { s.Incumbent[name] = 1e9 }), "outside"},
		{edit(func(s *State) { delete(s.Incumbent, name) }), "outside"},
		{edit(func(s *State) { s.Incumbent["gain"] = 1 }), "does not tune"},
		{edit(func(s *State) { s.Incumbent["rtt"] *= 2 }), "moved rtt, which this tuner does not tune"},
		{edit(func(s *State) { delete(s.Incumbent, "rtt") }), "lacks"},
		{edit(func(s *State) { s.Start["rtt"] *= 2 }), "started from"},
		{edit(func(s *State) { s.Objective = "p95-e2e" }), "learned for"},
		{edit(func(s *State) { s.Drift = nil }), "drift"},
		{edit(func(s *State) { s.Drift["e2e-p95"] = -1 }), "drift"},
		{edit(func(s *State) { s.Sigma = 0 }), "step size"},
	}
	for _, c := range cases {
		b := newGuarded(t, nil)
		before := b.State()
		err := b.Restore(c.state)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.state, err, c.want)
		}
		if !b.State().Equal(before) {
			t.Errorf("%+v: refused, yet the tuner changed", c.state)
		}
	}
	// Started from other weights, tuned or not: the state of the config's
	// old weights is not this tuner's (a review: a change of rtt, which
	// it does not tune, resumed it, where a reload of it restarts it).
	for _, w := range []policy.Values{{name: good.Start[name] * 2}, {"rtt": good.Start["rtt"] * 2}} {
		if err := newGuarded(t, w).Restore(good); err == nil {
			t.Errorf("a tuner started from %v resumed the old start's state", w)
		}
	}
}

// A tuner an operator paused stays paused across a restart: its state
// says so, a tuner restored from it routes every request with the
// incumbent, untagged, until resumed; a state not paused resumes tuning.
func TestPauseSurvivesARestore(t *testing.T) {
	a := newGuarded(t, nil)
	a.Pause()
	st := a.State()
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var read State
	if err := json.Unmarshal(data, &read); err != nil || !read.Paused || !read.Equal(st) {
		t.Fatalf("a paused tuner's state read back: %+v (%v)", read, err)
	}
	b := newGuarded(t, nil)
	if err := b.Restore(read); err != nil {
		t.Fatal(err)
	}
	if !b.Paused() {
		t.Fatal("a tuner restored from a paused state tunes")
	}
	var d policy.Decision
	if err := b.Decide(&d, &policy.Request{}, []policy.Replica{{ID: "r"}}, rand.New(rand.NewPCG(1, 1))); err != nil || d.Tag != -1 {
		t.Errorf("restored paused, a decision is tagged %d (%v), want -1", d.Tag, err)
	}
	if err := b.Resume(); err != nil || b.Paused() || b.State().Paused {
		t.Errorf("resumed: paused %v, its state paused %v (%v)", b.Paused(), b.State().Paused, err)
	}
	read.Paused = false
	c := newGuarded(t, nil)
	c.Pause()
	if err := c.Restore(read); err != nil || c.Paused() {
		t.Errorf("restored from a state not paused: paused %v (%v)", c.Paused(), err)
	}
}
