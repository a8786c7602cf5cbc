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

// Two applications, one answering in ~40 tokens and one in ~700: keyed by
// application, each is expected near its own mean, and a conversation's
// verbosity moves its requests further; the global mean is neither.
func TestOutputsLearnsByKey(t *testing.T) {
	o := NewOutputs(256, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	const tools, reports = 1, 2
	for i := range 2000 {
		if i%2 == 0 {
			o.Observe(int(40*math.Exp(0.3*rng.NormFloat64())), tools, 0)
		} else {
			o.Observe(int(700*math.Exp(0.3*rng.NormFloat64())), reports, 0)
		}
	}
	if g := o.Global(); g < 300 || g > 450 {
		t.Errorf("global mean %v, want about 380", g)
	}
	if e := o.Expect(tools); e < 35 || e > 60 {
		t.Errorf("tool calls expected at %v, want about 40", e)
	}
	if e := o.Expect(reports); e < 600 || e > 800 {
		t.Errorf("reports expected at %v, want about 700", e)
	}
	// A terse conversation of the report writer.
	const terse = 3
	for range 3 {
		o.Observe(200, reports, terse)
	}
	e := o.Expect(reports, terse)
	if r := o.Expect(reports); !(e < r && e > 200) {
		t.Errorf("terse conversation expected at %v, want between 200 and the application's %v", e, r)
	}
}

// A key seen once moves the estimate only part of the way: OutputPrior
// requests' worth of the broader mean stay in it.
func TestOutputsShrinks(t *testing.T) {
	o := NewOutputs(100, 0)
	o.Observe(100) // global stays 100
	o.Observe(600, 5)
	g := o.Global()
	want := (600 + OutputPrior*g) / (1 + OutputPrior)
	if e := o.Expect(5); math.Abs(e-want) > 1e-9 {
		t.Errorf("one answer of 600 under a key: %v, want %v", e, want)
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
	g := o.Global()
	if e := o.Expect(10_000); e == g {
		t.Error("the newest key was forgotten")
	}
	if e := o.Expect(1); e != g {
		t.Errorf("the oldest key is still remembered: %v against the global %v", e, g)
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
