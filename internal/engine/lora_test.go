package engine

import (
	"slices"
	"testing"
	"time"
)

// areq is req with an adapter.
func areq(id, base uint64, prompt, output int, adapter uint64) Request {
	r := req(id, base, prompt, output)
	r.Adapter = adapter
	return r
}

func submitAll(t *testing.T, e *Engine, now time.Duration, rs ...Request) {
	t.Helper()
	for _, r := range rs {
		if err := e.Submit(now, r); err != nil {
			t.Fatal(err)
		}
	}
}

func resident(e *Engine) []uint64 { return e.ResidentAdapters(nil) }

func adapters(e *Engine) (running, waiting []uint64) { return e.Adapters(nil, nil) }

// Loading an adapter lengthens the step that admits its request, once per
// adapter loaded in the step; a resident adapter loads nothing.
func TestLoRALoadAddsToStep(t *testing.T) {
	const load = 50 * time.Millisecond
	e := newEngine(t, Config{MaxLoRAs: 2, LoRALoadTime: load})
	if e.MaxLoRAs() != 2 {
		t.Fatalf("MaxLoRAs() = %d", e.MaxLoRAs())
	}
	p := e.prof
	submitAll(t, e, 0, areq(1, 1, 100, 1, 7))
	evs := run(t, e)
	t1 := p.StepTime(100, 0, 0) + load
	if got := find(evs, 1, EventFirstToken).Time; got != t1 {
		t.Fatalf("first token with a load at %v, want %v", got, t1)
	}
	// The same adapter again: resident, no load.
	start := time.Second
	submitAll(t, e, start, areq(2, 2, 100, 1, 7))
	evs = run(t, e)
	if got, want := find(evs, 2, EventFirstToken).Time, start+p.StepTime(100, 0, 0); got != want {
		t.Fatalf("first token with the adapter resident at %v, want %v", got, want)
	}
	// Two new adapters in one step: two loads; the second takes the place
	// of 7, which no running request holds.
	start = 2 * time.Second
	submitAll(t, e, start, areq(3, 3, 100, 1, 8), areq(4, 4, 100, 1, 9), Request{ID: 5, PromptTokens: 100, OutputTokens: 1, Blocks: blocks(5, 1)})
	evs = run(t, e)
	want := start + p.StepTime(300, 0, 0) + 2*load
	for id := uint64(3); id <= 5; id++ {
		if got := find(evs, id, EventFirstToken).Time; got != want {
			t.Errorf("request %d: first token at %v, want %v (one step, two loads)", id, got, want)
		}
	}
	if got := resident(e); !slices.Equal(got, []uint64{9, 8}) {
		t.Errorf("resident %v, want [9 8]", got)
	}
	g := e.Gauges()
	if g.AdapterRequests != 4 || g.AdapterLoads != 3 || g.Admitted != 5 {
		t.Errorf("adapter requests %d, loads %d, admitted %d; want 4, 3, 5", g.AdapterRequests, g.AdapterLoads, g.Admitted)
	}
}

