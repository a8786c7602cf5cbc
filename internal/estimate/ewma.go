// Package estimate turns raw observations into the estimates a router
// routes on: an exponentially weighted moving average for round trips, an
// online least-squares model of TTFT for per-replica rates, one of a
// replica's inter-token latency against its load, and the expected length
// of an answer from those before it. Nothing here reads a clock;
// observations come with their values.
package estimate

// EWMA is an exponentially weighted moving average. The zero value has no
// samples; its first sample is taken as is.
type EWMA struct {
	// Alpha is the weight of a new sample, in (0, 1].
	Alpha float64
	value float64
	n     int
}

// DefaultAlpha is the paper's RTT smoothing factor.
const DefaultAlpha = 0.3

// Observe adds a sample.
func (e *EWMA) Observe(x float64) {
	if e.n == 0 {
		e.value = x
	} else {
		e.value += e.Alpha * (x - e.value)
	}
	e.n++
}

// Value returns the average, and false before the first sample.
func (e *EWMA) Value() (float64, bool) { return e.value, e.n > 0 }

// Samples returns how many samples were observed.
func (e *EWMA) Samples() int { return e.n }
