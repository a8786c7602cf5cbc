package estimate

import (
	"math"
	"math/rand/v2"
	"testing"
)

// Noisy, heavy-tailed token gaps (a stall now and then) at a load that
// varies little: the fit stays finite and near the truth.
func TestITLIsStableUnderHeavyTails(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	m := NewITL(9, 0.06)
	for range 50000 {
		n := float64(20 + rng.IntN(40))
		y := 15 + 0.2*n + rng.NormFloat64()*3
		if rng.IntN(50) == 0 {
			y = 500 + rng.Float64()*2000
		}
		m.Observe(n, y)
		if b, s := m.Base(), m.Slope(); math.IsNaN(b) || b > 100 || s > 9 {
			t.Fatalf("fit ran away: base %v slope %v", b, s)
		}
	}
	// At the usual load (~40 in flight) the fit is within a few ms of the
	// truth (23 ms), the stalls it clips adding about 1.5 ms.
	if at := m.Base() + 40*m.Slope(); math.Abs(at-24) > 2 {
		t.Errorf("ITL at 40 in flight %.2f, want ≈ 24", at)
	}
}
