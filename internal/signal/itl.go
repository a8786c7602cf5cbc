package signal

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
// batch. The base never drops below a quarter of the prior's, and the slope
// is never negative.
type ITL struct {
	theta [2]float64
	p     [2][2]float64
	prior [2]float64
	// Forget is the forgetting factor in (0, 1]; 1 never forgets.
	Forget float64
	n      int
}

// NewITL returns a model with the given prior base and slope (ms),
// forgetting with factor 0.995 (a memory of about 200 requests).
func NewITL(baseMS, slopeMS float64) *ITL {
	m := &ITL{theta: [2]float64{baseMS, slopeMS}, prior: [2]float64{baseMS, slopeMS}, Forget: 0.995}
	// Loose priors: the base ±10 ms, the slope ±1 ms per request.
	m.p[0][0] = 100
	m.p[1][1] = 1
	return m
}

// Observe adds one request: the requests in flight at its replica when it
// was sent (itself included) and its mean inter-token latency in ms.
func (m *ITL) Observe(inFlight, ms float64) {
	if math.IsNaN(ms) || math.IsInf(ms, 0) || ms < 0 {
		return
	}
	x := [2]float64{1, inFlight}
	px := [2]float64{m.p[0][0]*x[0] + m.p[0][1]*x[1], m.p[1][0]*x[0] + m.p[1][1]*x[1]}
	den := m.Forget + x[0]*px[0] + x[1]*px[1]
	k := [2]float64{px[0] / den, px[1] / den}
	err := ms - (m.theta[0] + m.theta[1]*inFlight)
	for i := range 2 {
		m.theta[i] += k[i] * err
	}
	// Forgetting divides the information matrix's inverse each step; with
	// inputs that barely vary (a replica always equally loaded) it would
	// grow without bound and the fit blow up (covariance wind-up). Forget
	// only while it is no looser than the prior.
	f := m.Forget
	if m.p[0][0]+m.p[1][1] > 101 {
		f = 1
	}
	for i := range 2 {
		for j := range 2 {
			m.p[i][j] = (m.p[i][j] - k[i]*px[j]) / f
		}
	}
	if math.IsNaN(m.theta[0]+m.theta[1]) || math.IsInf(m.theta[0]+m.theta[1], 0) {
		n := m.n
		*m = *NewITL(m.prior[0], m.prior[1]) // start again from the prior
		m.n = n
	}
	m.n++
}

// Base returns the ITL of an idle replica, ms.
func (m *ITL) Base() float64 { return math.Max(m.theta[0], m.prior[0]/4) }

// Slope returns how much each request in flight adds to the ITL, ms.
func (m *ITL) Slope() float64 { return math.Max(m.theta[1], 0) }

// Samples returns how many requests were observed.
func (m *ITL) Samples() int { return m.n }
