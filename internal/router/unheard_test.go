package router

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// Another router's dispatches this router has not heard of yet are in the
// backlog a request of its own would find at the replica, in the view the
// policies see and in the forecast: the origin's recent rate of uncached
// tokens there times the window leg(S,R) + d(R,X) − d(S,X).
func TestUnheardDispatchesJoinTheBacklog(t *testing.T) {
	r := newRouter(t, "round-robin", 1, false) // a: 10 ms, so 5 ms one way
	m, err := r.member("a")
	if err != nil {
		t.Fatal(err)
	}
	unheard := func(now time.Duration) int { return m.view(now, 0).BacklogTokens - int(m.backlog.Load()) }
	far := Origin{Name: "far", Leg: 45 * time.Millisecond, RTT: 0}                   // window 45 + 5 − 0 = 50 ms
	near := Origin{Name: "near", Leg: time.Millisecond, RTT: 100 * time.Millisecond} // 1 + 5 − 50 < 0: none
	for i := range 10 {
		for _, from := range []Origin{far, near, {}} {
			if _, ok := r.Enter(0, "a", &policy.Request{PromptTokens: 1000, Blocks: blocks(uint64(1+i), 4)}, OutputKeys{}, from); !ok {
				t.Fatal("not entered")
			}
		}
	}
	// far: 10 × 1,000 uncached tokens heard at 0 (none was Accepted, so
	// the index credits no prefix). A flow so young is taken as heard
	// over a tenth of flowTau, weighed as the decay weighs it (0.95 s): a
	// rate of 10,508 tokens a second, 525 in 50 ms.
	if got := unheard(0); got != 525 {
		t.Fatalf("unheard at 0: %d tokens, want 525", got)
	}
	if got, err := r.Unheard(0, "a"); err != nil || got != 525 {
		t.Fatalf("Router.Unheard: %d, %v; want 525", got, err)
	}
	if _, err := r.Unheard(0, "nope"); err == nil {
		t.Fatal("Router.Unheard of a replica it does not have: no error")
	}
	// A time constant later, the tokens faded by 1/e over the 6.3 s the
	// decay weighs by then: 29.
	if got := unheard(flowTau); got != 29 {
		t.Fatalf("unheard a time constant later: %d tokens, want 29", got)
	}
	_, mean, _ := m.forecast(0, 0, 0, 0)
	if want := float64(m.backlog.Load()+525) * 0.06; mean < want-1e-9 || mean > want+1e-9 {
		t.Fatalf("forecast's wait %.3f ms, want %.3f (the ledger's backlog and the unheard)", mean, want)
	}
	// A steady flow of 1,000 tokens a second for a minute is that rate:
	// 52 tokens in 50 ms (Σ e^(−k/10), k = 0..60, is 10.48 seconds' worth).
	steady := newRouter(t, "round-robin", 1, false)
	sm, _ := steady.member("a")
	for k := range 61 {
		if _, ok := steady.Enter(time.Duration(k)*time.Second, "a", &policy.Request{PromptTokens: 1000, Blocks: blocks(uint64(100+k), 4)}, OutputKeys{}, far); !ok {
			t.Fatal("not entered")
		}
	}
	if got := sm.flows.unheard(60*time.Second, 5*time.Millisecond, sm.decisions, false); got != 52 {
		t.Fatalf("a steady flow: %d tokens unheard, want 52", got)
	}
	// The origins a replica keeps are bounded: the least busy make room.
	for i := range 2 * maxFlows {
		r.Enter(0, "a", &policy.Request{PromptTokens: 1}, OutputKeys{}, Origin{Name: fmt.Sprint("o", i), Leg: time.Second})
	}
	kept := func(name string) *flow {
		for i := range m.flows.by {
			if m.flows.by[i].name == name {
				return &m.flows.by[i]
			}
		}
		return nil
	}
	if n := len(m.flows.by); n != maxFlows || m.flows.n.Load() != maxFlows || kept("far") == nil {
		t.Fatalf("%d origins kept (n %d, far kept: %v), want %d with the busiest", n, m.flows.n.Load(), kept("far") != nil, maxFlows)
	}
	// A made-up leg is bounded.
	r.Enter(0, "a", &policy.Request{PromptTokens: 1 << 20}, OutputKeys{}, Origin{Name: "liar", Leg: 1 << 62})
	if f := kept("liar"); f == nil || f.leg != maxLeg {
		t.Fatalf("a made-up leg kept as %+v, want %v", f, maxLeg)
	}
}

