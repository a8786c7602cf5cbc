package admit

import (
	"math"
	"slices"
	"testing"
	"time"
)

// fleet is a toy fleet for Release: it takes requests while its backlog is
// under capacity; each request adds its cost in ms to the backlog.
type fleet struct {
	backlog, capacity time.Duration
	cost              map[int]time.Duration
	sent              []int
	refused           map[int]Reason
}

func newFleet() *fleet {
	return &fleet{capacity: 500 * ms, cost: map[int]time.Duration{}, refused: map[int]Reason{}}
}

func (f *fleet) predict(v int) (Prediction, bool) {
	wait := time.Duration(0)
	if f.backlog > f.capacity {
		wait = f.backlog - f.capacity + time.Hour // far past any SLO
	}
	return Prediction{Best: f.cost[v] + wait, Floor: f.cost[v]}, true
}
func (f *fleet) dispatch(v int)           { f.sent = append(f.sent, v); f.backlog += f.cost[v] }
func (f *fleet) refuse(v int, why Reason) { f.refused[v] = why }
func (f *fleet) release(g *Gate[int], now time.Duration) {
	g.Release(now, f.predict, f.dispatch, f.refuse)
}

// hold queues v of class c, predicted to miss its SLO.
func hold(t *testing.T, g *Gate[int], f *fleet, v int, c Class) {
	t.Helper()
	f.cost[v] = 10 * ms
	if verdict, why := g.Arrive(v, c, 0, Prediction{Best: time.Hour, Floor: 10 * ms}, f.refuse); verdict != Hold {
		t.Fatalf("%d: %v (%s), want held", v, verdict, why)
	}
}

// Bands are strict: while the fleet can take only some, the higher band's
// requests all go before any of the lower's, whatever their arrival.
func TestBandsAreStrict(t *testing.T) {
	g := gate(t, Config{SLO: time.Minute})
	f := newFleet()
	for v := range 20 {
		c := Class{Tenant: "batch", Priority: 0, Tokens: 100}
		if v%2 == 1 {
			c = Class{Tenant: "chat", Priority: 2, Tokens: 100}
		}
		hold(t, g, f, v, c)
	}
	f.capacity = 95 * ms // ten requests of 10 ms fit
	f.release(g, ms)
	if len(f.sent) != 10 {
		t.Fatalf("sent %v", f.sent)
	}
	for _, v := range f.sent {
		if v%2 != 1 {
			t.Errorf("a batch request (%d) went while chat waited: %v", v, f.sent)
		}
	}
	// A batch request that arrives while chat waits (and the fleet has
	// room) is held behind it; chat goes first when the fleet drains.
	f2, g2 := newFleet(), gate(t, Config{SLO: time.Minute})
	hold(t, g2, f2, 1, Class{Tenant: "chat", Priority: 2})
	f2.cost[2] = 10 * ms
	if v, _ := g2.Arrive(2, Class{Tenant: "batch"}, 0, Prediction{Best: 10 * ms, Floor: 10 * ms}, f2.refuse); v != Hold {
		t.Errorf("batch went past waiting chat: %v", v)
	}
	f2.release(g2, ms)
	if !slices.Equal(f2.sent, []int{1, 2}) {
		t.Errorf("released %v, want chat then batch", f2.sent)
	}
}

// Within a band, tenants share what the fleet takes in proportion to their
// weights, counted in tokens, however many requests each sends and however
// large.
func TestFairSharesInTokens(t *testing.T) {
	g := gate(t, Config{SLO: 30 * time.Minute, Weights: map[string]float64{"a": 3, "b": 1}, MaxQueue: 10000, Quantum: 1000})
	f := newFleet()
	tokens := map[int]int{}
	for v := range 3000 {
		c := Class{Tenant: "a", Tokens: 200 + 37*(v%7)}
		if v%2 == 1 {
			c = Class{Tenant: "b", Tokens: 1000 + 113*(v%5)} // fewer, larger requests
		}
		tokens[v] = c.Tokens
		hold(t, g, f, v, c)
	}
	served := map[string]int{}
	for step := range 200 {
		f.backlog, f.capacity = 0, 50*ms // five requests a round
		f.sent = f.sent[:0]
		f.release(g, time.Duration(step)*ms)
		for _, v := range f.sent {
			served[map[bool]string{true: "b", false: "a"}[v%2 == 1]] += tokens[v]
		}
	}
	share := float64(served["a"]) / float64(served["a"]+served["b"])
	if math.Abs(share-0.75) > 0.02 {
		t.Errorf("a got %.3f of the tokens served (%v), want 0.75", share, served)
	}
}

// Within a tenant, the earliest deadline goes first: a request with a
// tighter SLO overtakes one that came before it.
func TestDeadlineOrderWithinATenant(t *testing.T) {
	g := gate(t, Config{SLO: 10 * time.Second})
	f := newFleet()
	hold(t, g, f, 1, Class{Tenant: "a"})
	hold(t, g, f, 2, Class{Tenant: "a", SLO: 2 * time.Second})
	hold(t, g, f, 3, Class{Tenant: "a", SLO: 5 * time.Second})
	f.release(g, ms)
	if !slices.Equal(f.sent, []int{2, 3, 1}) {
		t.Errorf("released %v, want earliest deadline first", f.sent)
	}
}

