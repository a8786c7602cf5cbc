// Package tune tunes routing weights with a (1+1) evolution strategy: a
// candidate is drawn around the incumbent in log space, measured, and kept
// only if it does better on the objective without breaking a guardrail;
// the step size follows Rechenberg's 1/5 success rule within a floor and a
// ceiling.
//
// It fixes the reference implementation's faults: the acceptance test is
// the right way round for a metric to minimise, each measurement belongs to
// the weights that produced it, the incumbent is measured again for every
// comparison (online) so one lucky window cannot make it permanent, the
// step size is bounded, and a seed makes a run reproducible. Nothing here
// reads a clock; randomness comes from the seed.
package tune

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// Param is one tuned parameter, positive, searched in log space.
type Param struct {
	Name     string
	Min, Max float64
	Init     float64
}

// Point assigns a value to each parameter, in Config.Params order.
type Point []float64

// Config configures an evolution strategy.
type Config struct {
	Params []Param
	// Sigma is the initial step size (standard deviation in log space);
	// default 0.5. SigmaMin and SigmaMax bound it; default 0.02 and 1.
	Sigma, SigmaMin, SigmaMax float64
	Objective                 Objective
	Guards                    []Guard
	// Seed makes the run reproducible.
	Seed uint64
}

// PaperParams are the paper's tuned weights with its start and bounds.
func PaperParams() []Param {
	return []Param{
		{Name: "rtt", Min: 0.05, Max: 2.0, Init: 0.5},
		{Name: "queue", Min: 0.05, Max: 0.5, Init: 0.1},
	}
}

func (c *Config) defaults() error {
	if len(c.Params) == 0 {
		c.Params = PaperParams()
	}
	if c.Sigma == 0 {
		c.Sigma = 0.5
	}
	if c.SigmaMin == 0 {
		c.SigmaMin = 0.02
	}
	if c.SigmaMax == 0 {
		c.SigmaMax = 1
	}
	if c.Objective == "" {
		c.Objective = P95TTFT
	}
	if !(c.SigmaMin > 0 && c.SigmaMin <= c.Sigma && c.Sigma <= c.SigmaMax) {
		return fmt.Errorf("tune: want 0 < sigma-min <= sigma <= sigma-max, got %v, %v, %v", c.SigmaMin, c.Sigma, c.SigmaMax)
	}
	seen := map[string]bool{}
	for _, p := range c.Params {
		if !(p.Min > 0 && p.Min <= p.Init && p.Init <= p.Max) || math.IsInf(p.Max, 0) {
			return fmt.Errorf("tune: parameter %s: want 0 < min <= init <= max, all finite, got %v <= %v <= %v", p.Name, p.Min, p.Init, p.Max)
		}
		if seen[p.Name] {
			return fmt.Errorf("tune: parameter %s listed twice", p.Name)
		}
		seen[p.Name] = true
	}
	if math.IsInf(c.SigmaMax, 0) {
		return fmt.Errorf("tune: sigma-max must be finite")
	}
	if _, err := c.Objective.Of(Metrics{}); err != nil {
		return err
	}
	return nil
}

// Outcome is the verdict on one candidate.
type Outcome struct {
	Candidate Point
	// Score and Incumbent are the objective of the candidate and of the
	// incumbent it was compared with.
	Score, Incumbent float64
	Accepted         bool
	// Reason says why a candidate was rejected: "worse" or the guard it broke.
	Reason string
	// Sigma is the step size after this outcome.
	Sigma float64
	// Values are the candidate's by parameter name, as they were when it
	// was judged (Online fills them in: its parameters may change since,
	// Online.StartFrom).
	Values map[string]float64
}

// ES is a (1+1) evolution strategy. Not safe for concurrent use.
type ES struct {
	cfg   Config
	rng   *rand.Rand
	inc   Point
	sigma float64
	// drift is, per guard, the product of the guarded metric's ratios
	// (candidate / incumbent) over the accepted steps: how far the
	// incumbent has moved since the start.
	drift []float64
}