// The unheard dispatches are learned per decision once their news comes:
// where this router's decisions and the other's dispatches come in the
// same bursts (clients driven by one clock), each decision had a whole
// burst of the other's ahead of it, far more than the other's mean rate
// times the window says; where they never coincide, none.
func TestUnheardDispatchesAreLearnedPerDecision(t *testing.T) {
	far := Origin{Name: "far", Leg: 45 * time.Millisecond} // window 45 + 5 − 0 = 50 ms
	run := func(offset time.Duration) int {
		r := newRouter(t, "round-robin", 1, false) // a: 5 ms one way
		m, err := r.member("a")
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 1))
		for k := range 60 {
			tick := time.Duration(k) * time.Second
			// The other's dispatch at the tick, heard a leg later; this
			// router's three requests of the tick, offset after it (in
			// time order: the news is not of decisions yet to come).
			heard := func() {
				if _, ok := r.Enter(tick+far.Leg, "a", &policy.Request{PromptTokens: 1000, Blocks: blocks(uint64(k+1), 4)}, OutputKeys{}, far); !ok {
					t.Fatal("not entered")
				}
			}
			if offset > far.Leg {
				heard()
			}
			for j := range 3 {
				req := policy.Request{PromptTokens: 10, Blocks: blocks(uint64(1000+3*k+j), 1)}
				tk, err := r.Route(tick+offset, &req, rng)
				if err != nil {
					t.Fatal(err)
				}
				r.Finish(&tk)
			}
			if offset <= far.Leg {
				heard()
			}
		}
		return m.flows.unheard(60*time.Second, 5*time.Millisecond, m.decisions, false)
	}
	// The rate (1,000 tokens a second) times the window is 52 tokens (see
	// TestUnheardDispatchesJoinTheBacklog); together, each decision had
	// the whole 1,000 ahead: the mean of about 31 decisions' worth, shrunk
	// towards 52 by priorDecisions.
	if got := run(0); got < 800 || got > 1000 {
		t.Errorf("decisions in the other's bursts: %d tokens unheard, want 800–1,000 (each had 1,000 ahead)", got)
	}
	if got := run(500 * time.Millisecond); got > 10 {
		t.Errorf("decisions half a second after the other's: %d tokens unheard, want under 10 (none had any ahead)", got)
	}
}

// A flow that begins at a router already in a mesh (a replica added, an
// origin met) is learned from the decisions since it began, not spread
// over the router's earlier ones (a review: a minute in, a new flow read
// 108 tokens where each decision had 1,000 ahead).
func TestAYoungFlowIsLearnedFromItsOwnDecisions(t *testing.T) {
	r := newRouter(t, "round-robin", 2, false) // a: 5 ms one way, b: 10 ms
	a, err := r.member("a")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	old, young := Origin{Name: "old", Leg: 45 * time.Millisecond}, Origin{Name: "young", Leg: 45 * time.Millisecond}
	for k := range 62 {
		tick := time.Duration(k) * time.Second
		for j := range 3 {
			req := policy.Request{PromptTokens: 10, Blocks: blocks(uint64(1000+3*k+j), 1)}
			tk, err := r.Route(tick, &req, rng)
			if err != nil {
				t.Fatal(err)
			}
			r.Finish(&tk)
		}
		// old's bursts go to b from the start; young's to a from 60 s,
		// each heard a leg after the tick.
		if _, ok := r.Enter(tick+old.Leg, "b", &policy.Request{PromptTokens: 1000, Blocks: blocks(uint64(k+1), 4)}, OutputKeys{}, old); !ok {
			t.Fatal("not entered")
		}
		if k >= 60 {
			if _, ok := r.Enter(tick+young.Leg, "a", &policy.Request{PromptTokens: 1000, Blocks: blocks(uint64(500+k), 4)}, OutputKeys{}, young); !ok {
				t.Fatal("not entered")
			}
		}
	}
	// The flow's decisions are the six of its two bursts (those at 60 s
	// too: its first news, at 60.045 s, was of a dispatch ahead of them),
	// each with 1,000 ahead; their mean shrunk towards the rate times the
	// window (2,000 tokens heard over a young flow's 0.95 s, 105 in 50 ms)
	// by priorDecisions: (6 × 1,000 + 3 × 105) / 9 = 701.
	if got := a.flows.unheard(61*time.Second+100*time.Millisecond, 5*time.Millisecond, a.decisions, false); got < 680 || got > 720 {
		t.Errorf("a flow two bursts old: %d tokens unheard, want 680–720 (each of its six decisions had 1,000 ahead)", got)
	}
}

