package estimate

import "math"

// Rates is an online linear model of one replica's time to first token
// without the network,
//
//	ttft − rtt ≈ base + prefill·uncached_tokens + queue·queued_tokens   (ms)
//
// fitted by recursive least squares with exponential forgetting, so that it
// follows a replica whose speed changes. It starts from a prior (the
// replica's profile or configuration) and never reports a prefill rate
// below a tenth or above ten times the prior's, or a negative queue rate.
type Rates struct {
	theta  [3]float64    // base, prefill, queue
	p      [3][3]float64 // inverse information matrix
	prior  [3]float64
	ptrace float64 // the prior's trace of p: the loosest forgetting may make it
	// Forget is the forgetting factor in (0, 1]; 1 never forgets.
	Forget float64
	n      int
}

// NewRates returns a model with the given prior rates (ms per token) and a
// zero base, forgetting with factor 0.998 (a memory of about 500 samples).
func NewRates(prefillMS, queueMS float64) *Rates {
	r := &Rates{theta: [3]float64{0, prefillMS, queueMS}, prior: [3]float64{0, prefillMS, queueMS}, Forget: 0.998}
	// Prior confidence: loose on the base (±1 s), on the rates ±100% of the
	// prior per ~1k tokens of evidence.
	r.p[0][0] = 1e6
	r.p[1][1] = math.Max(prefillMS*prefillMS, 1e-8) * 1e-2
	r.p[2][2] = math.Max(queueMS*queueMS, 1e-8) * 1e-2
	r.ptrace = r.p[0][0] + r.p[1][1] + r.p[2][2]
	return r
}

// Observe adds one request: its uncached and queued tokens at dispatch and
// its TTFT minus the round trip, in ms.
func (r *Rates) Observe(uncached, queued, ms float64) {
	x := [3]float64{1, uncached, queued}
	var px [3]float64
	for i := range 3 {
		for j := range 3 {
			px[i] += r.p[i][j] * x[j]
		}
	}
	den := r.Forget
	for i := range 3 {
		den += x[i] * px[i]
	}
	var k [3]float64
	for i := range 3 {
		k[i] = px[i] / den
	}
	err := r.residual(uncached, queued, ms)
	for i := range 3 {
		r.theta[i] += k[i] * err
	}
	// Forget only while the fit is no looser than the prior: with inputs
	// that barely vary, forgetting would grow the information matrix's
	// inverse without bound (covariance wind-up) and the fit blow up.
	f := r.Forget
	if r.p[0][0]+r.p[1][1]+r.p[2][2] > r.ptrace {
		f = 1
	}
	for i := range 3 {
		for j := range 3 {
			r.p[i][j] = (r.p[i][j] - k[i]*px[j]) / f
		}
	}
	for i := range 3 { // rounding drifts from symmetric: keep it symmetric
		for j := range i {
			v := (r.p[i][j] + r.p[j][i]) / 2
			r.p[i][j], r.p[j][i] = v, v
		}
	}
	r.n++
}

// residual is how far a sample's ms lies from the fit's prediction, bound
// as the ITL model bounds it: one request's TTFT can hold a long stall (a
// preemption, a scheduler hiccup, a slow tokenizer) that says nothing of
// the rates, and unbounded, a 5 s stall in a few hundred samples drives the
// prefill rate to its clamp. So no sample moves the fit by more than
// three times the TTFT it predicts (or the prior predicts, or
// minResidualBoundMS, whichever is largest): a replica truly slower than
// the fit still pulls it up, a few samples at a time.
func (r *Rates) residual(uncached, queued, ms float64) float64 {
	pred := r.theta[0] + r.theta[1]*uncached + r.theta[2]*queued
	prior := r.prior[0] + r.prior[1]*uncached + r.prior[2]*queued
	lim := 3 * max(pred, prior, minResidualBoundMS)
	return min(max(ms-pred, -lim), lim)
}

// minResidualBoundMS floors the bound on a sample's residual, for a fit
// that predicts about nothing (a prompt all cached, on a replica with no
// queue): about an idle engine's step.
const minResidualBoundMS = 10

// Prefill returns the prefill rate, ms per uncached token.
func (r *Rates) Prefill() float64 {
	return math.Min(math.Max(r.theta[1], r.prior[1]/10), r.prior[1]*10)
}

// Queue returns the queue rate, ms per queued token.
func (r *Rates) Queue() float64 {
	return math.Min(math.Max(r.theta[2], 0), math.Max(r.prior[2]*10, 1e-3))
}

// Samples returns how many requests were observed.
func (r *Rates) Samples() int { return r.n }
