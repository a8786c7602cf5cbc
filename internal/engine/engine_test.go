package engine

import (
	"errors"
	"testing"
	"time"
)

func paperProfile(t testing.TB) Profile {
	t.Helper()
	p, err := LookupProfile("paper")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	if cfg.Profile.Name == "" {
		cfg.Profile = paperProfile(t)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// blocks returns n chained block ids starting at base: ids are unique per
// (base, position), so two prompts share a prefix iff they share a base.
func blocks(base uint64, n int) []uint64 {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = base<<20 | uint64(i)
	}
	return ids
}

func req(id uint64, base uint64, prompt, output int) Request {
	return Request{ID: id, PromptTokens: prompt, OutputTokens: output, Blocks: blocks(base, (prompt+511)/512)}
}

// run advances the engine until it is idle and returns every event.
func run(t testing.TB, e *Engine) []Event {
	t.Helper()
	var out []Event
	for i := 0; ; i++ {
		next, ok := e.Next()
		if !ok {
			return out
		}
		if i > 1e6 {
			t.Fatal("engine did not go idle")
		}
		out = e.Advance(next, out)
	}
}

func find(evs []Event, id uint64, kind EventKind) Event {
	for _, ev := range evs {
		if ev.ID == id && ev.Kind == kind {
			return ev
		}
	}
	return Event{}
}

func TestLoneRequestTTFTIsPrefillTime(t *testing.T) {
	e := newEngine(t, Config{})
	start := 5 * time.Second
	if err := e.Submit(start, req(1, 1, 6000, 4)); err != nil {
		t.Fatal(err)
	}
	evs := run(t, e)
	first := find(evs, 1, EventFirstToken)
	// Two chunks (4096 + 1904 tokens) of b0 + 60 us/token.
	want := (9000+60*4096)*time.Microsecond + (9000+60*1904)*time.Microsecond
	if got := first.Time - start; got != want {
		t.Errorf("TTFT = %v, want %v", got, want)
	}
	if got := e.prof.PrefillTime(6000); got != want {
		t.Errorf("PrefillTime(6000) = %v, want %v", got, want)
	}
	if first.CachedTokens != 0 {
		t.Errorf("cold cache reported %d cached tokens", first.CachedTokens)
	}
	// Three decode steps of one sequence holding 6001..6003 tokens.
	fin := find(evs, 1, EventFinish)
	var dec time.Duration
	for ctx := 6001; ctx <= 6003; ctx++ {
		dec += e.prof.StepTime(0, 1, ctx)
	}
	if got := fin.Time - first.Time; got != dec || fin.Generated != 4 {
		t.Errorf("decode took %v for %d tokens, want %v for 4", got, fin.Generated, dec)
	}
}

func TestRepeatedPromptHitsCache(t *testing.T) {
	e := newEngine(t, Config{})
	if err := e.Submit(0, req(1, 7, 6000, 2)); err != nil {
		t.Fatal(err)
	}
	evs := run(t, e)
	end := find(evs, 1, EventFinish).Time
	if err := e.Submit(end+time.Second, req(2, 7, 6000, 2)); err != nil {
		t.Fatal(err)
	}
	evs = run(t, e)
	first := find(evs, 2, EventFirstToken)
	// Every block is cached, but the last token is always computed.
	if first.CachedTokens != 5999 {
		t.Errorf("cached = %d, want 5999", first.CachedTokens)
	}
	if got, want := first.Time-(end+time.Second), e.prof.StepTime(1, 0, 0); got != want {
		t.Errorf("TTFT of a cached prompt = %v, want one 1-token step %v", got, want)
	}
	// A prompt sharing the first 5 blocks then diverging hits 5 blocks.
	r := req(3, 7, 4000, 1)
	r.Blocks[5], r.Blocks[6], r.Blocks[7] = 99, 98, 97
	if err := e.Submit(first.Time+time.Second, r); err != nil {
		t.Fatal(err)
	}
	evs = run(t, e)
	if got := find(evs, 3, EventFirstToken).CachedTokens; got != 5*512 {
		t.Errorf("shared prefix: cached = %d, want %d", got, 5*512)
	}
	g := e.Gauges()
	if g.PromptTokens != 16000 || g.CachedTokens != 5999+2560 {
		t.Errorf("counters: prompt %d cached %d", g.PromptTokens, g.CachedTokens)
	}
}

func TestEvictionRespectsCapacity(t *testing.T) {
	// Ten blocks of 512 tokens; each request holds four blocks of prompt
	// and one of output while running.
	e := newEngine(t, Config{KVCapacityTokens: 10 * 512})
	now := time.Duration(0)
	submit := func(id, base uint64) Event {
		t.Helper()
		if err := e.Submit(now, req(id, base, 4*512, 10)); err != nil {
			t.Fatal(err)
		}
		for {
			next, ok := e.Next()
			if !ok {
				break
			}
			evs := e.Advance(next, nil)
			if used := e.Gauges().KVUsedTokens; used > 10*512 {
				t.Fatalf("KV used %d tokens > capacity %d", used, 10*512)
			}
			now = next
			if ev := find(evs, id, EventFinish); ev.Kind != 0 {
				return ev
			}
		}
		t.Fatalf("request %d did not finish", id)
		return Event{}
	}
	submit(1, 1) // cache: A
	submit(2, 2) // cache: A B (8 blocks)
	submit(1, 1) // touch A: B is now least recently used
	if ev := submit(3, 3); ev.CachedTokens != 0 {
		t.Fatalf("new prompt C hit %d tokens", ev.CachedTokens)
	}
	// C needed 5 blocks: 2 free and 3 evicted from B (the least recently
	// used prompt), its last blocks first. A is untouched.
	if got := e.CachedPrefix(blocks(1, 4), 2048); got != 2048 {
		t.Errorf("A cached prefix = %d, want 2048 (recently used)", got)
	}
	if got := e.CachedPrefix(blocks(2, 4), 2048); got != 512 {
		t.Errorf("B cached prefix = %d, want 512 (three tail blocks evicted)", got)
	}
	if used := e.Gauges().KVUsedTokens; used != 9*512 {
		t.Errorf("idle KV used = %d tokens, want 9 blocks (A, B's first, C)", used)
	}
}

func TestEvictionDropsSuffixBeforePrefix(t *testing.T) {
	e := newEngine(t, Config{KVCapacityTokens: 6 * 512})
	if err := e.Submit(0, req(1, 1, 4*512, 1)); err != nil {
		t.Fatal(err)
	}
	run(t, e)
	// A 2-block prompt plus output needs 3 blocks: 2 free + 1 evicted,
	// which must be A's last block, not its first.
	if err := e.Submit(time.Second, req(2, 2, 2*512, 512)); err != nil {
		t.Fatal(err)
	}
	e.Advance(time.Second, nil)
	if got := e.CachedPrefix(blocks(1, 4), 4*512); got != 3*512 {
		t.Errorf("A's cached prefix after one eviction = %d, want %d", got, 3*512)
	}
}

func TestChunkedPrefillInterleavesWithDecodes(t *testing.T) {
	p := paperProfile(t)
	p.Schedule = ScheduleMixed
	e := newEngine(t, Config{Profile: p, TokenEvents: true, ChunkTokens: 1000})
	if err := e.Submit(0, req(1, 1, 100, 50)); err != nil {
		t.Fatal(err)
	}
	first := e.Advance(e.prof.StepTime(100, 0, 0), nil)
	if len(first) != 1 || first[0].Kind != EventFirstToken {
		t.Fatalf("after one step: %+v", first)
	}
	// A's first decode step started as soon as its prefill ended; B,
	// arriving meanwhile, waits for the next step boundary.
	t0 := first[0].Time
	if err := e.Submit(t0, req(2, 2, 3500, 1)); err != nil {
		t.Fatal(err)
	}
	now := t0 + e.prof.StepTime(0, 1, 101)
	if a := find(e.Advance(now, nil), 1, EventToken); a.Generated != 2 || a.Time != now {
		t.Fatalf("A's second token %+v, want at %v", a, now)
	}
	// B's 3500 tokens take four chunks; A decodes one token in each step, and
	// the decode takes one token of the 1000-token budget.
	chunks := []int{999, 999, 999, 503}
	for i, c := range chunks {
		step := e.prof.StepTime(c, 1, 100+2+i)
		now += step
		evs := e.Advance(now, nil)
		a := find(evs, 1, EventToken)
		if a.Time != now || a.Generated != 3+i {
			t.Fatalf("step %d: A's token %+v, want generated %d at %v", i, a, 3+i, now)
		}
		b := find(evs, 2, EventFirstToken)
		if done := i == len(chunks)-1; (b.Kind != 0) != done {
			t.Fatalf("step %d: B first token %+v, prefill done = %v", i, b, done)
		}
	}
	if g := e.Gauges(); g.PrefillTokens != 0 || g.Running != 1 {
		t.Errorf("gauges after B: %+v", g)
	}
}

func TestAdmissionWaitsForKV(t *testing.T) {
	e := newEngine(t, Config{KVCapacityTokens: 8 * 512})
	if err := e.Submit(0, req(1, 1, 5*512, 100)); err != nil {
		t.Fatal(err)
	}
	if err := e.Submit(0, req(2, 2, 4*512, 1)); err != nil {
		t.Fatal(err)
	}
	e.Advance(0, nil)
	if g := e.Gauges(); g.Running != 1 || g.Waiting != 1 {
		t.Fatalf("running %d waiting %d, want 1 and 1 (B does not fit beside A)", g.Running, g.Waiting)
	}
	evs := run(t, e)
	if a, b := find(evs, 1, EventFinish), find(evs, 2, EventFirstToken); b.Time <= a.Time {
		t.Errorf("B started at %v before A finished at %v", b.Time, a.Time)
	}
}

func TestMaxRunning(t *testing.T) {
	e := newEngine(t, Config{MaxRunning: 2})
	for i := range uint64(5) {
		if err := e.Submit(0, req(i, i, 100, 10)); err != nil {
			t.Fatal(err)
		}
	}
	e.Advance(0, nil)
	if g := e.Gauges(); g.Running != 2 || g.Waiting != 3 {
		t.Fatalf("running %d waiting %d, want 2 and 3", g.Running, g.Waiting)
	}
	evs := run(t, e)
	n := 0
	for _, ev := range evs {
		if ev.Kind == EventFinish {
			n++
		}
	}
	if n != 5 {
		t.Errorf("%d finished, want 5", n)
	}
}

func TestSubmitErrors(t *testing.T) {
	e := newEngine(t, Config{MaxWaiting: 1, KVCapacityTokens: 4 * 512})
	cases := []struct {
		name string
		r    Request
		want error
	}{
		{"empty prompt", Request{ID: 1}, ErrInvalid},
		{"block count", Request{ID: 1, PromptTokens: 1000, Blocks: []uint64{1}}, ErrInvalid},
		{"beyond KV", req(1, 1, 4*512, 1), ErrTooLarge},
		{"beyond context", req(1, 1, 1000, 300000), ErrTooLarge},
	}
	for _, c := range cases {
		if err := e.Submit(0, c.r); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	if err := e.Submit(0, req(1, 1, 100, 1)); err != nil {
		t.Fatal(err)
	}
	if err := e.Submit(0, req(2, 2, 100, 1)); !errors.Is(err, ErrQueueFull) {
		t.Errorf("second waiting request: err = %v, want ErrQueueFull", err)
	}
}

func TestCancelFreesEverything(t *testing.T) {
	e := newEngine(t, Config{})
	for i := range uint64(3) {
		if err := e.Submit(0, req(i, i, 5000, 100)); err != nil {
			t.Fatal(err)
		}
	}
	e.Advance(0, nil)
	for i := range uint64(3) {
		if !e.Cancel(i) {
			t.Errorf("cancel %d: not found", i)
		}
	}
	if e.Cancel(9) {
		t.Error("cancel of an unknown id succeeded")
	}
	w := newEngine(t, Config{})
	if err := w.Submit(time.Second, req(1, 1, 100, 1)); err != nil {
		t.Fatal(err)
	}
	w.Cancel(1)
	if _, ok := w.Next(); ok {
		t.Error("an idle engine whose only request was cancelled still wants to wake")
	}
	run(t, e)
	g := e.Gauges()
	if g.Running != 0 || g.Waiting != 0 || g.KVUsedTokens != 0 || g.PrefillTokens != 0 || g.WaitingTokens != 0 {
		t.Errorf("after cancelling everything: %+v", g)
	}
}

func TestProfilesValid(t *testing.T) {
	for _, p := range Profiles() {
		if err := p.Validate(); err != nil {
			t.Error(err)
		}
	}
	if _, err := LookupProfile("nope"); err == nil {
		t.Error("unknown profile accepted")
	}
}

// The paper's engine: ≈ 9–10 ms ITL unsaturated, ≈ 0.06 ms per prefill token.
func TestPaperProfileCalibration(t *testing.T) {
	p := paperProfile(t)
	if itl := p.StepTime(0, 8, 8*6000); itl < 9*time.Millisecond || itl > 10*time.Millisecond {
		t.Errorf("unsaturated ITL = %v, want 9-10 ms", itl)
	}
	perToken := float64(p.PrefillTime(100000)) / 100000 / float64(time.Millisecond)
	if perToken < 0.057 || perToken > 0.063 {
		t.Errorf("prefill = %.4f ms/token, want 0.057-0.063", perToken)
	}
	if p.KVCapacityTokens != 983549 {
		t.Errorf("KV capacity %d", p.KVCapacityTokens)
	}
}

func TestCloneIsIndependentAndExact(t *testing.T) {
	e := newEngine(t, Config{})
	for i := range uint64(6) {
		if err := e.Submit(0, req(i, i%2, 3000+500*int(i), 40)); err != nil {
			t.Fatal(err)
		}
	}
	e.Advance(200*time.Millisecond, nil)
	var scratch *Engine
	for round := range 2 { // the second round reuses the clone's storage
		c := e.Clone(scratch)
		scratch = c
		if err := c.Submit(200*time.Millisecond, req(99, 5, 2000, 3)); err != nil {
			t.Fatal(err)
		}
		got := run(t, c)
		if find(got, 99, EventFinish).Kind == 0 {
			t.Fatalf("round %d: clone did not finish the extra request", round)
		}
	}
	// The original never saw request 99 and runs as if never cloned.
	ref := newEngine(t, Config{})
	for i := range uint64(6) {
		if err := ref.Submit(0, req(i, i%2, 3000+500*int(i), 40)); err != nil {
			t.Fatal(err)
		}
	}
	ref.Advance(200*time.Millisecond, nil)
	a, b := run(t, e), run(t, ref)
	if len(a) != len(b) {
		t.Fatalf("original emitted %d events after cloning, reference %d", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("event %d: %+v vs %+v", i, a[i], b[i])
		}
	}
}

// SGLang's scheduler: while prefill work is pending, steps prefill only and
// the decoding requests wait; decodes resume when it is done.
func TestPrefillFirstStallsDecodes(t *testing.T) {
	e := newEngine(t, Config{TokenEvents: true, ChunkTokens: 1000})
	if e.prof.Schedule != SchedulePrefillFirst {
		t.Fatalf("the paper's profile schedules %q", e.prof.Schedule)
	}
	if err := e.Submit(0, req(1, 1, 100, 50)); err != nil {
		t.Fatal(err)
	}
	t0 := e.prof.StepTime(100, 0, 0)
	if first := e.Advance(t0, nil); len(first) != 1 || first[0].Kind != EventFirstToken {
		t.Fatalf("after one step: %+v", first)
	}
	if err := e.Submit(t0, req(2, 2, 3500, 1)); err != nil {
		t.Fatal(err)
	}
	// The decode step that started at t0 ends first; then B's four
	// prefill-only chunks (1000, 1000, 1000, 500) run with A waiting.
	now := t0 + e.prof.StepTime(0, 1, 101)
	if a := find(e.Advance(now, nil), 1, EventToken); a.Generated != 2 {
		t.Fatalf("A's second token %+v", a)
	}
	for i, c := range []int{1000, 1000, 1000, 500} {
		now += e.prof.StepTime(c, 0, 0)
		evs := e.Advance(now, nil)
		if a := find(evs, 1, EventToken); a.Kind != 0 {
			t.Fatalf("chunk %d: A decoded during a prefill step", i)
		}
		if b := find(evs, 2, EventFirstToken); (b.Kind != 0) != (i == 3) {
			t.Fatalf("chunk %d: B's first token %+v", i, b)
		}
	}
	// B finished (one token); A decodes again.
	now += e.prof.StepTime(0, 1, 102)
	if a := find(e.Advance(now, nil), 1, EventToken); a.Generated != 3 || a.Time != now {
		t.Errorf("A after the prefill: %+v, want its third token at %v", a, now)
	}
}

// Flush empties the cache of an idle engine, and refuses while a request
// runs or waits (SGLang's /flush_cache).
func TestFlush(t *testing.T) {
	e := newEngine(t, Config{})
	if err := e.Submit(0, req(1, 1, 6000, 4)); err != nil {
		t.Fatal(err)
	}
	if e.Flush() {
		t.Error("flushed with a request waiting")
	}
	run(t, e)
	if n := e.CachedBlocks(blocks(1, 12)); n == 0 {
		t.Fatal("the prompt was not cached")
	}
	if !e.Flush() {
		t.Fatal("an idle engine refused to flush")
	}
	if n := e.CachedBlocks(blocks(1, 12)); n != 0 || e.Gauges().KVUsedTokens != 0 {
		t.Errorf("after the flush: %d blocks cached, %+v", n, e.Gauges())
	}
}
