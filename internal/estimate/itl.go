package estimate

import "math"

// ITL is an online linear model of one replica's inter-token latency as a
// function of its load,
//
//	itl ≈ base + slope·in_flight   (ms)
//
// where in_flight is how many of the router's requests were at the replica
// when the observed request was sent there (itself included). It is fitted
// by recursive least squares with exponential forgetting from each finished
// request's mean token gap, starting from a prior (the replica's profile).
// On a prefill-first engine (SGLang) the slope is mostly the prefills of
// the other requests stalling the decode; on a mixed one (vLLM) mostly the
// batch.
//
// The fit is centred on the load it has seen (a running mean of
// in_flight), so the level there is always well determined, and the slope
// moves away from its prior only as far as the load has varied: a replica
// kept at an even load says little of how its ITL would grow, and an
// uncentred fit would then trade intercept for slope without bound. The
// slope is kept within [0, the prior's base] (one more request cannot cost
// more than a whole idle step per token) and the base at or above a quarter
// of the prior's.
type ITL struct {
	theta  [2]float64 // the level at centre, the slope
	p      [2][2]float64
	centre float64
	prior  [2]float64
	// Forget is the forgetting factor in (0, 1]; 1 never forgets.
	Forget float64
	n      int
}

// centreAlpha is the weight of a sample's load in the running centre.
const centreAlpha = 0.01

// NewITL returns a model with the given prior base and slope (ms),
// forgetting with factor 0.995 (a memory of about 200 requests).
func NewITL(baseMS, slopeMS float64) *ITL {
	m := &ITL{theta: [2]float64{baseMS, slopeMS}, prior: [2]float64{baseMS, slopeMS}, Forget: 0.995}
	// Loose priors: the level ±10 ms, the slope ±1 ms per request.
	m.p[0][0] = 100
	m.p[1][1] = 1
	return m
}

// Observe adds one request: the requests in flight at its replica when it
// was sent (itself included) and its mean inter-token latency in ms.
func (m *ITL) Observe(inFlight, ms float64) {
	if math.IsNaN(ms) || math.IsInf(ms, 0) || ms < 0 || math.IsNaN(inFlight) || math.IsInf(inFlight, 0) {
		return
	}
	// Move the centre; the level follows the line.
	c := m.centre
	if m.n == 0 {
		c = inFlight
	} else {
		c += centreAlpha * (inFlight - c)
	}
	m.theta[0] += m.theta[1] * (c - m.centre)
	m.centre = c
	x := [2]float64{1, inFlight - c}
	px := [2]float64{m.p[0][0]*x[0] + m.p[0][1]*x[1], m.p[1][0]*x[0] + m.p[1][1]*x[1]}
	den := m.Forget + x[0]*px[0] + x[1]*px[1]
	k := [2]float64{px[0] / den, px[1] / den}
	// A single request's mean gap can hold a long stall: bound what one
	// sample can move the fit by (three times the level it predicts).
	pred := m.theta[0] + m.theta[1]*x[1]
	lim := 3 * max(pred, m.prior[0])
	err := min(max(ms-pred, -lim), lim)
	for i := range 2 {
		m.theta[i] += k[i] * err
	}
	// Forgetting divides the information matrix's inverse each step; with
	// inputs that barely vary it would grow without bound (covariance
	// wind-up). Forget only while it is no looser than the prior.
	f := m.Forget
	if m.p[0][0]+m.p[1][1] > 101 {
		f = 1
	}
	for i := range 2 {
		for j := range 2 {
			m.p[i][j] = (m.p[i][j] - k[i]*px[j]) / f
		}
	}
	// Rounding makes the update drift from symmetric, and an asymmetric
	// matrix soon stops being positive definite: keep it symmetric, and
	// start again from the prior if it is not positive definite.
	m.p[0][1] = (m.p[0][1] + m.p[1][0]) / 2
	m.p[1][0] = m.p[0][1]
	pd := m.p[0][0] > 0 && m.p[1][1] > 0 && m.p[0][0]*m.p[1][1] > m.p[0][1]*m.p[0][1]
	m.theta[1] = min(max(m.theta[1], 0), m.prior[0])
	if !pd || math.IsNaN(m.theta[0]) || math.IsInf(m.theta[0], 0) {
		n := m.n
		*m = *NewITL(m.prior[0], m.prior[1]) // start again from the prior
		m.n = n
	}
	m.n++
}

// Base returns the ITL of an idle replica, ms.
func (m *ITL) Base() float64 {
	return math.Max(m.theta[0]-m.theta[1]*m.centre, m.prior[0]/4)
}

// Slope returns how much each request in flight adds to the ITL, ms.
func (m *ITL) Slope() float64 { return m.theta[1] }

// Samples returns how many requests were observed.
func (m *ITL) Samples() int { return m.n }
