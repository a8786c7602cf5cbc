package sim

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/report"
)

// Scripted fleet events: a drained replica takes nothing while drained and
// takes traffic again after; an added replica takes traffic once its first
// probe is back; a removed one takes nothing after its removal; every
// request is served.
func TestFleetEvents(t *testing.T) {
	p := profile(t, "paper")
	reps := []Replica{{ID: "a", RTT: 20 * time.Millisecond, Profile: p}, {ID: "b", RTT: 40 * time.Millisecond, Profile: p}}
	reqs := poisson(3000, 5, 1) // about 10 minutes
	events := []FleetEvent{
		{At: 2 * time.Minute, Op: OpDrain, ID: "a"},
		{At: 4 * time.Minute, Op: OpUndrain, ID: "a"},
		{At: 5 * time.Minute, Op: OpAdd, Replica: Replica{ID: "c", RTT: 60 * time.Millisecond, Profile: p}},
		{At: 7 * time.Minute, Op: OpRemove, ID: "b"},
	}
	res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "round-robin"), MaxInflight: 64, Seed: 1, Events: events})
	if err != nil {
		t.Fatal(err)
	}
	// Requests are dispatched at arrival + slip.
	sent := func(r report.Record) time.Duration {
		return time.Duration((r.Arrival + r.Slip) * float64(time.Millisecond))
	}
	count := map[string][3]int{} // before, during, after the event's window
	for _, r := range res.Records {
		if r.Failed {
			t.Fatalf("request %d failed: %s", r.Index, r.Error)
		}
		at := sent(r)
		c := count[r.Replica]
		switch {
		case r.Replica == "a" && at >= 2*time.Minute && at < 4*time.Minute:
			t.Errorf("request %d sent to a at %v, while it was drained", r.Index, at)
		case r.Replica == "b" && at >= 7*time.Minute:
			t.Errorf("request %d sent to b at %v, after its removal", r.Index, at)
		case r.Replica == "c" && at < 5*time.Minute+60*time.Millisecond:
			t.Errorf("request %d sent to c at %v, before it was added and probed", r.Index, at)
		}
		switch {
		case at < 2*time.Minute:
			c[0]++
		case at < 7*time.Minute:
			c[1]++
		default:
			c[2]++
		}
		count[r.Replica] = c
	}
	if count["a"][1] == 0 || count["a"][2] == 0 || count["c"][1] == 0 || count["c"][2] == 0 {
		t.Errorf("traffic by replica (before, middle, after): %v", count)
	}
	if len(res.Engines) != 3 || len(res.Run.ReplicaShare) != 3 {
		t.Errorf("%d engines, shares %v", len(res.Engines), res.Run.ReplicaShare)
	}
}

func TestEventSpecs(t *testing.T) {
	topo, _ := LoadTopology("paper")
	cases := []struct {
		in, err string
	}{
		{"10m drain ap-seoul", ""},
		{"10m add us-2 region=us-ashburn profile=paper speed=2", ""},
		{"10m drain", "too few words"},
		{"later drain ap-seoul", "duration"},
		{"10m pause ap-seoul", "unknown operation"},
		{"10m add x profile=paper", "region="},
		{"10m add x region=mars", "unknown region"},
		{"10m drain nobody", "no such replica"},
		{"10m remove ap-seoul", ""},
	}
	for _, c := range cases {
		spec, err := ParseEventSpec(c.in)
		if err == nil {
			_, err = topo.ResolveEvents([]EventSpec{spec})
		}
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%q: %v", c.in, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: error %v, want one containing %q", c.in, err, c.err)
		}
	}
	// In time order: a removed replica cannot be drained after.
	a, _ := ParseEventSpec("1m remove ap-seoul")
	b, _ := ParseEventSpec("2m drain ap-seoul")
	if _, err := topo.ResolveEvents([]EventSpec{b, a}); err == nil {
		t.Error("a drain after the removal accepted")
	}
	two := 2
	evs, err := topo.ResolveEvents([]EventSpec{{At: time.Minute, Add: &ReplicaSpec{Name: "x", Region: "eu-frankfurt", Profile: "paper", Count: &two}}})
	if err != nil || len(evs) != 2 || evs[1].Replica.ID != "x-2" || evs[0].Replica.RTT != 279*time.Millisecond {
		t.Errorf("add of two: %+v %v", evs, err)
	}
}

// watcher is a policy that records the fleet changes its router reports.
type watcher struct {
	policy.Policy
	changes []string
}

func (w *watcher) FleetChanged(c policy.FleetChange) { w.changes = append(w.changes, c.Why) }

// ScoreFrom leaves the requests that arrive before it out of the summary
// (they are routed and recorded all the same), and a policy that learns
// from the fleet hears of its changes from the simulated router as it
// would live.
func TestScoreFromAndFleetChanges(t *testing.T) {
	p := profile(t, "paper")
	reps := []Replica{{ID: "a", RTT: 20 * time.Millisecond, Profile: p}, {ID: "b", RTT: 40 * time.Millisecond, Profile: p}}
	reqs := poisson(2000, 5, 1)
	w := &watcher{Policy: newPolicy(t, policy.DefaultName)}
	events := []FleetEvent{{At: 3 * time.Minute, Op: OpRemove, ID: "b"}}
	res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: w, MaxInflight: 64, Seed: 1, Events: events, ScoreFrom: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	later := 0
	for _, r := range res.Records {
		if r.Arrival >= 60_000 {
			later++
		}
		if r.WarmUp != (r.Arrival < 60_000) { // the records say which were scored
			t.Fatalf("record %+v: warm_up %v", r, r.WarmUp)
		}
	}
	if len(res.Records) != len(reqs) || res.Run.Requests != later || later == 0 || later == len(reqs) {
		t.Errorf("%d records, %d scored; want %d and the %d that arrived from 1 minute", len(res.Records), res.Run.Requests, len(reqs), later)
	}
	// The initial replicas join before the first decision: no news.
	want := []string{"replica b left"}
	if !slices.Equal(w.changes, want) {
		t.Errorf("changes %q, want %q", w.changes, want)
	}
}