// A flow's first news is of dispatches ahead of the decisions of the
// window before it: those are the flow's too, and a decision still in its
// window has had part of its news. From one window after its first news
// on, a steady flow reads what each decision finds, and never more (before:
// 9.2 times as much at 50 ms, +17% at 200 ms, +3% a second in, for a
// router whose first news was the flow's; then, with those in their
// window counted by its older half, 2.5 times at 25 ms, a review found;
// what was foretold so high pulled the calibration low for a minute).
func TestAFlowIsNotOvershotInItsFirstWindow(t *testing.T) {
	// A router in a mesh from the start (another origin's flow at b),
	// and one whose first news is the flow's (its decisions recorded from
	// then on).
	for _, meshed := range []bool{true, false} {
		r := newRouter(t, "round-robin", 2, false) // a: 5 ms one way
		m, err := r.member("a")
		if err != nil {
			t.Fatal(err)
		}
		if meshed {
			if _, ok := r.Enter(0, "b", &policy.Request{PromptTokens: 100, Blocks: blocks(1<<30, 1)}, OutputKeys{}, Origin{Name: "old", Leg: time.Millisecond}); !ok {
				t.Fatal("not entered")
			}
		}
		far := Origin{Name: "far", Leg: 45 * time.Millisecond} // window 50 ms at a
		// A decision every millisecond from 0; far's 100 tokens at a every
		// 5 ms from 60 s: ten of them, 1,000 tokens, ahead of each
		// decision once the flow runs.
		start := 60 * time.Second
		probes := []time.Duration{5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 70, 100, 200, 500, 1000, 2000, 5000, 10000, 30000}
		alongAFlow(t, r, far, start, 5*time.Millisecond, time.Millisecond, func(now time.Duration) bool {
			if now == start+far.Leg+probes[0]*time.Millisecond {
				m.flows.mu.Lock()
				r.decisions.mu.Lock()
				got := m.flows.learned(&m.flows.by[slices.IndexFunc(m.flows.by, func(f flow) bool { return f.name == "far" })], now, 5*time.Millisecond, &r.decisions)
				r.decisions.mu.Unlock()
				m.flows.mu.Unlock()
				// Never more. Within the first window its few decisions
				// are outweighed by the prior (the rate, young); the
				// decisions of the window before the first news had
				// fewer ahead (the flow began in their windows): a router
				// that recorded them reads less for a while, until they
				// are outweighed.
				low := 960.0
				switch at := probes[0] * time.Millisecond; {
				case at < far.Leg+5*time.Millisecond:
					low = 0
				case meshed && at < time.Second:
					low = 600
				case at >= time.Second:
					low = 980
				}
				if got < low || got > 1020 {
					t.Errorf("meshed before it: %v; %v after the flow's first news: %.0f tokens unheard, want %.0f–1,020 (each decision finds 1,000)", meshed, probes[0]*time.Millisecond, got, low)
				}
				probes = probes[1:]
			}
			return len(probes) > 0
		})
	}
}

// alongAFlow has r decide every step from 0 (a request of 10 uncached
// tokens), while from sends 100 uncached tokens to replica a every period
// from start on, each heard a leg later (entered before that instant's
// decision); after each instant's decision it calls after, until after
// says to stop.
func alongAFlow(t *testing.T, r *Router, from Origin, start, period, step time.Duration, after func(now time.Duration) bool) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 1))
	for now := time.Duration(0); ; now += step {
		if s := now - from.Leg; s >= start && (s-start)%period == 0 {
			if _, ok := r.Enter(now, "a", &policy.Request{PromptTokens: 100, Blocks: blocks(uint64(1+now/time.Millisecond), 1)}, OutputKeys{}, from); !ok {
				t.Fatal("not entered")
			}
		}
		tk, err := r.Route(now, &policy.Request{PromptTokens: 10, Blocks: blocks(uint64(1<<20+int(now/time.Millisecond)), 1)}, rng)
		if err != nil {
			t.Fatal(err)
		}
		r.Finish(&tk)
		if !after(now) {
			return
		}
	}
}

// A leg as long as the flows' time constant is learned as a short one:
// each decision's count and its credits decay from when it was made
// (before, at 654a24d: credits decayed from when the news came, and a
// decision still in its window counted undecayed: a leg of a second read
// +5%, of 5 s +17%).
func TestALongLegIsLearned(t *testing.T) {
	for _, leg := range []time.Duration{40 * time.Millisecond, 990 * time.Millisecond, 4990 * time.Millisecond, 9990 * time.Millisecond} {
		r := newRouter(t, "round-robin", 1, false) // a: 5 ms one way
		m, err := r.member("a")
		if err != nil {
			t.Fatal(err)
		}
		// A decision every 10 ms; far's 100 tokens every 50 ms, for two
		// minutes.
		end := 2 * time.Minute
		alongAFlow(t, r, Origin{Name: "far", Leg: leg}, 0, 50*time.Millisecond, 10*time.Millisecond, func(now time.Duration) bool { return now < end })
		// Each decision at t finds the dispatches sent in (t − leg, t + 5 ms].
		want := 0.0
		for t0 := time.Duration(0); t0 < 50*time.Millisecond; t0 += 10 * time.Millisecond {
			for s := -20 * time.Second; s <= t0+5*time.Millisecond; s += 50 * time.Millisecond {
				if s > t0-leg {
					want += 100.0 / 5
				}
			}
		}
		if got := float64(m.flows.unheard(end, 5*time.Millisecond, m.decisions, false)); got < want*0.99 || got > want*1.01 {
			t.Errorf("leg %v: %.0f tokens unheard, want %.0f (within 1%%)", leg, got, want)
		}
	}
}