// NewES returns an ES whose incumbent is every parameter's Init.
func NewES(cfg Config) (*ES, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	e := &ES{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0xda3e39cb94b95bdb)), sigma: cfg.Sigma, drift: make([]float64, len(cfg.Guards))}
	for i := range e.drift {
		e.drift[i] = 1
	}
	for _, p := range cfg.Params {
		e.inc = append(e.inc, p.Init)
	}
	return e, nil
}

// Reset makes every parameter's Init the incumbent again, with the first
// step size and no drift; the random stream goes on.
func (e *ES) Reset() {
	for i, p := range e.cfg.Params {
		e.inc[i] = p.Init
	}
	e.sigma = e.cfg.Sigma
	for i := range e.drift {
		e.drift[i] = 1
	}
}

// Incumbent returns a copy of the best point so far.
func (e *ES) Incumbent() Point { return slices.Clone(e.inc) }

// Sigma returns the current step size.
func (e *ES) Sigma() float64 { return e.sigma }

// StartFrom makes the tuned parameters start from the values an operator
// gave the base policy (a config's, or weight flags'), as its other
// parameters stay at them: a value outside a parameter's bounds moves them
// to hold it with the room around it the bounds give the parameter's own
// start (2026-12-06: it was clamped into them, so decode 50 ran as 2,
// silently), and a 0, a term the operator turned off, is not tuned (the ES
// steps in log space, where 0 has no place). It fails if no parameter is
// left to tune.
func (c *Config) StartFrom(base string, values policy.Values) error {
	tuned := c.Params[:0]
	for _, q := range c.Params {
		if v, ok := values[q.Name]; ok {
			if v <= 0 {
				continue
			}
			if v < q.Min || v > q.Max {
				lo, hi := v*(q.Min/q.Init), min(v*(q.Max/q.Init), math.MaxFloat64)
				if !(lo > 0) {
					lo = v
				}
				q.Min, q.Max = min(q.Min, lo), max(q.Max, hi)
			}
			q.Init = v
		}
		tuned = append(tuned, q)
	}
	if len(tuned) == 0 {
		return fmt.Errorf("config: every parameter the tuner tunes is 0 in the %s weights given: give one a positive value, or turn the tuner off", base)
	}
	c.Params = tuned
	return nil
}

// Config returns the configuration with defaults filled in.
func (e *ES) Config() Config { return e.cfg }

// Propose draws a candidate around the incumbent: each parameter is
// multiplied by exp(sigma·N(0,1)) and clamped to its bounds.
func (e *ES) Propose() Point {
	c := make(Point, len(e.inc))
	for i, p := range e.cfg.Params {
		v := math.Exp(math.Log(e.inc[i]) + e.sigma*e.rng.NormFloat64())
		c[i] = min(max(v, p.Min), p.Max)
	}
	return c
}

// Judge compares a candidate's metrics with the incumbent's (measured under
// the same conditions), moves the incumbent if the candidate wins, and
// adapts the step size. A candidate wins only if it fails no more requests,
// its objective is strictly lower and no guard rejects it. A guard bounds
// the drift of its metric since the start (the product of the ratios of the
// accepted steps, each measured against the incumbent of its step), so that
// steps each within the allowance cannot compound beyond it.
func (e *ES) Judge(cand Point, cm, im Metrics) Outcome {
	o := e.Verdict(cand, cm, im)
	if o.Accepted {
		e.inc = slices.Clone(cand)
		for i, g := range e.cfg.Guards {
			e.drift[i] *= g.ratio(cm, im)
		}
	}
	e.adapt(o.Accepted)
	o.Sigma = e.sigma
	return o
}

