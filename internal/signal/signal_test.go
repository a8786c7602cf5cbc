package signal

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
