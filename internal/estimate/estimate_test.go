package estimate

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestEWMA(t *testing.T) {
	e := EWMA{Alpha: 0.3}
	if _, ok := e.Value(); ok {
		t.Error("empty EWMA has a value")
	}
	e.Observe(100)
	e.Observe(200)
	if v, _ := e.Value(); math.Abs(v-130) > 1e-9 {
		t.Errorf("value %v, want 130", v)
	}
}

func TestRatesLearnsAFasterReplica(t *testing.T) {
	// Prior: the paper's engine. Truth: twice as fast at prefill.
	r := NewRates(0.06, 0.0075)
	rng := rand.New(rand.NewPCG(1, 1))
	for range 2000 {
		u, q := float64(rng.IntN(20000)), float64(rng.IntN(100000))
		r.Observe(u, q, 15+0.03*u+0.005*q+rng.NormFloat64()*20)
	}
	if p := r.Prefill(); math.Abs(p-0.03) > 0.003 {
		t.Errorf("prefill rate %v, want 0.03", p)
	}
	if q := r.Queue(); math.Abs(q-0.005) > 0.001 {
		t.Errorf("queue rate %v, want 0.005", q)
	}
}

func TestRatesStayBounded(t *testing.T) {
	r := NewRates(0.06, 0.0075)
	for range 100 {
		r.Observe(1000, 1000, -5000) // nonsense: negative latency
	}
	if r.Prefill() < 0.006-1e-12 || r.Queue() < 0 {
		t.Errorf("rates %v %v escaped their bounds", r.Prefill(), r.Queue())
	}
}

func TestITLLearnsALoadedReplica(t *testing.T) {
	// The replica's ITL is 12 ms + 0.8 ms per request in flight; the prior
	// says 9 ms flat.
	m := NewITL(9, 0)
	for i := range 2000 {
		n := float64(1 + i%40)
		m.Observe(n, 12+0.8*n)
	}
	if b, s := m.Base(), m.Slope(); math.Abs(b-12) > 0.1 || math.Abs(s-0.8) > 0.01 {
		t.Errorf("learned base %.3f slope %.4f, want 12 and 0.8", b, s)
	}
	if m.Samples() != 2000 {
		t.Errorf("samples %d", m.Samples())
	}
	// Bounds: the slope is never negative, the base never below a quarter
	// of the prior's; garbage is ignored.
	m = NewITL(8, 0.1)
	for i := range 500 {
		n := float64(1 + i%20)
		m.Observe(n, 40-1.9*n)
	}
	m.Observe(1, math.NaN())
	m.Observe(1, -5)
	if m.Slope() != 0 || m.Base() < 2 || m.Samples() != 500 {
		t.Errorf("bounds: base %.3f slope %.3f samples %d", m.Base(), m.Slope(), m.Samples())
	}
}

// Inputs that never vary must not wind the fit up to infinity.
func TestFitsStayFiniteUnderConstantInput(t *testing.T) {
	m := NewITL(9, 0.1)
	r := NewRates(0.06, 0.06)
	for range 2_000_000 {
		m.Observe(3, 14)
		r.Observe(0, 0, 50)
	}
	for _, v := range []float64{m.Base(), m.Slope(), r.Prefill(), r.Queue()} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("fit went to %v", v)
		}
	}
	if got := m.Base() + 3*m.Slope(); math.Abs(got-14) > 0.01 {
		t.Errorf("ITL at 3 in flight %.3f, want 14", got)
	}
}
