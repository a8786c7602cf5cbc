package mesh

import (
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// The leg between two routers is the mean of the two ways each measures
// by the two clocks, in which the clocks' difference cancels out; until
// the other way is told, this way alone, and never below zero.
func TestLegCancelsTheClocksDifference(t *testing.T) {
	now := time.Unix(1000, 0)
	skew := 300 * time.Millisecond // the sender's clock is ahead
	var p peer
	if _, ok := p.leg(); ok {
		t.Fatal("a leg before any timed event")
	}
	p.timed(now.Add(-20*time.Millisecond+skew).UnixNano(), now)
	if leg, ok := p.leg(); !ok || leg != 0 {
		t.Fatalf("this way alone, by a clock 300 ms ahead: %v (%v), want 0", leg, ok)
	}
	p.back, p.heardsBack = float64(20*time.Millisecond+skew), true // what it measured of ours
	if leg, ok := p.leg(); !ok || leg != 20*time.Millisecond {
		t.Fatalf("both ways: %v, want 20ms", leg)
	}
	// A sample beyond maxLegSample (clocks far apart, or made up) is not
	// taken, nor a missing time.
	p.timed(now.Add(-time.Hour).UnixNano(), now)
	p.timed(0, now)
	if leg, _ := p.leg(); leg != 20*time.Millisecond {
		t.Fatalf("after a sample of an hour and one of no time: %v, want 20ms", leg)
	}
}

// A router's events buffered while it was cut off from the bus come with
// their old times when it is back: the leg is the least of the last
// minute's, so they do not move it, however many; a leg that truly grows
// is taken within the minute (a review: a mean took the buffered events'
// seconds for a leg, for tens of events after).
func TestLegIgnoresBufferedEvents(t *testing.T) {
	now := time.Unix(1000, 0)
	var p peer
	p.timed(now.Add(-50*time.Millisecond).UnixNano(), now)
	now = now.Add(30 * time.Second) // back on the bus
	for k := 1000; k >= 1; k-- {    // sent k·20 ms before it was back, each a leg on the way
		p.timed(now.Add(-50*time.Millisecond-time.Duration(k)*20*time.Millisecond).UnixNano(), now)
	}
	if leg, _ := p.leg(); leg != 50*time.Millisecond {
		t.Fatalf("after 1,000 buffered events of up to 20 s ago: %v, want 50ms", leg)
	}
	for range 30 {
		now = now.Add(2 * time.Second)
		p.timed(now.Add(-80*time.Millisecond).UnixNano(), now)
	}
	if leg, _ := p.leg(); leg != 80*time.Millisecond {
		t.Fatalf("after a minute of events 80 ms late: %v, want 80ms", leg)
	}
}

// How late another router says it hears this one is bounded as this
// router's own samples are, before it is scaled (a review: 2^61 µs
// overflowed into a few ms and was taken).
func TestHeartbeatLegsAreBounded(t *testing.T) {
	b := newBus(Config{Name: "me"}.Defaults(), newRouter(t), func() time.Duration { return 0 }, slog.New(slog.DiscardHandler))
	b.apply(&event{Router: "other", Boot: 1, Kind: kindAlive, Legs: map[string]int64{"me": 1<<61 + 20000}}, time.Now())
	if p := b.peers["other"]; p == nil || p.heardsBack {
		t.Fatalf("a leg of 2^61 µs taken: %+v", p)
	}
	b.apply(&event{Router: "other", Boot: 1, Kind: kindAlive, Legs: map[string]int64{"me": 20000}}, time.Now())
	if p := b.peers["other"]; !p.heardsBack || p.back != float64(20*time.Millisecond) {
		t.Fatalf("a leg of 20 ms: %+v", p)
	}
}

// A router counts another's dispatches to a replica it has not heard of
// yet in the backlog its own requests would find there: for that it takes
// the other's round trip to the replica from its dispatch, and the leg
// between them from their events' times and heartbeats.
func TestUnheardDispatchesOfAnotherRouter(t *testing.T) {
	url := natsServer(t)
	p, _ := policy.New("gorgo-ms", policy.Options{})
	far, err := router.New(router.Config{Policy: p, BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := far.Add(router.ReplicaConfig{ID: "a", KVCapacityTokens: 1 << 16, PrefillMSPerToken: 0.06, QueueMSPerToken: 0.06}); err != nil {
		t.Fatal(err)
	}
	far.ObserveRTT("a", 200*time.Millisecond) // 100 ms one way; the sender's is 5 ms
	// Heartbeats by hand (none on their own for a minute), so that the
	// leg stands still once the dispatches are heard.
	us := joinWith(t, Config{URL: url, Name: "us", Heartbeat: time.Minute}, newRouter(t))
	eu := joinWith(t, Config{URL: url, Name: "eu", Heartbeat: time.Minute}, far)
	heard := func(b *Bus, name string, back bool) func() bool {
		return func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			p := b.peers[name]
			return p != nil && p.heardAt && (!back || p.heardsBack)
		}
	}
	eu.heartbeat()
	eventually(t, "us to hear eu", heard(us, "eu", false))
	us.heartbeat()
	eventually(t, "eu to hear how late its news comes to us", heard(eu, "us", true))
	probe := &policy.Request{PromptTokens: 16}
	wait := func() float64 {
		f, err := far.Predict(0, probe)
		if err != nil {
			t.Fatal(err)
		}
		return float64(f.Best-f.Floor)/1e6/0.06 - float64(inFlightTokens(t, far, "a")) // tokens ahead beyond the ledger's
	}
	// A dispatch without a round trip (a router before this change) adds
	// its prompt to the ledger and nothing more.
	us.Dispatched(1, "a", 0, &policy.Request{PromptTokens: 1_000_000})
	eventually(t, "the first mirror", func() bool { n, _ := inFlight(t, far, "a"); return n == 1 })
	if u := wait(); u < -1 || u > 1 {
		t.Fatalf("unheard tokens %.0f without the sender's round trip, want 0", u)
	}
	// With it: 1,000,000 tokens heard at once, by a flow so young that
	// they are taken as heard over a tenth of flowTau as the decay weighs
	// it (10·(1 − e^−0.1) = 0.95 s), in a window of the leg + 100 − 5 ms:
	// 99,835 and the leg's share.
	us.Dispatched(2, "a", 10*time.Millisecond, &policy.Request{PromptTokens: 1_000_000})
	eventually(t, "the second mirror", func() bool { n, _ := inFlight(t, far, "a"); return n == 2 })
	eu.mu.Lock()
	leg, _ := eu.peers["us"].leg()
	eu.mu.Unlock()
	u, want := wait(), 1e6*(0.095+leg.Seconds())/(10*(1-math.Exp(-0.1)))
	if u < want-2 || u > want+2 {
		t.Fatalf("unheard tokens %.0f, want about %.0f (a leg of %v)", u, want, leg)
	}
	if shown, err := far.Unheard(0, "a"); err != nil || math.Abs(float64(shown)-u) > 2 {
		t.Fatalf("Router.Unheard shows %d (%v), the forecast %.0f", shown, err, u)
	}
}

// inFlightTokens is the replica's prefill backlog in rt's ledger.
func inFlightTokens(t *testing.T, rt *router.Router, id string) int {
	t.Helper()
	st, err := rt.Replica(id)
	if err != nil {
		t.Fatal(err)
	}
	return st.BacklogTokens
}