// The decisions' count and ages are faded once an instant and kept for
// its reads: a decision made at the same instant after a read is counted
// by the next (the memo is of the instant and the decisions made).
func TestDecisionsFadedOnceAnInstant(t *testing.T) {
	var d decisions
	d.add(time.Second)
	d.mu.Lock()
	first, _ := d.lastAt(time.Second)
	d.mu.Unlock()
	d.add(time.Second)
	d.mu.Lock()
	second, _ := d.lastAt(time.Second)
	later, _ := d.lastAt(time.Second + flowTau)
	d.mu.Unlock()
	if first != 1 || second != 2 || math.Abs(later-2/math.E) > 1e-12 {
		t.Errorf("counts %v, then %v at one instant, %v a time constant later; want 1, 2, %.4f", first, second, later, 2/math.E)
	}
}

// A read behind the router's latest decision (a clock read before the
// decision took the lock) is as of that decision, not of two instants (a
// review: the decisions' ages faded to one time, the window's start to
// another, 1.2% low a millisecond behind).
func TestAReadBehindTheLatestDecision(t *testing.T) {
	read := func(behind time.Duration) int {
		r := newRouter(t, "round-robin", 1, false) // a: 5 ms one way
		m, err := r.member("a")
		if err != nil {
			t.Fatal(err)
		}
		alongAFlow(t, r, Origin{Name: "far", Leg: 45 * time.Millisecond}, 0, 5*time.Millisecond, time.Millisecond, func(now time.Duration) bool { return now < time.Second })
		return m.flows.unheard(time.Second-behind, 5*time.Millisecond, m.decisions, false)
	}
	at, behind := read(0), read(time.Millisecond)
	if d := math.Abs(float64(behind-at)) / float64(at); d > 0.002 {
		t.Errorf("a read a millisecond behind the latest decision: %d tokens unheard, at it %d (%.1f%% apart, want under 0.2%%)", behind, at, 100*d)
	}
}

// The decisions' count before a window and their parts of it passed are
// exact: against sums over every decision, through bursts at one instant
// and gaps of many time constants, read at and after the latest.
func TestTheDecisionsOfAWindowAreExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	var d decisions
	var times []time.Duration
	var now time.Duration
	for step := range 6000 {
		switch rng.IntN(10) {
		case 0: // another at the same instant
		case 1:
			now += time.Duration(rng.IntN(30)) * time.Second
		default:
			now += time.Duration(rng.IntN(5_000_000))
		}
		d.add(now)
		times = append(times, now)
		if step%61 != 0 {
			continue
		}
		read := now + time.Duration(rng.IntN(100))*time.Millisecond
		window := time.Duration(1+rng.IntN(3000)) * time.Millisecond
		var before, passed, since float64
		for _, at := range times {
			k := decay(at, read)
			if at < read-window {
				before += k
			} else {
				passed += k * float64(read-at) / float64(window)
				since += k
			}
		}
		d.mu.Lock()
		b, p := d.split(d.first(read-window), read, window)
		c := d.since(d.first(read-window), read)
		d.mu.Unlock()
		for _, x := range [][3]float64{{b, before, 0}, {p, passed, 1}, {c, since, 2}} {
			if math.Abs(x[0]-x[1]) > 1e-9*max(before+since, 1) {
				t.Fatalf("step %d, %v window read %v after: %s %.12g, the sum over every decision %.12g", step, window, read-now, []string{"before", "passed", "since"}[int(x[2])], x[0], x[1])
			}
		}
	}
}

// The decisions still in a window are counted by a cached position that
// moves on as time does and is searched for again when the window
// shrinks or the ring wraps: always as a search from scratch counts them.
func TestDecisionsInAWindow(t *testing.T) {
	var d decisions
	rng := rand.New(rand.NewPCG(7, 7))
	var now time.Duration
	next := 0
	for step := range 100_000 {
		now += time.Duration(rng.IntN(3)) * time.Millisecond // bursts: several at one instant
		d.add(now)
		w := time.Duration(rng.IntN(200)) * time.Millisecond
		if step%1000 == 0 {
			next = rng.IntN(d.n + 2) // a stale cache
		}
		d.mu.Lock()
		got, want := d.firstInWindow(now-w, &next), d.first(now-w)
		d.mu.Unlock()
		if got != want {
			t.Fatalf("step %d: %d decisions in the last %v, a search finds %d", step, got, w, want)
		}
	}
}