// Sheddable requests are refused at once when the fleet is saturated, and
// go when it is not; a full queue makes room for a higher priority by
// refusing the latest of the lowest, and refuses a request of the lowest.
func TestShedding(t *testing.T) {
	g := gate(t, Config{SLO: time.Second, MaxQueue: 3})
	f := newFleet()
	if v, why := g.Arrive(1, Class{Priority: -1}, 0, Prediction{Best: 2 * time.Second, Floor: 10 * ms}, f.refuse); v != Reject || why != ReasonShed {
		t.Errorf("sheddable under saturation: %v %s", v, why)
	}
	if v, _ := g.Arrive(1, Class{Priority: -1}, 0, Prediction{Best: 100 * ms, Floor: 10 * ms}, f.refuse); v != Go {
		t.Errorf("sheddable with room: %v", v)
	}
	hold(t, g, f, 10, Class{Tenant: "batch", Priority: 0})
	hold(t, g, f, 11, Class{Tenant: "batch", Priority: 0})
	hold(t, g, f, 12, Class{Tenant: "chat", Priority: 2})
	if v, why := g.Arrive(13, Class{Tenant: "batch"}, 0, Prediction{Best: time.Hour, Floor: 10 * ms}, f.refuse); v != Reject || why != ReasonFull {
		t.Errorf("batch into a full queue: %v %s", v, why)
	}
	hold(t, g, f, 14, Class{Tenant: "chat", Priority: 2})
	if f.refused[11] != ReasonEvicted || len(f.refused) != 1 || g.Len() != 3 {
		t.Errorf("chat into a full queue: refused %v, %d waiting; want the latest batch request evicted", f.refused, g.Len())
	}
}

// Saturation holds batch work the fleet could serve within its SLO while
// every replica has requests waiting for a first token; work of standard
// priority and above goes on its SLO alone.
func TestSaturation(t *testing.T) {
	g := gate(t, Config{SLO: 5 * time.Second})
	busy := Prediction{Best: 600 * ms, Floor: 300 * ms, Waiting: 1}
	if v, _ := g.Arrive(1, Class{Priority: Standard}, 0, busy, nil); v != Go {
		t.Errorf("standard, within its SLO, requests waiting: %v", v)
	}
	if v, _ := g.Arrive(2, Class{Priority: Batch}, 0, Prediction{Best: 600 * ms, Floor: 300 * ms}, nil); v != Go {
		t.Errorf("batch, none waiting: %v", v)
	}
	if v, _ := g.Arrive(3, Class{Priority: Batch}, 0, busy, nil); v != Hold {
		t.Errorf("batch, requests waiting: %v, want held", v)
	}
	if v, why := g.Arrive(4, Class{Priority: Sheddable}, 0, busy, nil); v != Reject || why != ReasonShed {
		t.Errorf("sheddable, requests waiting: %v %s, want shed", v, why)
	}
	off := gate(t, Config{SLO: 5 * time.Second, SaturationWaiting: -1})
	if v, _ := off.Arrive(1, Class{Priority: Batch}, 0, busy, nil); v != Go {
		t.Errorf("batch with saturation off: %v", v)
	}
	c := Config{SLO: time.Second, SaturationWaiting: 2}
	batch := Class{Priority: Batch}
	if c.WaitingCap(batch) != 3 || c.WaitingCap(Class{Priority: Standard}) != 0 || (&Config{SLO: time.Second, SaturationWaiting: -1}).WaitingCap(batch) != 0 {
		t.Error("WaitingCap")
	}
	// A tenant's own SLO is enough.
	if (&Config{}).WaitingCap(batch) != 0 || (&Config{}).WaitingCap(Class{Priority: Batch, SLO: time.Minute}) != 1 {
		t.Error("WaitingCap with the tenant's SLO")
	}
}

// A tenant whose requests no replica can serve now, or whose requests the
// fleet cannot take, waits without holding up a tenant that can go; a
// shorter request behind a head that cannot go goes.
func TestBlockedTenantsAndLookahead(t *testing.T) {
	g := gate(t, Config{SLO: time.Second})
	f := newFleet()
	hold(t, g, f, 1, Class{Tenant: "x", Priority: 1}) // no replica for it
	hold(t, g, f, 2, Class{Tenant: "y", Priority: 1})
	hold(t, g, f, 3, Class{Tenant: "z", Priority: 0})
	predict := func(v int) (Prediction, bool) {
		if v == 1 {
			return Prediction{}, false
		}
		return f.predict(v)
	}
	g.Release(ms, predict, f.dispatch, f.refuse)
	if !slices.Equal(f.sent, []int{2, 3}) || g.Len() != 1 {
		t.Errorf("released %v, %d left; want 2 and 3", f.sent, g.Len())
	}

	g, f = gate(t, Config{SLO: time.Second}), newFleet()
	hold(t, g, f, 1, Class{Tenant: "a"})
	hold(t, g, f, 2, Class{Tenant: "a"})
	f.cost[1] = 2 * time.Second // cannot make it now, though it could on an idle replica later
	f.cost[2] = 10 * ms
	g.Release(ms, func(v int) (Prediction, bool) {
		p, _ := f.predict(v)
		p.Floor = 10 * ms
		return p, true
	}, f.dispatch, f.refuse)
	if !slices.Equal(f.sent, []int{2}) || g.Len() != 1 {
		t.Errorf("released %v, %d left; want the shorter 2", f.sent, g.Len())
	}
}

