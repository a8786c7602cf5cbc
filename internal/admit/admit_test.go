package admit

import (
	"math"
	"slices"
	"testing"
	"time"
)

const ms = time.Millisecond

func gate(t *testing.T, c Config) *Gate[int] {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return New[int](c)
}

// arrive is a request of the default class.
func arrive(g *Gate[int], v int, now time.Duration, p Prediction) Verdict {
	verdict, _ := g.Arrive(v, Class{}, now, p, func(int, Reason) {})
	return verdict
}

func TestArrive(t *testing.T) {
	g := gate(t, Config{SLO: 1000 * ms, MaxQueue: 2})
	if v := arrive(g, 1, 0, Prediction{Best: 900 * ms, Floor: 100 * ms}); v != Go {
		t.Errorf("within the SLO: %v", v)
	}
	if v := arrive(g, 2, 0, Prediction{Best: 3000 * ms, Floor: 100 * ms}); v != Hold {
		t.Errorf("over the SLO: %v", v)
	}
	if v := arrive(g, 3, 0, Prediction{Best: 3000 * ms, Floor: 1200 * ms}); v != Reject {
		t.Errorf("cannot make it even on an idle replica: %v", v)
	}
	arrive(g, 4, 0, Prediction{Best: 3000 * ms, Floor: 100 * ms})
	if v := arrive(g, 5, 0, Prediction{Best: 3000 * ms, Floor: 100 * ms}); v != Reject || g.Len() != 2 {
		t.Errorf("queue full: %v, %d waiting", v, g.Len())
	}
	// A request that could make it does not jump the queue of its band:
	// it waits for the Release that follows.
	g = gate(t, Config{SLO: 1000 * ms})
	arrive(g, 1, 0, Prediction{Best: 3000 * ms, Floor: 100 * ms})
	if v := arrive(g, 2, 0, Prediction{Best: 10 * ms, Floor: 10 * ms}); v != Hold {
		t.Errorf("can make it with others waiting: %v", v)
	}
	r := gate(t, Config{SLO: 1000 * ms, Mode: ModeReject})
	if v := arrive(r, 1, 0, Prediction{Best: 3000 * ms, Floor: 100 * ms}); v != Reject || r.Len() != 0 {
		t.Errorf("reject mode: %v", v)
	}
	off := gate(t, Config{})
	if v := arrive(off, 1, 0, Prediction{Best: time.Hour}); v != Go {
		t.Errorf("no SLO: %v", v)
	}
}

// Release dispatches the requests that can meet their deadline, earliest
// deadline first, predicting again after each dispatch, and refuses those
// that no longer can.
func TestRelease(t *testing.T) {
	g := gate(t, Config{SLO: 1000 * ms})
	// Each request's own prefill (ms) and the shared backlog ahead.
	own := map[int]time.Duration{1: 300 * ms, 2: 100 * ms, 3: 200 * ms, 4: 900 * ms}
	backlog := 5000 * ms
	predict := func(v int) (Prediction, bool) {
		return Prediction{Best: own[v] + backlog, Floor: own[v]}, true
	}
	for _, v := range []int{1, 2, 3, 4} {
		p, _ := predict(v)
		if arrive(g, v, 0, p) != Hold {
			t.Fatalf("%d not held", v)
		}
	}
	var sent, refused []int
	dispatch := func(v int) { sent = append(sent, v); backlog += own[v] }
	refuse := func(v int, _ Reason) { refused = append(refused, v) }
	g.Release(150*ms, predict, dispatch, refuse) // 4 needs 900 ms of the 850 left
	if len(sent) != 0 || !slices.Equal(refused, []int{4}) {
		t.Fatalf("backlog still high: sent %v, refused %v", sent, refused)
	}
	// The backlog drains: at 300 ms, 700 ms are left to each deadline.
	// 1 (300 + 0) goes, then 2 (100 + 300), then 3 (200 + 400).
	backlog = 0
	g.Release(300*ms, predict, dispatch, refuse)
	if !slices.Equal(sent, []int{1, 2, 3}) || g.Len() != 0 {
		t.Errorf("released %v, %d left", sent, g.Len())
	}
	// The second one can no longer make it once the first is sent.
	arrive(g, 5, 0, Prediction{Best: 2000 * ms, Floor: 10 * ms})
	arrive(g, 6, 0, Prediction{Best: 2000 * ms, Floor: 10 * ms})
	own[5], own[6] = 400*ms, 550*ms
	sent, backlog = nil, 0
	g.Release(100*ms, predict, dispatch, refuse)
	if !slices.Equal(sent, []int{5}) || g.Len() != 1 {
		t.Errorf("released %v, %d left; want 5 only", sent, g.Len())
	}
	// No replica: nothing changes.
	g.Release(200*ms, func(int) (Prediction, bool) { return Prediction{}, false }, dispatch, refuse)
	if g.Len() != 1 {
		t.Errorf("no replica: %d left", g.Len())
	}
	if !g.Drop(func(v int) bool { return v == 6 }) || g.Len() != 0 || g.Drop(func(v int) bool { return v == 6 }) {
		t.Error("Drop")
	}
}

