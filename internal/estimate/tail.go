package estimate

import (
	"math"
	"slices"
)

// Tail is a quantile of the latest observations of a quantity, such as how
// much later than forecast a replica's first tokens come: the margin a
// forecast needs for the truth to fall within it a given share of the time.
// It keeps a window of the latest observations and recomputes the quantile
// every eighth of a window (and while the window fills).
type Tail struct {
	q      float64
	ring   []float64
	next   int // where the next observation goes
	n      int // observations in ring
	since  int // observations since value was computed
	value  float64
	sorted []float64 // scratch
}

// NewTail returns the q-quantile (0 < q < 1) over a window of the latest
// window observations (at least 8).
func NewTail(q float64, window int) *Tail {
	window = max(window, 8)
	return &Tail{q: min(max(q, 0), 1), ring: make([]float64, window)}
}

// Observe adds an observation.
func (t *Tail) Observe(x float64) {
	t.ring[t.next] = x
	t.next = (t.next + 1) % len(t.ring)
	t.n = min(t.n+1, len(t.ring))
	t.since++
	if t.n < len(t.ring) || t.since >= len(t.ring)/8 {
		t.recompute()
	}
}

func (t *Tail) recompute() {
	t.since = 0
	t.sorted = append(t.sorted[:0], t.ring[:t.n]...)
	slices.Sort(t.sorted)
	// The nearest rank: the smallest observation with at least a share q
	// of the window at or below it.
	k := int(math.Ceil(float64(t.n)*t.q)) - 1
	t.value = t.sorted[min(max(k, 0), t.n-1)]
}

// Value returns the quantile, and false before the window holds a
// quarter of its observations.
func (t *Tail) Value() (float64, bool) { return t.value, t.n > 0 && t.n >= len(t.ring)/4 }

// Samples returns how many observations the window holds.
func (t *Tail) Samples() int { return t.n }

// Margin is how much later than forecast outcomes come, learned apart for
// forecasts of different sizes: a forecast's errors grow with what it
// forecasts (a queue of seconds is less certain than a round trip), and
// not in proportion. Forecasts fall into bins doubling from 125 (ms, say):
// below 125, 125–250, 250–500, … up to 16,000 and above; each bin keeps a
// Tail of its forecasts' errors (outcome less forecast), made at its first
// error (a replica's forecasts fill a few bins).
type Margin struct {
	q      float64
	window int
	bins   [MarginBins]*Tail
}

const (
	// MarginBins is how many bins a Margin has.
	MarginBins  = 9
	marginFirst = 125.0 // the first bin's upper bound
)

// NewMargin returns a Margin at quantile q, each bin over a window of the
// latest window errors.
func NewMargin(q float64, window int) *Margin { return &Margin{q: q, window: window} }

// MarginBin is the bin of a forecast.
func MarginBin(forecast float64) int {
	if !(forecast >= marginFirst) {
		return 0
	}
	return min(int(math.Log2(forecast/marginFirst))+1, MarginBins-1)
}

// Observe folds in an outcome and what was forecast for it.
func (m *Margin) Observe(forecast, outcome float64) {
	b := &m.bins[MarginBin(forecast)]
	if *b == nil {
		*b = NewTail(m.q, m.window)
	}
	(*b).Observe(outcome - forecast)
}

// Of returns the margin to add to a forecast in bin b for the outcome to
// fall within it at the quantile, from the bin's errors (never below 0),
// and false while the bin has too few of them.
func (m *Margin) Of(b int) (float64, bool) {
	if m.bins[b] == nil {
		return 0, false
	}
	v, ok := m.bins[b].Value()
	return max(v, 0), ok
}