func TestPriorities(t *testing.T) {
	for s, want := range map[string]int{"interactive": Interactive, " Batch": Batch, "sheddable": Sheddable, "-3": -3, "1000": 1000} {
		if p, err := ParsePriority(s); err != nil || p != want {
			t.Errorf("%q: %d %v", s, p, err)
		}
	}
	for _, bad := range []string{"", "urgent", "1001", "1.5"} {
		if _, err := ParsePriority(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if PriorityName(Standard) != "standard" || PriorityName(7) != "7" {
		t.Error("PriorityName")
	}
}

// A request the fleet cannot take (another model's replicas are full, or
// its SLO is tight) holds up neither its band's other tenants nor the
// bands below (found in review: they waited until they expired).
func TestNoHeadOfLineBlocking(t *testing.T) {
	g := gate(t, Config{SLO: time.Second})
	f := newFleet()
	stuck := func(v int) (Prediction, bool) {
		if v == 1 {
			return Prediction{Best: time.Hour, Floor: 10 * ms}, true
		}
		return f.predict(v)
	}
	hold(t, g, f, 1, Class{Tenant: "a", Priority: Interactive})
	hold(t, g, f, 2, Class{Tenant: "b", Priority: Interactive})
	hold(t, g, f, 3, Class{Tenant: "b", Priority: Interactive})
	hold(t, g, f, 4, Class{Tenant: "c", Priority: Standard})
	g.Release(ms, stuck, f.dispatch, f.refuse)
	if !slices.Equal(f.sent, []int{2, 3, 4}) || g.Len() != 1 {
		t.Errorf("released %v, %d left; want all but the stuck one", f.sent, g.Len())
	}
}

// A tenant flooding its band cannot keep the queue from the others: a
// full queue makes room for another tenant of the band by refusing the
// flooder's latest arrival.
func TestFullQueueIsShared(t *testing.T) {
	g := gate(t, Config{SLO: time.Minute, MaxQueue: 4})
	f := newFleet()
	for v := range 4 {
		hold(t, g, f, v, Class{Tenant: "flood"})
	}
	if v, why := g.Arrive(9, Class{Tenant: "flood"}, 0, Prediction{Best: time.Hour, Floor: ms}, f.refuse); v != Reject || why != ReasonFull {
		t.Errorf("the flooder into its full queue: %v %s", v, why)
	}
	hold(t, g, f, 10, Class{Tenant: "other"})
	if f.refused[3] != ReasonEvicted || len(f.refused) != 1 {
		t.Errorf("refused %v: want the flooder's latest", f.refused)
	}
	hold(t, g, f, 11, Class{Tenant: "other"})
	if v, why := g.Arrive(12, Class{Tenant: "other"}, 0, Prediction{Best: time.Hour, Floor: ms}, f.refuse); v != Reject || why != ReasonFull {
		t.Errorf("past its share: %v %s", v, why)
	}
}

// Under a backlog that outlasts the oldest requests' deadlines, Release
// sends the earliest request that can still make its deadline, however
// far behind the head it waits, not none (the heads would hold the fleet
// idle until they expired) and not the latest.
func TestReleaseFindsTheEarliestThatFits(t *testing.T) {
	g := gate(t, Config{SLO: time.Second})
	var sent []int
	refused := map[int]Reason{}
	for i := range 40 {
		if v, why := g.Arrive(i, Class{Tenant: "a"}, time.Duration(i)*20*ms, Prediction{Best: time.Hour, Floor: 10 * ms}, func(v int, r Reason) { refused[v] = r }); v != Hold {
			t.Fatalf("%d: %v (%s)", i, v, why)
		}
	}
	// At 500 ms request i has 500 + 20i ms left; the fleet forecasts 900 ms
	// for any of them, which fits from i = 23 on (900 ≤ 0.95 × 960), and
	// then takes no more.
	full := false
	predict := func(int) (Prediction, bool) {
		if full {
			return Prediction{Best: time.Hour, Floor: 10 * ms}, true
		}
		return Prediction{Best: 900 * ms, Floor: 10 * ms}, true
	}
	g.Release(500*ms, predict, func(v int) { sent = append(sent, v); full = true }, func(v int, r Reason) { refused[v] = r })
	if !slices.Equal(sent, []int{23}) || len(refused) != 0 || g.Len() != 39 {
		t.Errorf("sent %v, refused %v, %d left; want 23 alone", sent, refused, g.Len())
	}
}