// A waiting request whose adapter cannot be made resident is skipped, and
// the ones behind it are admitted; the skipped ones keep their order and
// go once a slot frees.
func TestLoRASkipAhead(t *testing.T) {
	const load = 10 * time.Millisecond
	e := newEngine(t, Config{MaxLoRAs: 1, LoRALoadTime: load})
	p := e.prof
	submitAll(t, e, 0,
		areq(1, 1, 100, 3, 1), // A: loads 1
		areq(2, 2, 100, 1, 2), // B: skipped (the one slot is A's)
		areq(3, 3, 100, 1, 3), // E: skipped
		areq(4, 4, 100, 3, 1), // C: runs beside A
		req(5, 5, 100, 1),     // D: the base model
	)
	e.Advance(0, nil)
	if g := e.Gauges(); g.Running != 3 || g.Waiting != 2 || g.WaitingTokens != 200 {
		t.Fatalf("running %d waiting %d (%d tokens), want 3 and 2 (200)", g.Running, g.Waiting, g.WaitingTokens)
	}
	rn, wt := adapters(e)
	if !slices.Equal(rn, []uint64{1}) || !slices.Equal(wt, []uint64{2, 3}) {
		t.Fatalf("Adapters() = %v, %v; want [1], [2 3]", rn, wt)
	}
	evs := run(t, e)
	t1 := p.StepTime(300, 0, 0) + load // A, C, D prefill; adapter 1 loads
	for _, id := range []uint64{1, 4, 5} {
		if got := find(evs, id, EventFirstToken).Time; got != t1 {
			t.Errorf("request %d: first token at %v, want %v", id, got, t1)
		}
	}
	// D finishes at once; A and C decode twice, blocking B and E all along.
	t2 := t1 + p.StepTime(0, 2, 202)
	t3 := t2 + p.StepTime(0, 2, 204)
	if got := find(evs, 1, EventFinish).Time; got != t3 {
		t.Errorf("A finished at %v, want %v", got, t3)
	}
	// B then loads 2 (evicting 1); E waits for B to finish, then loads 3.
	t4 := t3 + p.StepTime(100, 0, 0) + load
	t5 := t4 + p.StepTime(100, 0, 0) + load
	if got := find(evs, 2, EventFirstToken).Time; got != t4 {
		t.Errorf("B's first token at %v, want %v", got, t4)
	}
	if got := find(evs, 3, EventFirstToken).Time; got != t5 {
		t.Errorf("E's first token at %v, want %v", got, t5)
	}
	if g := e.Gauges(); g.AdapterRequests != 4 || g.AdapterLoads != 3 {
		t.Errorf("adapter requests %d loads %d, want 4 and 3", g.AdapterRequests, g.AdapterLoads)
	}
	if got := resident(e); !slices.Equal(got, []uint64{3}) {
		t.Errorf("resident %v, want [3]", got)
	}
}

// The least recently used adapter is evicted; use is admission and a
// request leaving.
func TestLoRALRUEviction(t *testing.T) {
	e := newEngine(t, Config{MaxLoRAs: 2, LoRALoadTime: time.Millisecond})
	now := time.Duration(0)
	for i, a := range []uint64{1, 2, 1, 3} {
		submitAll(t, e, now, areq(uint64(i), uint64(i), 100, 2, a))
		evs := run(t, e)
		now = find(evs, uint64(i), EventFinish).Time + time.Second
	}
	if got := resident(e); !slices.Equal(got, []uint64{3, 1}) {
		t.Errorf("resident %v, want [3 1] (2 least recently used)", got)
	}
	if g := e.Gauges(); g.AdapterLoads != 3 || g.AdapterRequests != 4 {
		t.Errorf("loads %d requests %d, want 3 and 4", g.AdapterLoads, g.AdapterRequests)
	}
}

