package policy

import (
	"math"
	"math/rand/v2"
	"testing"
)

// A score of -Inf is the least score: it must win, not make Pick return -1
// (which the router turns into "policy chose replica -1 of 2").
func TestPickNegativeInfinity(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, margin := range []float64{0, 0.01} {
		d := Decision{Replica: ByScore, Scores: []Terms{{Total: math.Inf(-1)}, {Total: 5}}}
		if i := Pick(&d, margin, rng); i != 0 {
			t.Errorf("margin %v: picked %d, want 0 (the -Inf score)", margin, i)
		}
	}
}

// With ExactTies a NaN score must not win either (it never does without).
func TestPickExactTiesNaN(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	d := Decision{Replica: ByScore, ExactTies: true, Scores: []Terms{{Total: math.NaN()}, {Total: 5}, {Total: 7}}}
	if i := Pick(&d, 0.01, rng); i != 1 {
		t.Errorf("picked %d, want 1", i)
	}
}
