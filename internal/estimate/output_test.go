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
	if d := o.Depth(); d != 2 {
		t.Fatalf("keys used to depth %d, want 2 (application and conversation)", d)
	}
	if g := o.Global(); g < 300 || g > 500 {
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
	if d := o.Depth(); d != 0 {
		t.Errorf("keys used to depth %d, want 0", d)
	}
	if e, g := o.Expect(3, 42), o.Global(); e != g {
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

// Clients inventing keys cannot grow it past its capacity; the newest keys
// are kept.
func TestOutputsBounded(t *testing.T) {
	o := NewOutputs(256, 64)
	for k := range uint64(10_000) {
		o.Observe(10, k+1)
	}
	if n := o.Keys(); n != 64 {
		t.Fatalf("%d keys remembered, want 64", n)
	}
	if len(o.order) != 64 || cap(o.order) != 64 {
		t.Errorf("ring of %d (cap %d), want 64", len(o.order), cap(o.order))
	}
	if o.keys[10_000] == nil || o.keys[10_000-63] == nil {
		t.Error("one of the newest keys was forgotten")
	}
	if o.keys[1] != nil || o.keys[10_000-64] != nil {
		t.Error("an old key is still remembered")
	}
}

func BenchmarkOutputsExpect(b *testing.B) {
	o := NewOutputs(256, 0)
	for k := range uint64(1 << 14) {
		o.Observe(int(k%500), k+1, k+2)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		o.Expect(uint64(i%(1<<14))+1, uint64(i%(1<<14))+2)
	}
}
