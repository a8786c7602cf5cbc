package report

import (
	"math"
	"path/filepath"
	"testing"
)

// A tuning run whose every request failed (NaN scores throughout) still
// plots its convergence: NaN points are left out of the incumbent line, as
// of the candidates.
func TestPlotConvergenceSkipsNaNIncumbent(t *testing.T) {
	c := Convergence{Title: "t", Objective: "P95 TTFT (ms)", Start: math.NaN(),
		Candidate: []float64{math.NaN(), 120}, Incumbent: []float64{math.NaN(), math.NaN()}, Accepted: []bool{false, false},
		Params: []Series{{Name: "rtt", Values: []float64{0.5, 0.5, 0.5}}}}
	if err := PlotConvergence(filepath.Join(t.TempDir(), "c.png"), c); err != nil {
		t.Fatalf("PlotConvergence: %v", err)
	}
}