func TestDropIf(t *testing.T) {
	g := gate(t, Config{SLO: 1000 * ms})
	over := Prediction{Best: 3000 * ms, Floor: 100 * ms}
	for v := 1; v <= 9; v++ { // three tenants in two bands
		c := Class{Tenant: string(rune('a' + v%3)), Priority: v % 2, Tokens: 10}
		if verdict, _ := g.Arrive(v, c, 0, over, func(int, Reason) {}); verdict != Hold {
			t.Fatalf("%d not held", v)
		}
	}
	var dropped []int
	if n := g.DropIf(func(v int) bool { return v%3 != 1 }, func(v int) { dropped = append(dropped, v) }); n != 6 || len(dropped) != 6 || g.Len() != 3 {
		t.Fatalf("dropped %d (%v), %d left; want 6 and 3", n, dropped, g.Len())
	}
	for _, v := range dropped {
		if v%3 == 1 {
			t.Errorf("%d dropped", v)
		}
	}
	var sent []int
	g.Release(10*ms, func(int) (Prediction, bool) { return Prediction{Best: 200 * ms, Floor: 100 * ms}, true },
		func(v int) { sent = append(sent, v) }, func(v int, _ Reason) { t.Errorf("%d refused", v) })
	if slices.Sort(sent); !slices.Equal(sent, []int{1, 4, 7}) || g.Len() != 0 {
		t.Errorf("released %v, %d left; want 1, 4 and 7", sent, g.Len())
	}
	if n := g.DropIf(func(int) bool { return true }, func(int) {}); n != 0 {
		t.Errorf("dropped %d from an empty queue", n)
	}
}

func TestConfigAndRetryAfter(t *testing.T) {
	for _, bad := range []Config{{SLO: -1}, {SLO: 1, Mode: "later"}, {SLO: 1, MaxQueue: -1}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	c := Config{SLO: time.Second}
	if err := c.Validate(); err != nil || c.Mode != ModeQueue || c.MaxQueue != 1024 {
		t.Errorf("defaults: %+v %v", c, err)
	}
	if _, err := ParseMode("Reject"); err != nil {
		t.Error(err)
	}
	if RetryAfter(Prediction{Best: 3500 * ms}, time.Second) != 3 || RetryAfter(Prediction{Best: 0}, time.Second) != 1 {
		t.Error("RetryAfter")
	}
}

// With no replica available a held request still expires at its deadline
// (found in review: it stayed queued for ever, holding a queue slot).
func TestNoReplicaStillExpires(t *testing.T) {
	g := gate(t, Config{SLO: time.Second})
	if arrive(g, 1, 0, Prediction{Best: 2 * time.Second, Floor: 100 * ms}) != Hold {
		t.Fatal("not held")
	}
	none := func(int) (Prediction, bool) { return Prediction{}, false }
	refused := 0
	g.Release(500*ms, none, func(int) {}, func(int, Reason) { refused++ })
	if refused != 0 || g.Len() != 1 {
		t.Fatalf("refused before its deadline: %d, %d left", refused, g.Len())
	}
	g.Release(1001*ms, none, func(int) {}, func(int, Reason) { refused++ })
	if refused != 1 || g.Len() != 0 {
		t.Errorf("past its deadline: %d refused, %d left", refused, g.Len())
	}
}

// A request's TTFT budget is its own SLO (else the gate's) less what it
// has waited since it arrived, less the headroom; none without an SLO or once it has passed.
func TestTTFTBudget(t *testing.T) {
	c := Config{SLO: 2 * time.Second}
	for _, k := range []struct {
		cl           Class
		arrived, now time.Duration
		want         float64
	}{
		{Class{}, time.Second, 1500 * time.Millisecond, 1425},
		{Class{SLO: 500 * time.Millisecond}, time.Second, 1200 * time.Millisecond, 285},
		{Class{}, 0, 3 * time.Second, 0},
	} {
		if got := c.TTFTBudget(k.cl, k.arrived, k.now); got != k.want {
			t.Errorf("%+v arrived %v, now %v: budget %v, want %v", k.cl, k.arrived, k.now, got, k.want)
		}
	}
	if got := (&Config{}).TTFTBudget(Class{}, 0, 0); got != 0 {
		t.Errorf("no SLO: budget %v", got)
	}
}

// A reload's weights (SetWeights) hold for the tenants with requests
// waiting too: a 3, b 1 set while both have a backlog share 3:1 from then
// on (2026-12-07, a review: each queued tenant kept its weight until its
// queue emptied, so a tenant with a steady backlog kept its old share).
func TestSetWeightsReweighsQueuedTenants(t *testing.T) {
	g := gate(t, Config{SLO: 30 * time.Minute, Weights: map[string]float64{"a": 1, "b": 1}, MaxQueue: 10000, Quantum: 1000})
	f := newFleet()
	for v := range 3000 {
		c := Class{Tenant: "a", Tokens: 200}
		if v%2 == 1 {
			c = Class{Tenant: "b", Tokens: 200}
		}
		hold(t, g, f, v, c)
	}
	g.SetWeights(map[string]float64{"a": 3, "b": 1})
	served := map[string]int{}
	for step := range 200 {
		f.backlog, f.capacity = 0, 50*ms
		f.sent = f.sent[:0]
		f.release(g, time.Duration(step)*ms)
		for _, v := range f.sent {
			if v%2 == 1 {
				served["b"] += 200
			} else {
				served["a"] += 200
			}
		}
	}
	if share := float64(served["a"]) / float64(served["a"]+served["b"]); math.Abs(share-0.75) > 0.02 {
		t.Errorf("after SetWeights(a 3, b 1), a got %.3f of the tokens served (%v), want 0.75", share, served)
	}
}