// A router calibrates what it counts unheard of an origin by what the
// news later shows its decisions found of that origin's dispatches at the
// replicas they picked, against what they foretold there: where the
// others' bursts go where its own requests go (both drawn to the replica
// that looks least loaded), a mean over all its decisions falls short at
// the replica picked.
func TestUnheardIsCalibratedOnTheReplicasPicked(t *testing.T) {
	far := Origin{Name: "far", Leg: 45 * time.Millisecond} // windows of 50 and 55 ms at a and b
	// run: each tick (a second apart) this router decides perTick times
	// at one instant, round-robin between a and b; the other's burst of
	// 1,000 tokens at the same tick goes where follow says, given the
	// replica the tick's first decision picked. want is the ratio as the
	// test counts it: per decision, 1,000 found where the burst went to
	// the replica it picked, against what it foretold there as learned,
	// both decayed over calibrationTau.
	run := func(ticks, perTick int, follow func(picked string, k int) string) (r *Router, now time.Duration, want float64) {
		r = newRouter(t, "round-robin", 2, false)
		rng := rand.New(rand.NewPCG(1, 1))
		var found, foretold float64
		fade := math.Exp(-float64(time.Second) / float64(calibrationTau))
		for k := range ticks {
			now = time.Duration(k) * time.Second
			raw := map[string]int{}
			for _, id := range []string{"a", "b"} {
				m, _ := r.member(id)
				raw[id] = m.flows.unheard(now, time.Duration(m.rttNS.Load())/2, m.decisions, false)
			}
			var picked []string
			for j := range perTick {
				req := policy.Request{PromptTokens: 10, Blocks: blocks(uint64(1000+perTick*k+j), 1)}
				tk, err := r.Route(now, &req, rng)
				if err != nil {
					t.Fatal(err)
				}
				r.Finish(&tk)
				picked = append(picked, tk.ID)
			}
			to := follow(picked[0], k)
			if _, ok := r.Enter(now+far.Leg, to, &policy.Request{PromptTokens: 1000, Blocks: blocks(uint64(k+1), 4)}, OutputKeys{}, far); !ok {
				t.Fatal("not entered")
			}
			if k == 0 {
				continue // no flow yet: nothing foretold
			}
			found, foretold = found*fade, foretold*fade
			for _, id := range picked {
				foretold += float64(raw[id])
				if id == to {
					found += 1000
				}
			}
		}
		return r, now, found / foretold
	}
	calibration := func(r *Router, name string, now time.Duration) float64 {
		r.decisions.mu.Lock()
		defer r.decisions.mu.Unlock()
		return r.decisions.origins[name].ratio(now)
	}
	other := map[string]string{"a": "b", "b": "a"}
	// Every burst at a: the half of the decisions that picked a found it.
	r, now, want := run(120, 1, func(string, int) string { return "a" })
	if c := calibration(r, "far", now); want <= 1.05 || want >= maxCalibration || c < want*0.99 || c > want*1.01 {
		t.Errorf("bursts all at a: calibration %.3f, want %.3f (within 1%%, between 1 and the bound)", c, want)
	}
	// As the router tells it (gorgo_mesh_calibration): over the half of
	// its decisions that picked a (b has no flow of far's: nothing
	// foretold there), one a second, decayed over calibrationTau: about 35.
	if cs := r.Calibrations(now); len(cs) != 1 || cs[0].Origin != "far" || cs[0].Ratio != calibration(r, "far", now) || cs[0].Decisions < 30 || cs[0].Decisions > 40 {
		t.Errorf("Calibrations: %+v, want far's alone at %.3f over 30–40 decisions", cs, calibration(r, "far", now))
	}
	for _, id := range []string{"a", "b"} {
		m, _ := r.member(id)
		raw := m.flows.unheard(now, time.Duration(m.rttNS.Load())/2, m.decisions, false)
		if got, want := m.view(now, 0).BacklogTokens-int(m.backlog.Load()), int(float64(raw)*calibration(r, "far", now)); got < want-1 || got > want+1 {
			t.Errorf("%s: %d tokens unheard in the view, want %d (%d learned, calibrated)", id, got, want, raw)
		}
	}
	// Five decisions an instant (three at one replica, two at the other)
	// for 600 ticks: each burst credits every decision of its window that
	// picked its replica.
	r, now, want = run(600, 5, func(string, int) string { return "a" })
	if c := calibration(r, "far", now); c < want*0.99 || c > want*1.01 {
		t.Errorf("five decisions an instant: calibration %.3f, want %.3f (within 1%%)", c, want)
	}
	// Always where it went: more than twice what the mean foretold, held
	// to the bound.
	if r, now, want := run(120, 1, func(picked string, _ int) string { return picked }); want <= maxCalibration || calibration(r, "far", now) != maxCalibration {
		t.Errorf("bursts always where the router's requests went: calibration %.3f, want the bound %d (%.3f counted)", calibration(r, "far", now), maxCalibration, want)
	}
	// Before ten decisions' windows have passed it is 1: five always
	// where it went, then fourteen.
	if r, now, _ := run(6, 1, func(picked string, _ int) string { return picked }); calibration(r, "far", now) != 1 {
		t.Errorf("five decisions: calibration %.3f, want 1 (fewer than %d)", calibration(r, "far", now), minPicks)
	}
	if r, now, _ := run(15, 1, func(picked string, _ int) string { return picked }); calibration(r, "far", now) != maxCalibration {
		t.Errorf("fourteen decisions: calibration %.3f, want the bound %d", calibration(r, "far", now), maxCalibration)
	}
	// Never where it went: nothing found where it foretold some: the bound.
	if r, now, _ := run(120, 1, func(picked string, _ int) string { return other[picked] }); calibration(r, "far", now) != 1.0/maxCalibration {
		t.Errorf("bursts never where the router's requests went: calibration %.3f, want the bound 1/%d", calibration(r, "far", now), maxCalibration)
	}
	// A router that decides nothing has foretold nothing: 1; nor does its
	// first decision scale what it counts (a review: one decision halved
	// it, before any news could come).
	idle := newRouter(t, "round-robin", 1, false)
	a, _ := idle.member("a")
	for k := range 60 {
		if _, ok := idle.Enter(time.Duration(k)*time.Second+far.Leg, "a", &policy.Request{PromptTokens: 1000, Blocks: blocks(uint64(k+1), 4)}, OutputKeys{}, far); !ok {
			t.Fatal("not entered")
		}
	}
	at := 60 * time.Second
	if c := calibration(idle, "far", at); c != 1 {
		t.Errorf("a router that decided nothing: calibration %.3f, want 1", c)
	}
	// Nor does a burst of its decisions at one instant, however many
	// (a review: past the first ten, the rest of a burst counted half,
	// before any news could come): each is pending until its window
	// has passed.
	before := a.unheard(at)
	for j := range 2 * maxPending {
		tk, err := idle.Route(at, &policy.Request{PromptTokens: 10, Blocks: blocks(uint64(9000+j), 1)}, rand.New(rand.NewPCG(1, 1)))
		if err != nil {
			t.Fatal(err)
		}
		idle.Finish(&tk)
		if after := a.unheard(at); after != before {
			t.Fatalf("decision %d of a burst at one instant moved the unheard tokens from %d to %d", j+1, before, after)
		}
	}
}