// Losing says why a candidate measured cm is already clearly worse than
// the incumbent measured im: its objective or a guarded metric more than
// by times the incumbent's, or at least losingFailures of its requests
// failed and more than by times as many as the incumbent's; "" if it is
// not.
func (e *ES) Losing(cm, im Metrics, by float64) string {
	if cm.N > 0 && float64(cm.Failed) >= losingFailures*float64(cm.N) && float64(cm.Failed)/float64(cm.N) > by*float64(im.Failed)/float64(max(im.N, 1)) {
		// Its objective alone cannot say so: failed requests have no
		// TTFT, and one whose requests all fail has none at all.
		return fmt.Sprintf("%d of its %d requests failed, against %d of %d", cm.Failed, cm.N, im.Failed, im.N)
	}
	cs, is := e.scores(cm, im)
	if cs > by*is {
		return fmt.Sprintf("%s %s against %s", e.cfg.Objective, e.cfg.Objective.Format(cs), e.cfg.Objective.Format(is))
	}
	for _, g := range e.cfg.Guards {
		if r := g.ratio(cm, im); r > by {
			return fmt.Sprintf("%s %.2f times the incumbent's", g.Metric, r)
		}
	}
	return ""
}

// losingFailures is the least share of a candidate's requests that must
// fail for Losing to judge it on its failures: a few in a quarter of a
// window are chance (a replica restarting), a twentieth is not.
const losingFailures = 0.05

// Drop rejects a candidate on a partial measurement, cm against im (see
// OnlineConfig.EarlyStop): a failure for the step size, like any other.
func (e *ES) Drop(cand Point, cm, im Metrics, reason string) Outcome {
	e.adapt(false)
	cs, is := e.scores(cm, im)
	return Outcome{Candidate: slices.Clone(cand), Score: cs, Incumbent: is, Reason: reason, Sigma: e.sigma}
}

// Verdict is what Judge would decide, changing nothing.
func (e *ES) Verdict(cand Point, cm, im Metrics) Outcome {
	cs, is := e.scores(cm, im)
	o := Outcome{Candidate: slices.Clone(cand), Score: cs, Incumbent: is}
	switch {
	case cm.Failed > im.Failed:
		o.Reason = "more failed requests"
	case math.IsNaN(cs) || !(cs < is):
		o.Reason = "worse"
	default:
		o.Accepted = true
		for i, g := range e.cfg.Guards {
			if e.drift[i]*g.ratio(cm, im) > g.MaxRatio {
				o.Accepted, o.Reason = false, "guard "+g.String()
				break
			}
		}
	}
	o.Sigma = e.sigma
	return o
}

// scores are the objective of the candidate's metrics and of the
// incumbent's (NewES checked that the objective is known).
func (e *ES) scores(cm, im Metrics) (cand, inc float64) {
	cand, _ = e.cfg.Objective.Of(cm)
	inc, _ = e.cfg.Objective.Of(im)
	return cand, inc
}

// adapt is the 1/5 success rule in its per-step form: the step grows by
// e^(1/3) after a success and shrinks by e^(-1/12) after a failure, which
// leaves it unchanged on average exactly when one candidate in five wins.
func (e *ES) adapt(success bool) {
	if success {
		e.sigma *= math.Exp(1.0 / 3)
	} else {
		e.sigma *= math.Exp(-1.0 / 12)
	}
	e.sigma = min(max(e.sigma, e.cfg.SigmaMin), e.cfg.SigmaMax)
}

// Named returns the point as a map from parameter name to value.
func (e *ES) Named(p Point) map[string]float64 {
	m := make(map[string]float64, len(p))
	for i, par := range e.cfg.Params {
		m[par.Name] = p[i]
	}
	return m
}

// Format writes a point as "name=value,...".
func (e *ES) Format(p Point) string {
	parts := make([]string, len(p))
	for i, par := range e.cfg.Params {
		parts[i] = fmt.Sprintf("%s=%.4g", par.Name, p[i])
	}
	return strings.Join(parts, ",")
}

// ErrNoSamples means a measurement had no completed requests.
var ErrNoSamples = errors.New("no completed requests to score")