// An adapter a running request uses is never evicted, however long ago it
// was loaded; a request for a third adapter waits for a slot to unpin,
// and a cancelled request unpins its adapter.
func TestLoRAPinning(t *testing.T) {
	const load = 20 * time.Millisecond
	e := newEngine(t, Config{MaxLoRAs: 2, LoRALoadTime: load})
	p := e.prof
	submitAll(t, e, 0, areq(1, 1, 100, 100, 2), areq(2, 2, 100, 2, 1))
	e.Advance(0, nil)
	if got := resident(e); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("resident %v, want [1 2]", got)
	}
	t1 := p.StepTime(200, 0, 0) + 2*load
	// A request for adapter 3 arrives while both are pinned: it waits
	// although the KV cache has room, and a base request passes it.
	submitAll(t, e, t1, areq(3, 3, 100, 1, 3), req(4, 4, 100, 1))
	evs := e.Advance(t1, nil)
	if find(evs, 1, EventFirstToken).Time != t1 || find(evs, 2, EventFirstToken).Time != t1 {
		t.Fatalf("first tokens %+v, want at %v", evs, t1)
	}
	// The step from t1 prefills request 4 (prefill-first) and skips 3.
	t2 := t1 + p.StepTime(100, 0, 0)
	evs = e.Advance(t2, nil)
	if find(evs, 4, EventFirstToken).Time != t2 {
		t.Fatalf("base request: %+v, want its first token at %v", evs, t2)
	}
	if g := e.Gauges(); g.Waiting != 1 {
		t.Fatalf("waiting %d, want request 3", g.Waiting)
	}
	// Request 2 (adapter 1) decodes its last token; then 3 evicts 1, not
	// 2, the less recently used but pinned.
	t3 := t2 + p.StepTime(0, 2, 202)
	evs = e.Advance(t3, nil)
	if find(evs, 2, EventFinish).Time != t3 {
		t.Fatalf("request 2: %+v, want its finish at %v", evs, t3)
	}
	t4 := t3 + p.StepTime(100, 0, 0) + load
	evs = e.Advance(t4, nil)
	if find(evs, 3, EventFirstToken).Time != t4 {
		t.Fatalf("request 3: %+v, want its first token at %v", evs, t4)
	}
	if got := resident(e); !slices.Equal(got, []uint64{3, 2}) {
		t.Errorf("resident %v, want [3 2]", got)
	}
	// Cancelling request 1 unpins 2: a request for 4 then takes its slot.
	if !e.Cancel(1) {
		t.Fatal("cancel: not found")
	}
	if rn, _ := adapters(e); len(rn) != 0 {
		t.Errorf("running adapters after the cancel: %v", rn)
	}
	// The cancel was 2's last use: 3 is now the least recently used.
	submitAll(t, e, t4, areq(5, 5, 100, 1, 4))
	run(t, e)
	if got := resident(e); !slices.Equal(got, []uint64{4, 2}) {
		t.Errorf("resident %v, want [4 2]", got)
	}
}

// The adapters of the running and waiting requests, distinct, appended.
func TestAdaptersDistinct(t *testing.T) {
	e := newEngine(t, Config{MaxLoRAs: 2})
	submitAll(t, e, 0, areq(1, 1, 100, 10, 9), areq(2, 2, 100, 10, 5), areq(3, 3, 100, 10, 9),
		req(4, 4, 100, 10), areq(5, 5, 100, 10, 7), areq(6, 6, 100, 10, 8), areq(7, 7, 100, 10, 7))
	e.Advance(0, nil)
	rn, wt := e.Adapters([]uint64{42}, []uint64{43})
	if !slices.Equal(rn, []uint64{42, 5, 9}) || !slices.Equal(wt, []uint64{43, 7, 8}) {
		t.Errorf("Adapters = %v, %v; want [42 5 9], [43 7 8]", rn, wt)
	}
	if got := e.ResidentAdapters([]uint64{1}); !slices.Equal(got, []uint64{1, 9, 5}) {
		t.Errorf("ResidentAdapters = %v, want [1 9 5]", got)
	}
}

// Without adapters the defaults hold and nothing is counted.
func TestLoRADefaultsAndBaseOnly(t *testing.T) {
	e := newEngine(t, Config{})
	if e.MaxLoRAs() != DefaultMaxLoRAs {
		t.Errorf("MaxLoRAs() = %d, want %d", e.MaxLoRAs(), DefaultMaxLoRAs)
	}
	submitAll(t, e, 0, req(1, 1, 100, 2))
	run(t, e)
	if g := e.Gauges(); g.AdapterRequests != 0 || g.AdapterLoads != 0 || len(resident(e)) != 0 {
		t.Errorf("base-only engine: %+v, resident %v", g, resident(e))
	}
	if _, err := New(Config{Profile: paperProfile(t), MaxLoRAs: -1}); err == nil {
		t.Error("negative MaxLoRAs accepted")
	}
	if _, err := New(Config{Profile: paperProfile(t), LoRALoadTime: -time.Second}); err == nil {
		t.Error("negative LoRALoadTime accepted")
	}
}