// A router deciding faster than maxPending times a window keeps a sample
// of its decisions pending, each counting for those it stands for: it
// calibrates as they all would. Before, past the bound the oldest were
// dropped before they were due: only the last maxPending before a lull
// counted (here 1.64 where 1.54 was found; 1.32 for 1.52 at 200 a
// millisecond), and none at a rate that never lulls (the ratio stayed 1).
func TestAFastRouterCalibratesOnASample(t *testing.T) {
	r := newRouter(t, "round-robin", 2, false)
	far := Origin{Name: "far", Leg: 45 * time.Millisecond}
	m, half := map[string]*member{}, map[string]time.Duration{}
	for _, id := range []string{"a", "b"} {
		m[id], _ = r.member(id)
		half[id] = time.Duration(m[id].rttNS.Load()) / 2 // windows of 50 and 55 ms
	}
	other := map[string]string{"a": "b", "b": "a"}
	// Each tick (a second apart) for its first 100 ms, 41 decisions a
	// millisecond (2,050 in a window at a), three in four at the replica
	// where the other sends 100 tokens every 10 ms in that tick (a, then
	// b): they find about five of those where the learned mean, over all
	// decisions, is about half that at each. The test counts what each
	// decision found (the dispatches sent from a leg before it to its own
	// one-way after it) and foretold (the learned count as it decided),
	// decayed over calibrationTau to the end.
	const ticks, perMS = 60, 41
	end := ticks * time.Second
	var found, foretold, picks float64
	most := 0 // pending at most
	for k := range ticks {
		tick := time.Duration(k) * time.Second
		to := []string{"a", "b"}[k%2]
		var sent []time.Duration
		for ms := 0; ms < 100; ms += 10 {
			sent = append(sent, tick+time.Duration(ms)*time.Millisecond)
		}
		for ms := range 100 {
			now := tick + time.Duration(ms)*time.Millisecond
			if heard := now - far.Leg; ms >= 45 && (heard-tick)%(10*time.Millisecond) == 0 {
				if _, ok := r.Enter(now, to, &policy.Request{PromptTokens: 100, Blocks: blocks(uint64(1+now/time.Millisecond), 1)}, OutputKeys{}, far); !ok {
					t.Fatal("not entered")
				}
			}
			for j := range perMS {
				picked := to
				if j%4 == 3 {
					picked = other[to]
				}
				r.decisions.add(now) // as Dispatch does, once meshed
				fs := &m[picked].flows
				if fs.n.Load() == 0 {
					m[picked].pickedAt(now) // no flow there yet: nothing foretold
					continue
				}
				fs.mu.Lock()
				r.decisions.mu.Lock()
				learned := fs.learned(&fs.by[0], now, half[picked], &r.decisions) * decay(fs.at, now)
				r.decisions.mu.Unlock()
				fs.mu.Unlock()
				m[picked].pickedAt(now)
				r.decisions.mu.Lock()
				if c := r.decisions.origins["far"]; c != nil {
					most = max(most, len(c.pending)-c.head)
				}
				r.decisions.mu.Unlock()
				fade := math.Exp(-float64(end-now) / float64(calibrationTau))
				picks += fade
				foretold += learned * fade
				if picked == to {
					for _, s := range sent {
						if s > now-far.Leg && s <= now+half[picked] {
							found += 100 * fade
						}
					}
				}
			}
		}
		// The rest of the tick's news.
		for _, s := range sent {
			if s+far.Leg >= tick+100*time.Millisecond {
				if _, ok := r.Enter(s+far.Leg, to, &policy.Request{PromptTokens: 100, Blocks: blocks(uint64(1+(s+far.Leg)/time.Millisecond), 1)}, OutputKeys{}, far); !ok {
					t.Fatal("not entered")
				}
			}
		}
	}
	r.decisions.mu.Lock()
	defer r.decisions.mu.Unlock()
	c := r.decisions.origins["far"]
	if want, got := found/foretold, c.ratio(end); want < 1.3 || got < want*0.995 || got > want*1.005 {
		t.Errorf("calibration %.4f, want %.4f (within 0.5%%)", got, want)
	}
	if c.picks < picks*0.99 || c.picks > picks*1.01 {
		t.Errorf("the sample counts for %.0f decisions (decayed), want %.0f (within 1%%)", c.picks, picks)
	}
	if most > maxPending || most < maxPending/2 {
		t.Errorf("at most %d decisions pending, want up to %d (and a sample kept)", most, maxPending)
	}
}

