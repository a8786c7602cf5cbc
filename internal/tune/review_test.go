package tune

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// The defects a review of the tuner proved (2026-12-06), each a test that
// failed before its fix.

// Early stop drops a candidate whose requests fail: its objective cannot
// say so (a failed request has no TTFT; all failed, it has none), so one
// failing every request routed half the traffic for its whole window.
// A few failures, as many as the incumbent's, are chance, not a verdict.
func TestEarlyStopDropsACandidateWhoseRequestsFail(t *testing.T) {
	for _, c := range []struct {
		name      string
		fails     func(i int) bool // the candidate's i-th request fails
		incFails  func(i int) bool
		wantEarly bool
	}{
		{"every request", func(int) bool { return true }, func(int) bool { return false }, true},
		{"one in five", func(i int) bool { return i%5 == 0 }, func(int) bool { return false }, true},
		{"one in forty, as the incumbent", func(i int) bool { return i%40 == 7 }, func(i int) bool { return i%40 == 3 }, false},
	} {
		o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1}, Base: policy.DefaultName, Window: 200, Hop: 1, EarlyStop: 1.5})
		if err != nil {
			t.Fatal(err)
		}
		reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
		rng := rand.New(rand.NewPCG(1, 1))
		var d policy.Decision
		for i := range 160 { // 80 an arm: past a quarter of the window
			if err := o.Decide(&d, &policy.Request{PromptTokens: 10}, reps, rng); err != nil {
				t.Fatal(err)
			}
			fail := c.incFails
			if d.Tag%2 == 1 {
				fail = c.fails
			}
			out := policy.Outcome{TTFT: 2 * time.Second, E2E: 5 * time.Second}
			if fail(i / 2) {
				out = policy.Outcome{Failed: true}
			}
			o.Learn(d.Tag, out)
		}
		steps := o.Steps()
		early := len(steps) == 1 && strings.Contains(steps[0].Reason, "requests failed")
		if early != c.wantEarly {
			t.Errorf("%s: verdicts %+v; want dropped early on its failures %v", c.name, steps, c.wantEarly)
		}
	}
}

// A guard with no measure on either side is no evidence: a candidate was
// rejected (+Inf) because the incumbent's window had no ITL.
func TestGuardWithoutTheIncumbentsMeasure(t *testing.T) {
	g, err := ParseGuard("itl-mean=1.1")
	if err != nil {
		t.Fatal(err)
	}
	es := newES(t, Config{Seed: 4, Guards: []Guard{g}})
	out := es.Verdict(es.Propose(), Metrics{N: 100, TTFTP95: 700, ITLMean: 20}, Metrics{N: 100, TTFTP95: 1000})
	if !out.Accepted {
		t.Errorf("a 30%% TTFT win rejected because the incumbent's window measured no ITL: %+v", out)
	}
}

// A window too large to keep is refused (twice it wrapped negative, and
// the first outcome panicked on a negative slice bound), and a negative
// router time in block mode routes (it indexed arms[-1]).
func TestOnlineBounds(t *testing.T) {
	if _, err := NewOnline(OnlineConfig{ES: Config{Seed: 1}, Base: policy.DefaultName, Window: 1 << 62}); err == nil {
		t.Error("a window of 2^62 requests accepted")
	}
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1}, Base: policy.DefaultName, Window: 2, Block: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var d policy.Decision
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	if err := o.Decide(&d, &policy.Request{PromptTokens: 10, Now: -15 * time.Second}, reps, rand.New(rand.NewPCG(1, 1))); err != nil || d.Tag != -1 {
		t.Errorf("a decision at -15 s: tag %d, %v; want routed, unscored", d.Tag, err)
	}
}

// StartFrom starts the tuned parameters at the operator's values: one out
// of bounds gets the bounds' room around it, a 0 is not tuned, and with
// none left it fails.
func TestStartFrom(t *testing.T) {
	c := Config{Params: []Param{{Name: "decode", Min: 0.02, Max: 2, Init: 0.2}, {Name: "itl", Min: 0.02, Max: 2, Init: 0.2}}}
	if err := c.StartFrom("gorgo-e2e", policy.Values{"decode": 50, "itl": 0}); err != nil {
		t.Fatal(err)
	}
	if len(c.Params) != 1 || c.Params[0] != (Param{Name: "decode", Min: 0.02, Max: 500, Init: 50}) {
		t.Errorf("%+v", c.Params)
	}
	c = Config{Params: []Param{{Name: "itl", Min: 0.02, Max: 2, Init: 0.2}}}
	if err := c.StartFrom("gorgo-e2e", policy.Values{"itl": 0}); err == nil {
		t.Error("nothing left to tune, accepted")
	}
}