// A clone has its own adapter slots: what it loads and evicts leaves the
// original's alone, and both run exactly as references would.
func TestLoRACloneIsIndependent(t *testing.T) {
	cfg := Config{MaxLoRAs: 2, LoRALoadTime: 5 * time.Millisecond}
	setup := func() *Engine {
		e := newEngine(t, cfg)
		submitAll(t, e, 0, areq(1, 1, 100, 20, 1), areq(2, 2, 100, 1, 2), areq(3, 3, 100, 5, 3), req(4, 4, 100, 5))
		e.Advance(30*time.Millisecond, nil) // mid-step: 1 and 2 loaded, 3 waiting
		return e
	}
	extra := func(e *Engine) { submitAll(t, e, 30*time.Millisecond, areq(99, 9, 100, 1, 4), areq(98, 8, 100, 1, 5)) }
	e := setup()
	before := resident(e)
	if !slices.Equal(before, []uint64{2, 1}) {
		t.Fatalf("resident %v, want [2 1]", before)
	}
	withExtra := setup()
	extra(withExtra)
	want := run(t, withExtra)
	var scratch *Engine
	for round := range 2 { // the second round reuses the clone's storage
		c := e.Clone(scratch)
		scratch = c
		if got := resident(c); !slices.Equal(got, before) {
			t.Fatalf("round %d: clone's resident %v, original's %v", round, got, before)
		}
		extra(c)
		if got := run(t, c); !slices.Equal(got, want) {
			t.Fatalf("round %d: clone emitted %v, reference %v", round, got, want)
		}
		if c.Gauges() != withExtra.Gauges() || !slices.Equal(resident(c), resident(withExtra)) {
			t.Errorf("round %d: clone %+v %v, reference %+v %v", round, c.Gauges(), resident(c), withExtra.Gauges(), resident(withExtra))
		}
		if got := resident(e); !slices.Equal(got, before) {
			t.Fatalf("round %d: the clone's loads changed the original's slots: %v, was %v", round, got, before)
		}
	}
	ref := setup()
	a, b := run(t, e), run(t, ref)
	if !slices.Equal(a, b) {
		t.Fatalf("original after cloning emitted %v, reference %v", a, b)
	}
	if !slices.Equal(resident(e), resident(ref)) || e.Gauges() != ref.Gauges() {
		t.Errorf("original %v %+v, reference %v %+v", resident(e), e.Gauges(), resident(ref), ref.Gauges())
	}
}

// Adapters cost no allocation: a workload with adapters allocates what
// the same workload without them does (the requests' own storage).
func TestLoRANoAllocation(t *testing.T) {
	allocs := func(withAdapters bool) float64 {
		e := newEngine(t, Config{MaxLoRAs: 2, LoRALoadTime: time.Millisecond})
		reqs := make([]Request, 8)
		for i := range reqs {
			reqs[i] = req(0, uint64(i), 64, 2)
			if withAdapters {
				reqs[i].Adapter = uint64(i%3 + 1)
			}
		}
		var out []Event
		var running, waiting, res []uint64
		now := time.Duration(0)
		id := uint64(0)
		cycle := func() {
			for _, r := range reqs {
				id++
				r.ID = id
				if err := e.Submit(now, r); err != nil {
					t.Fatal(err)
				}
			}
			for {
				next, ok := e.Next()
				if !ok {
					break
				}
				out = e.Advance(next, out[:0])
				running, waiting = e.Adapters(running[:0], waiting[:0])
				res = e.ResidentAdapters(res[:0])
				now = next
			}
		}
		for range 20 {
			cycle()
		}
		return testing.AllocsPerRun(20, cycle)
	}
	if with, without := allocs(true), allocs(false); with > without {
		t.Errorf("%.1f allocations per cycle with adapters, %.1f without", with, without)
	}
}
