// Package report turns per-request measurements into run summaries:
// percentiles, comparison tables and JSON.
package report

import (
	"math"
	"slices"
)

// Dist summarises a distribution, in the unit of its samples.
type Dist struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
}

// Percentile returns the q-quantile (0 ≤ q ≤ 1) of sorted samples, linearly
// interpolated between the closest ranks. It returns 0 for no samples.
func Percentile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	pos := q * float64(n-1)
	lo := int(math.Floor(pos))
	if lo >= n-1 {
		return sorted[n-1]
	}
	frac := pos - float64(lo)
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

// Summarize sorts samples in place and returns their distribution.
func Summarize(samples []float64) Dist {
	if len(samples) == 0 {
		return Dist{}
	}
	slices.Sort(samples)
	var sum float64
	for _, v := range samples {
		sum += v
	}
	return Dist{
		P50:  Percentile(samples, 0.50),
		P90:  Percentile(samples, 0.90),
		P95:  Percentile(samples, 0.95),
		P99:  Percentile(samples, 0.99),
		Mean: sum / float64(len(samples)),
	}
}