// A running tuner told the operator's weights (the admin API's PUT)
// starts from them as if started with them: its incumbent routes with
// them, the parameters not given keep the incumbent's, the round starts
// afresh, and a change of the fleet falls back to them, not to the
// weights it began with. Values the base refuses change nothing.
func TestOnlineStartFrom(t *testing.T) {
	o, err := NewOnline(OnlineConfig{Base: policy.DefaultName, ES: Config{Seed: 1}})
	if err != nil {
		t.Fatal(err)
	}
	o.es.inc[1] = 0.3 // learned: itl 0.3
	round := o.round
	if err := o.StartFrom(policy.Values{"decode": 5, "queue": 2}); err != nil {
		t.Fatal(err)
	}
	want := func(when string, decode, itl, queue float64) {
		t.Helper()
		v := o.Incumbent()
		if v["decode"] != decode || v["itl"] != itl || v["queue"] != queue {
			t.Errorf("%s: decode %v, itl %v, queue %v; want %v, %v, %v", when, v["decode"], v["itl"], v["queue"], decode, itl, queue)
		}
	}
	want("set", 5, 0.3, 2)
	if o.round == round || o.Sigma() != o.es.Config().Sigma {
		t.Errorf("round %d (was %d), step %v: want a fresh round at the first step size", o.round, round, o.Sigma())
	}
	if p := o.es.Config().Params[0]; p.Name != "decode" || p.Max < 5 {
		t.Errorf("decode's bounds %+v do not hold 5", p)
	}
	o.es.inc[0], o.moved = 1, true // learned since
	o.FleetChanged(policy.FleetChange{Why: "a replica joined"})
	want("after a change of the fleet", 5, 0.3, 2)
	if err := o.StartFrom(policy.Values{"queue": -1}); err == nil {
		t.Error("a negative queue weight was taken")
	}
	want("after a refused change", 5, 0.3, 2)
}

// StartFrom under way while an operator reads the tuner (GET /admin/tuner
// racing a PUT of weights or a reload): its readers take the lock
// (2026-12-07, a review: Objective, Named and Config read what StartFrom
// replaces; run with -race).
func TestStartFromRacesNoReader(t *testing.T) {
	o, err := NewOnline(OnlineConfig{Base: policy.DefaultName, ES: Config{Seed: 1}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 50 {
			_ = o.StartFrom(policy.Values{"queue": float64(1 + i%3)})
		}
	})
	wg.Go(func() {
		for range 50 {
			_ = o.Objective()
			_ = o.Config()
			_ = o.ES()
		}
	})
	wg.Wait()
}

// A verdict keeps its candidate's values by name as they were judged: a
// StartFrom that stops tuning a parameter (a 0) does not relabel them;
// and a parameter once given 0 is tuned again when given a positive value
// (Online.tunable), as a tuner started with it would be (2026-12-07,
// a review: the values took the next parameter's name, and a zeroed
// parameter stayed untuned for good).
func TestStartFromKeepsVerdictsAndTunables(t *testing.T) {
	o, err := NewOnline(OnlineConfig{Base: policy.DefaultName, ES: Config{Seed: 1}})
	if err != nil {
		t.Fatal(err)
	}
	params := o.es.Config().Params
	if len(params) != 2 {
		t.Fatalf("tuned %v, want the default policy's two", params)
	}
	o.mu.Lock()
	o.verdict(Outcome{Candidate: Point{1, 2}, Reason: "worse"})
	o.mu.Unlock()
	first := params[0].Name
	if err := o.StartFrom(policy.Values{first: 0}); err != nil {
		t.Fatal(err)
	}
	if v := o.Steps()[0].Values; v[first] != 1 || v[params[1].Name] != 2 {
		t.Errorf("the verdict after a StartFrom: %v, want %s 1 and %s 2", v, first, params[1].Name)
	}
	if n := len(o.es.Config().Params); n != 1 {
		t.Errorf("%d parameters tuned with %s 0, want 1", n, first)
	}
	if err := o.StartFrom(policy.Values{first: 0.5}); err != nil {
		t.Fatal(err)
	}
	if got := o.es.Config().Params; len(got) != 2 || got[0].Name != first || got[0].Init != 0.5 {
		t.Errorf("tuned after %s 0.5: %+v, want both again, %s from 0.5", first, got, first)
	}
}