// A sample's stride does not outlast the decisions it was for: after a
// lull the first decisions count for one each, and minPicks still holds
// (a review: a stride of 64 left from a burst let two decisions count
// for 16 and set the ratio).
func TestASampleEndsWithItsBurst(t *testing.T) {
	for offset := range 50 {
		c := &calibration{}
		var fs flows
		var now time.Duration
		for range 40_000 + offset { // 40,000 decisions in one window
			now += time.Microsecond
			c.foretell(pick{replica: &fs, at: now, due: now + 50*time.Millisecond, found: 10, foretold: 10})
		}
		if c.stride < 16 {
			t.Fatalf("offset %d: a burst of 40,000 sampled at a stride of %d, want at least 16", offset, c.stride)
		}
		now += 2000 * time.Second // the burst's decisions fade to nothing
		for range 2 {             // two decisions that found twice what they foretold
			now += time.Millisecond
			c.foretell(pick{replica: &fs, at: now, due: now + 50*time.Millisecond, found: 20, foretold: 10})
		}
		if r := c.ratio(now + time.Second); r != 1 {
			t.Fatalf("offset %d: two decisions after a lull count for %.0f and set the ratio to %.2f, want 1 (fewer than %d)", offset, c.picks, r, minPicks)
		}
	}
}

// An evicted calibration stays readable through its flows (a review: its
// pending list went and its head stayed, and the next read of its
// replica's unheard tokens panicked).
func TestAnEvictedCalibrationIsRead(t *testing.T) {
	r := newRouter(t, "round-robin", 4, false)
	rng := rand.New(rand.NewPCG(1, 1))
	for j := range maxOrigins {
		from := Origin{Name: fmt.Sprint("o", j), Leg: 45 * time.Millisecond}
		if _, ok := r.Enter(0, id(j%4), &policy.Request{PromptTokens: 100, Blocks: blocks(uint64(1+j), 1)}, OutputKeys{}, from); !ok {
			t.Fatal("not entered")
		}
	}
	// Decisions pending at each origin, some settled (a head past 0).
	now := time.Duration(0)
	for ; now <= 120*time.Millisecond; now += time.Millisecond {
		tk, err := r.Route(now, &policy.Request{PromptTokens: 10, Blocks: blocks(uint64(1<<20+int(now/time.Millisecond)), 1)}, rng)
		if err != nil {
			t.Fatal(err)
		}
		r.Finish(&tk)
	}
	if _, ok := r.Enter(now, "a", &policy.Request{PromptTokens: 100, Blocks: blocks(1<<30, 1)}, OutputKeys{}, Origin{Name: "new", Leg: 45 * time.Millisecond}); !ok {
		t.Fatal("not entered")
	}
	for i := range 4 {
		if _, err := r.Unheard(now, id(i)); err != nil {
			t.Fatal(err)
		}
	}
	for j := range maxOrigins { // the evicted origin's next dispatch
		if _, ok := r.Enter(now+time.Millisecond, id(j%4), &policy.Request{PromptTokens: 100, Blocks: blocks(uint64(1<<31+j), 1)}, OutputKeys{}, Origin{Name: fmt.Sprint("o", j), Leg: 45 * time.Millisecond}); !ok {
			t.Fatal("not entered")
		}
	}
}

