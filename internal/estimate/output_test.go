package estimate

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestOutputsPrior(t *testing.T) {
	o := NewOutputs(256, 0)
	if e := o.Expect(); e != 256 {
		t.Errorf("before any answer: %v, want the prior 256", e)
	}
	if e := o.Expect(7, 9); e != 256 {
		t.Errorf("unknown keys: %v, want the prior 256", e)
	}
}

// Two applications, one answering in ~40 tokens and one in ~700, and
// conversations of their own verbosity: keyed by application and
// conversation, each request is expected near its own mean; the global mean
// is neither.
func TestOutputsLearnsByKey(t *testing.T) {
	o := NewOutputs(256, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	const tools, reports = 1, 2
	verbosity := map[uint64]float64{}
	for i := range 4000 {
		app, median := uint64(tools), 40.0
		if i%2 == 1 {
			app, median = reports, 700
		}
		conv := 1000*app + uint64(rng.IntN(100)) // a conversation keeps to its application
		if verbosity[conv] == 0 {
			verbosity[conv] = math.Exp(0.5 * rng.NormFloat64())
		}
		o.Observe(int(median*verbosity[conv]*math.Exp(0.2*rng.NormFloat64())), app, conv)
	}
	if d := o.State().Depth; d != 2 {
		t.Fatalf("keys used to depth %d, want 2 (application and conversation)", d)
	}
	if g := o.State().Mean; g < 300 || g > 500 {
		t.Errorf("global mean %v, want about 400", g)
	}
	// A new conversation of each application.
	if e := o.Expect(tools, 9); e < 35 || e > 60 {
		t.Errorf("tool calls expected at %v, want about 40", e)
	}
	r := o.Expect(reports, 9)
	if r < 600 || r > 850 {
		t.Errorf("reports expected at %v, want about 700", r)
	}
	// A terse conversation of the report writer's.
	const terse = 3
	for range 3 {
		o.Observe(200, reports, terse)
	}
	if e := o.Expect(reports, terse); !(e < r && e > 200) {
		t.Errorf("terse conversation expected at %v, want between 200 and the application's %v", e, r)
	}
}

// Where the keys do not tell the length (every answer drawn alone), the
// keyed means only add noise: the estimate is the global mean.
func TestOutputsIgnoresKeysThatTellNothing(t *testing.T) {
	o := NewOutputs(256, 0)
	rng := rand.New(rand.NewPCG(3, 4))
	for range 4000 {
		o.Observe(int(250*math.Exp(0.8*rng.NormFloat64())), uint64(1+rng.IntN(8)), uint64(10+rng.IntN(500)))
	}
	if d := o.State().Depth; d != 0 {
		t.Errorf("keys used to depth %d, want 0", d)
	}
	if e, g := o.Expect(3, 42), o.State().Mean; e != g {
		t.Errorf("expected %v, want the global mean %v", e, g)
	}
}

// A key seen once moves the estimate only part of the way: OutputPrior
// requests' worth of the broader mean stay in it.
func TestOutputsShrinks(t *testing.T) {
	o := NewOutputs(100, 0)
	o.Observe(600, 5)
	want := (600 + OutputPrior*77.0) / (1 + OutputPrior)
	if e := o.shrink(77, 5); math.Abs(e-want) > 1e-9 {
		t.Errorf("one answer of 600 under a key, from 77: %v, want %v", e, want)
	}
	if e := o.shrink(77, 6); e != 77 {
		t.Errorf("an unknown key moved the estimate to %v", e)
	}
}

// Clients inventing keys cannot grow it past its capacity of each depth;
// the newest keys are kept.
func TestOutputsBounded(t *testing.T) {
	o := NewOutputs(256, 64)
	for k := range uint64(10_000) {
		o.Observe(10, 1_000_000+k, k+1)
	}
	if n := o.State().Keys; n != 128 {
		t.Fatalf("%d keys remembered, want 64 of each depth", n)
	}
	for _, r := range o.rings {
		if len(r.keys) != 64 || cap(r.keys) != 64 {
			t.Errorf("ring of %d (cap %d), want 64", len(r.keys), cap(r.keys))
		}
	}
	if o.keys[10_000] == nil || o.keys[10_000-63] == nil || o.keys[1_000_000+9_999] == nil {
		t.Error("one of the newest keys was forgotten")
	}
	if o.keys[1] != nil || o.keys[10_000-64] != nil || o.keys[1_000_000] != nil {
		t.Error("an old key is still remembered")
	}
}

// An application's key, used by every request, outlives any number of new
// conversations, and so does a conversation that goes on (once the ring has
// turned: a second chance needs a use between two passes); one that ended
// is forgotten.
func TestOutputsKeepsKeysInUse(t *testing.T) {
	o := NewOutputs(256, 64)
	const app, long = 1, 2
	var half int
	for i := range uint64(10_000) {
		o.Observe(40, app, 1000+i) // a new conversation each time
		if i%8 == 0 {
			o.Observe(40, app, long) // a conversation that goes on
		}
		if i == 5_000 {
			half = o.keys[long].n
		}
	}
	if m := o.keys[app]; m == nil || m.n != 10_000+1_250 {
		t.Errorf("the application's key: %+v, want all 11,250 answers", m)
	}
	if m := o.keys[long]; m == nil || m.n-half != 624 {
		t.Errorf("a conversation still in use: %+v (%d answers at the half), want the 624 since", m, half)
	}
	if o.keys[1000] != nil {
		t.Error("the first, ended conversation is still remembered")
	}
	if n := o.State().Keys; n > 128 {
		t.Errorf("%d keys remembered, want at most 64 of each depth", n)
	}
}

// Expect at depth 2, the most it does: two keys looked up and shrunk.
func BenchmarkOutputsExpect(b *testing.B) {
	o := NewOutputs(256, 0)
	const convs = 1 << 14
	for k := range uint64(4 * convs) {
		app, conv := k%8+1, 1<<32+k%convs
		o.Observe(int(40*app+conv%64), app, conv) // both keys tell the length
	}
	if d := o.State().Depth; d != 2 {
		b.Fatalf("depth %d, want 2", d)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		k := uint64(i)
		o.Expect(k%8+1, 1<<32+k%convs)
	}
}

// A replica's or a peer's bad report of an answer's length (2^40 tokens,
// or a negative one) teaches nothing: it once moved the expected length
// of the next few hundred requests from about 200 tokens to 10^10. The
// longest real answer is still learned.
func TestOutputsIgnoreImpossibleLengths(t *testing.T) {
	o := NewOutputs(200, 0)
	for range 100 {
		o.Observe(200, 1, 2)
	}
	before := o.State()
	for _, bad := range []int{1 << 40, MaxOutputTokens + 1, -1, -(1 << 40)} {
		o.Observe(bad, 1, 2)
	}
	if e := o.Expect(1, 2); e != 200 {
		t.Errorf("after impossible lengths, expected %v, want 200", e)
	}
	if st := o.State(); st != before {
		t.Errorf("after impossible lengths, the state moved: %+v, was %+v", st, before)
	}
	o.Observe(MaxOutputTokens, 1, 2)
	if e := o.Expect(); e <= 200 {
		t.Errorf("the longest answer was not learned: expected %v", e)
	}
}