// Past maxOrigins the calibration with the fewest decisions (decayed)
// makes room: an origin this router has decided with keeps its own
// against made-up names (a review: compared undecayed, and a made-up name
// starting at none, they evicted an honest origin's).
func TestCalibrationsAreBounded(t *testing.T) {
	r := newRouter(t, "round-robin", 1, false)
	honest := Origin{Name: "honest", Leg: 45 * time.Millisecond}
	rng := rand.New(rand.NewPCG(1, 1))
	var now time.Duration
	for k := range 30 {
		now = time.Duration(k) * time.Second
		tk, err := r.Route(now, &policy.Request{PromptTokens: 10, Blocks: blocks(uint64(5000+k), 1)}, rng)
		if err != nil {
			t.Fatal(err)
		}
		r.Finish(&tk)
		if _, ok := r.Enter(now+honest.Leg, "a", &policy.Request{PromptTokens: 1000, Blocks: blocks(uint64(k+1), 4)}, OutputKeys{}, honest); !ok {
			t.Fatal("not entered")
		}
	}
	held := r.decisions.origins["honest"]
	for j := range 3 * maxOrigins {
		from := Origin{Name: fmt.Sprintf("made-up-%d", j), Leg: 45 * time.Millisecond}
		if _, ok := r.Enter(now+time.Second, "a", &policy.Request{PromptTokens: 10, Blocks: blocks(uint64(1<<20+j), 1)}, OutputKeys{}, from); !ok {
			t.Fatal("not entered")
		}
	}
	if n := len(r.decisions.origins); n > maxOrigins {
		t.Errorf("%d calibrations kept, want at most %d", n, maxOrigins)
	}
	if got := r.decisions.origins["honest"]; got != held {
		t.Error("the honest origin's calibration was evicted by made-up names")
	}
}

// An origin's dispatches calibrate its own flows alone: one dispatch of a
// huge prompt from a new origin (a hostile or broken peer; a review saw
// it halve every other origin's unheard tokens for minutes) leaves the
// others' calibration, and what the router counts of them, as it was.
func TestAnOriginCalibratesItsOwnFlowsAlone(t *testing.T) {
	r := newRouter(t, "round-robin", 2, false)
	a, _ := r.member("a")
	rng := rand.New(rand.NewPCG(1, 1))
	honest, hostile := Origin{Name: "honest", Leg: 45 * time.Millisecond}, Origin{Name: "hostile", Leg: 45 * time.Millisecond}
	var before int
	for k := range 4000 { // 400 s, a decision and an honest burst at each replica every 100 ms
		now := time.Duration(k) * 100 * time.Millisecond
		tk, err := r.Route(now, &policy.Request{PromptTokens: 10, Blocks: blocks(uint64(100000+k), 1)}, rng)
		if err != nil {
			t.Fatal(err)
		}
		r.Finish(&tk)
		for _, id := range []string{"a", "b"} {
			if _, ok := r.Enter(now+honest.Leg, id, &policy.Request{PromptTokens: 1000, Blocks: blocks(uint64(2*k+1), 4)}, OutputKeys{}, honest); !ok {
				t.Fatal("not entered")
			}
		}
		switch k {
		case 2999:
			before = a.unheard(now + 50*time.Millisecond)
		case 3000:
			if _, ok := r.Enter(now+hostile.Leg, "b", &policy.Request{PromptTokens: 1 << 24, Blocks: blocks(1<<20, 4)}, OutputKeys{}, hostile); !ok {
				t.Fatal("not entered")
			}
		}
	}
	after := a.unheard(400*time.Second - 50*time.Millisecond)
	if lo, hi := before*9/10, before*11/10; after < lo || after > hi {
		t.Errorf("a, which the hostile origin never sent to: %d tokens unheard 100 s after its one huge dispatch at b, %d before; want within 10%%", after, before)
	}
}
