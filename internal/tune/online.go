package tune

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// OnlineConfig configures online tuning on live traffic.
type OnlineConfig struct {
	ES Config
	// Base is the tuned policy (default "gorgo"): any registered policy
	// with parameters (policy.Info.Params), which the ES's parameters name.
	Base string
	// Window is how many of its own requests each arm is scored on
	// (default 128, the paper's); Hop is how many consecutive requests one
	// arm routes before the other takes over (default 32).
	Window, Hop int
	// Block, if positive, alternates the arms in blocks of router time
	// instead of every Hop requests (a switchback experiment), and Burn is
	// the start of each block whose requests are routed but not scored
	// (default Block/2): requests of the other arm still in flight then
	// shape what this arm's requests meet. Arms that alternate faster
	// than requests finish share the replicas' load, and one that piles
	// requests on a replica makes the other pay for it; blocks long enough
	// for the load to turn over make each arm pay its own way.
	Block, Burn time.Duration
	// BaseParams holds the values of the parameters that are not tuned (a
	// parameter not listed keeps its value here); the base policy's
	// defaults where it has none.
	BaseParams policy.Values
	// StartFromBase starts the tuned parameters from BaseParams' values
	// (Config.StartFrom: their bounds widened to hold them, a 0 not
	// tuned), as gorgo serve's tuner starts at the operator's weights;
	// otherwise from ES.Params' starts.
	StartFromBase bool
	// History is how many of the latest verdicts Steps keeps (default 256).
	History int
	// Confirm makes a candidate that wins its round win a second round,
	// measured afresh, before it is accepted: with a window of a few
	// hundred requests a p95 is noisy, and a candidate accepted on one
	// lucky window moves the weights at random (the winner's curse).
	Confirm bool
	// EarlyStop, if above 1, drops a candidate before its window is full:
	// once each arm has a quarter of a window of outcomes, a candidate
	// whose objective, or a guarded metric, is already more than EarlyStop
	// times the incumbent's is judged worse at once. Half the traffic
	// routed by a bad candidate is the price of exploring; this bounds how
	// long it is paid. A good candidate unlucky early is lost: the ES
	// draws another.
	EarlyStop float64
}

// Online is a policy that tunes its own weights on the traffic it routes
// (the paper's online mode, done soundly). It routes with two arms, the
// incumbent weights and a candidate, alternating every Hop requests so both
// meet the same load; every decision is tagged with its arm, and once each
// arm has Window outcomes of its own the ES judges the candidate against
// the incumbent measured alongside it. Then a new candidate is drawn and
// both arms start afresh, so the incumbent is measured again every round.
// Online is safe for concurrent use.
type Online struct {
	mu      sync.Mutex
	cfg     OnlineConfig
	es      *ES
	tunable []Param          // the parameters it may tune (OnlineConfig.ES.Params as given)
	arms    [2]policy.Policy // incumbent, candidate
	cand    Point
	round   int
	routed  int
	samples [2][]Sample
	// tallies measure each arm's samples as they come, for EarlyStop
	// (kept only with it).
	tallies  [2]tally
	steps    []Outcome // the latest cfg.History verdicts
	judged   int
	accepted int
	unjudged int // decisions the objective cannot judge, routed by the incumbent
	paused   bool
	// from is the router time from which decisions are scored in block
	// mode: a round starts scoring at the first block after it began.
	from time.Duration
	// resets counts fallbacks to the starting weights from elsewhere, why
	// says why the last one; moved is whether a candidate was accepted
	// since the start or the last fallback.
	resets int
	why    string
	moved  bool
	// known are the replicas the resumed state was learned with (Restore):
	// one of them joining is no change of the fleet that was learned on.
	known map[string]bool
	// confirming: the candidate won its first round and is measured again.
	confirming bool
	// sloOnly: the objective is slo-p95, which only requests with SLOs
	// measure.
	sloOnly bool
	// wholeToo: the objective is an E2E's, which whole answers (their
	// first token not seen) measure as streams do; the others are TTFT's
	// and judge streams alone.
	wholeToo bool
	// perToken: the objective is p95-e2e-per-token, which answers of a
	// length not known cannot measure.
	perToken bool
}

// MaxWindow bounds OnlineConfig.Window: an arm keeps up to two windows of
// outcomes, and a round of a larger one would take days.
const MaxWindow = 1 << 20

// OnlineName is the registered name of the online-tuned gorgo policy.
const OnlineName = "gorgo-online"

func init() {
	policy.Register(policy.Info{Name: OnlineName, Tuner: true, New: func(o policy.Options) (policy.Policy, error) {
		var cfg OnlineConfig
		if o.Config != nil {
			c, ok := o.Config.(OnlineConfig)
			if !ok {
				return nil, fmt.Errorf("%s: options carry a %T, not a tune.OnlineConfig", OnlineName, o.Config)
			}
			cfg = c
		}
		return NewOnline(cfg)
	}})
}

// NewOnline returns an online tuner whose candidate is already drawn.
func NewOnline(cfg OnlineConfig) (*Online, error) {
	if cfg.Base == "" {
		cfg.Base = "gorgo"
	}
	cfg.Base = policy.Canonical(cfg.Base)
	base, ok := policy.Lookup(cfg.Base)
	if !ok || len(base.Params) == 0 {
		return nil, fmt.Errorf("online tuning: the base policy must have parameters (%s), got %q", strings.Join(policy.WithParams(), ", "), cfg.Base)
	}
	given := cfg.BaseParams
	var err error
	if cfg.BaseParams, err = base.Resolve(cfg.BaseParams); err != nil {
		return nil, fmt.Errorf("online tuning: %w", err)
	}
	if len(cfg.ES.Params) == 0 {
		cfg.ES.Params = DefaultParams(cfg.Base)
	}
	// What it may tune, before a start's zeros are left out: StartFrom
	// starts from them, as a restart would.
	tunable := slices.Clone(cfg.ES.Params)
	if cfg.StartFromBase {
		cfg.ES.Params = slices.Clone(tunable) // StartFrom filters in place
		if err := cfg.ES.StartFrom(cfg.Base, given); err != nil {
			return nil, err
		}
	}
	if cfg.Window == 0 {
		cfg.Window = 128
	}
	if cfg.Hop == 0 {
		cfg.Hop = 32
	}
	if cfg.History == 0 {
		cfg.History = 256
	}
	if cfg.Window < 1 || cfg.Hop < 1 || cfg.History < 1 {
		return nil, fmt.Errorf("online tuning: window, hop and history must be positive")
	}
	if cfg.Window > MaxWindow {
		return nil, fmt.Errorf("online tuning: a window of %d requests; at most %d", cfg.Window, MaxWindow)
	}
	if cfg.Block > 0 && cfg.Burn == 0 {
		cfg.Burn = cfg.Block / 2
	}
	if cfg.Block < 0 || cfg.Burn < 0 || cfg.Burn > 0 && cfg.Burn >= cfg.Block {
		return nil, fmt.Errorf("online tuning: want 0 <= burn < block, got block %v, burn %v", cfg.Block, cfg.Burn)
	}
	es, err := NewES(cfg.ES)
	if err != nil {
		return nil, err
	}
	if err := CheckParams(cfg.Base, es.Config().Params); err != nil {
		return nil, fmt.Errorf("online tuning: %w", err)
	}
	o := &Online{cfg: cfg, es: es, tunable: tunable, sloOnly: es.Config().Objective == SLOP95, wholeToo: es.Config().Objective == P95E2E || es.Config().Objective == P95E2EPerToken, perToken: es.Config().Objective == P95E2EPerToken}
	if o.arms[0], err = o.policy(es.Incumbent()); err != nil {
		return nil, err
	}
	if err := o.next(); err != nil {
		return nil, err
	}
	return o, nil
}

// CheckParams reports a tuned parameter the base policy does not have.
func CheckParams(base string, params []Param) error {
	i, ok := policy.Lookup(base)
	if !ok {
		return fmt.Errorf("unknown policy %q", base)
	}
	for _, p := range params {
		if _, ok := i.Param(p.Name); !ok {
			var valid []string
			for _, q := range i.Params {
				valid = append(valid, q.Name)
			}
			return fmt.Errorf("%s has no parameter %q (valid: %s)", i.Name, p.Name, strings.Join(valid, ", "))
		}
	}
	return nil
}

// DefaultParams are the parameters tuned when none are given: those the
// base policy marks for tuning, with its bounds and start (for gorgo and
// gorgo-ms the paper's rtt and queue weights; for gorgo-e2e its decode
// weights around their defaults, the TTFT terms keeping gorgo-ms's).
func DefaultParams(base string) []Param {
	i, _ := policy.Lookup(base)
	var out []Param
	for _, p := range i.Params {
		if p.Tune {
			out = append(out, Param{Name: p.Name, Min: p.Min, Max: p.Max, Init: p.Init})
		}
	}
	return out
}

// Apply returns the parameter values a point stands for: base, with the
// tuned parameters replaced.
func Apply(es *ES, p Point, base policy.Values) policy.Values {
	v := base.Clone()
	for name, x := range es.Named(p) {
		v[name] = x
	}
	return v
}

func (o *Online) policy(p Point) (policy.Policy, error) {
	return policy.New(o.cfg.Base, policy.Options{Params: Apply(o.es, p, o.cfg.BaseParams)})
}

// next starts a new round with a fresh candidate.
func (o *Online) next() error {
	o.cand = o.es.Propose()
	p, err := o.policy(o.cand)
	if err != nil {
		return err
	}
	o.arms[1] = p
	o.confirming = false
	o.restart()
	return nil
}

// restart starts a new round with the arms as they are.
func (o *Online) restart() {
	o.round++
	o.routed = 0
	o.samples[0], o.samples[1] = o.samples[0][:0], o.samples[1][:0]
	o.tallies[0].rebuild(nil)
	o.tallies[1].rebuild(nil)
	o.from = -1 // set by the round's first decision
}

// Name implements policy.Policy.
func (o *Online) Name() string { return OnlineName }

// Decide routes with the arm whose turn it is and tags the decision; while
// paused, with the incumbent, untagged, and so a request whose outcome
// the objective cannot use (a whole answer under a TTFT objective: its
// first token is not seen; one without SLOs under slo-p95; one that
// generates no text), which would pay for a candidate that nothing
// judges. In block mode a decision made in a block's burn-in, or before
// the round's first whole block, is routed by its arm but untagged (not
// scored).
func (o *Online) Decide(d *policy.Decision, req *policy.Request, reps []policy.Replica, rng *rand.Rand) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.paused || req.Unjudged || req.Unstreamed && !o.wholeToo || o.sloOnly && !req.HasSLO {
		if !o.paused {
			o.unjudged++
		}
		d.Tag = -1
		return o.arms[0].Decide(d, req, reps, rng)
	}
	tag := 0
	var arm int
	if b := o.cfg.Block; b > 0 {
		now := max(req.Now, 0) // a router's time runs from its start
		start := now - now%b
		if o.from < 0 {
			o.from = start + b
		}
		arm = int(now/b) % 2
		tag = -1
		if start >= o.from && now-start >= o.cfg.Burn {
			tag = 2*o.round + arm
		}
	} else {
		arm = (o.routed / o.cfg.Hop) % 2
		o.routed++
		tag = 2*o.round + arm
	}
	if err := o.arms[arm].Decide(d, req, reps, rng); err != nil {
		return err
	}
	d.Tag = tag
	return nil
}

// FleetChanged implements policy.FleetWatcher. Weights learned on another
// fleet say little of this one: a tuner that has moved falls back to its
// starting weights (the base policy's defaults), its first step size and
// no drift, and draws a new candidate; not for a replica that joins which
// the state it resumed was learned with (Restore: a router restarted
// before one of its replicas came up). Either way the round starts
// afresh, its outcomes so far measured on the old fleet.
func (o *Online) FleetChanged(c policy.FleetChange) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if c.Joined != "" && o.known[c.Joined] {
		delete(o.known, c.Joined) // once: leaving and joining again is news
		// What was learned holds; a win the candidate had on the fleet
		// without it confirms nothing.
		o.confirming = false
		o.restart()
		return
	}
	// Any other change: what is learned from now on is of another fleet
	// than the resumed state's (a review: a replica it knew, joining after
	// a fallback, kept weights learned without it).
	o.known = nil
	if !o.moved {
		// The candidate stays, but a win it had on the old fleet confirms
		// nothing on this one; the step its rejections shrank there is
		// no guide to this fleet (the incumbent is the start already).
		o.es.Reset()
		o.confirming = false
		o.restart()
		return
	}
	o.resets++
	o.why = c.Why
	o.moved = false
	o.es.Reset()
	p, err := o.policy(o.es.Incumbent())
	if err != nil {
		return // cannot happen: the starting point was valid at NewOnline
	}
	o.arms[0] = p
	if err := o.next(); err != nil {
		o.arms[1] = o.arms[0]
	}
}

// StartFrom makes an operator's values of some of the base policy's
// parameters the tuner's start, as if it had been started with them (the
// parameters not given keep what the incumbent routes with now): those
// it does not tune take them, those it may tune (its ES.Params as given)
// start from them (their bounds widened to hold them, a 0 not tuned:
// Config.StartFrom), with the first step size and no drift, and a change
// of the fleet falls back to them. The round starts afresh with a new
// candidate; a pause holds (the new incumbent routes). Values the base
// policy refuses change nothing.
func (o *Online) StartFrom(values policy.Values) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	v := Apply(o.es, o.es.Incumbent(), o.cfg.BaseParams)
	for k, x := range values {
		v[k] = x
	}
	cfg := o.es.Config()
	cfg.Params = slices.Clone(o.tunable) // StartFrom filters in place
	if err := cfg.StartFrom(o.cfg.Base, v); err != nil {
		return err
	}
	es, err := NewES(cfg)
	if err != nil {
		return err
	}
	inc, err := policy.New(o.cfg.Base, policy.Options{Params: Apply(es, es.Incumbent(), v)})
	if err != nil {
		return err
	}
	es.rng = o.es.rng // the random stream goes on
	o.es, o.cfg.ES, o.cfg.BaseParams, o.arms[0] = es, cfg, v, inc
	o.moved, o.known = false, nil
	if err := o.next(); err != nil {
		o.arms[1] = o.arms[0]
	}
	return nil
}

// Resets returns how many times the fleet's changes sent the tuner back to
// its starting weights from weights it had learned, and why the last time.
func (o *Online) Resets() (n int, why string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.resets, o.why
}

// Learn records an outcome for its arm; outcomes of earlier rounds are
// dropped, and under slo-p95 those of requests without SLOs (a window is
// then a window of requests with SLOs: one without any never fills, and
// judges nothing). When both arms have a window of outcomes, the
// candidate is judged.
func (o *Online) Learn(tag int, s policy.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.paused || tag < 0 || tag/2 != o.round || o.sloOnly && !s.HasSLO() || s.Unstreamed && !o.wholeToo ||
		o.perToken && !s.Failed && s.Tokens == 0 { // no length to divide by
		return
	}
	arm := tag % 2
	w, early := o.cfg.Window, o.cfg.EarlyStop > 1
	if len(o.samples[arm]) >= 2*w {
		// Only the latest window is judged: an arm whose blocks get all
		// the traffic (the other's get none) must not grow its samples
		// without bound.
		o.samples[arm] = append(o.samples[arm][:0], o.samples[arm][len(o.samples[arm])-w+1:]...)
		if early {
			o.tallies[arm].rebuild(o.samples[arm])
		}
	}
	o.samples[arm] = append(o.samples[arm], s)
	if early {
		o.tallies[arm].add(s)
	}
	if len(o.samples[0]) < w || len(o.samples[1]) < w {
		if early && min(len(o.samples[0]), len(o.samples[1])) >= max(w/4, 1) {
			cand, inc := o.tallies[1].metrics(), o.tallies[0].metrics()
			if reason := o.es.Losing(cand, inc, o.cfg.EarlyStop); reason != "" {
				o.verdict(o.es.Drop(o.cand, cand, inc, "dropped early: "+reason))
			}
		}
		return
	}
	inc := Measure(o.samples[0][len(o.samples[0])-w:])
	cand := Measure(o.samples[1][len(o.samples[1])-w:])
	if o.cfg.Confirm && !o.confirming && o.es.Verdict(o.cand, cand, inc).Accepted {
		o.confirming = true
		o.restart() // the same candidate, measured again
		return
	}
	o.verdict(o.es.Judge(o.cand, cand, inc))
}

// verdict records the candidate's judgement, takes it as the incumbent if
// accepted, and starts a round with a new candidate.
func (o *Online) verdict(out Outcome) {
	o.confirming = false
	out.Values = o.es.Named(out.Candidate)
	if len(o.steps) == o.cfg.History {
		o.steps = append(o.steps[:0], o.steps[1:]...)
	}
	o.steps = append(o.steps, out)
	o.judged++
	if out.Accepted {
		o.accepted++
		o.moved = true
		o.arms[0] = o.arms[1]
	}
	if err := o.next(); err != nil {
		// Cannot happen with finite bounds (NewES checks them); keep
		// routing with the incumbent rather than judge a phantom arm.
		o.arms[1] = o.arms[0]
	}
}

// Incumbent returns the current best values of the base's parameters.
func (o *Online) Incumbent() policy.Values {
	o.mu.Lock()
	defer o.mu.Unlock()
	return Apply(o.es, o.es.Incumbent(), o.cfg.BaseParams)
}

// Steps returns the latest verdicts (at most OnlineConfig.History).
func (o *Online) Steps() []Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.steps)
}

// Round is the round under way, as an operator sees it.
type Round struct {
	// Candidate is the tuned parameters' values being tried (as a
	// verdict's, Named).
	Candidate map[string]float64
	// Confirming: the candidate won a round and is measured again.
	Confirming bool
	// Scored is how many outcomes each arm has (incumbent, candidate) of
	// the Window that judge it.
	Scored [2]int
	Window int
}

// Round returns the round under way.
func (o *Online) Round() Round {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.cfg.Window
	return Round{Candidate: o.es.Named(o.cand), Confirming: o.confirming,
		Scored: [2]int{min(len(o.samples[0]), w), min(len(o.samples[1]), w)}, Window: w}
}

// Objective describes what the tuner minimises and the guards a candidate
// must keep, e.g. "p95-ttft, guards e2e-p95=1.05".
func (o *Online) Objective() string {
	o.mu.Lock()
	c := o.es.Config()
	o.mu.Unlock()
	return objective(c)
}

// objective describes c's objective and guards (Online.Objective).
func objective(c Config) string {
	if len(c.Guards) == 0 {
		return string(c.Objective)
	}
	gs := make([]string, len(c.Guards))
	for i, g := range c.Guards {
		gs[i] = g.String()
	}
	return string(c.Objective) + ", guards " + strings.Join(gs, " ")
}

// Judges says which requests' outcomes the objective judges (the others
// are routed by the incumbent): for an operator who wonders why nothing is
// scored (a fleet whose clients do not stream, under a TTFT objective).
func (o *Online) Judges() string {
	switch {
	case o.sloOnly:
		return "streamed answers of requests with SLOs"
	case o.perToken:
		return "answers of a known length, streamed or whole"
	case o.wholeToo:
		return "answers, streamed or whole"
	}
	return "streamed answers"
}

// Counts returns how many candidates were judged and accepted so far.
func (o *Online) Counts() (judged, accepted int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.judged, o.accepted
}

// Unjudged returns how many decisions the objective could not judge, and
// the incumbent routed (Decide; a request's fallbacks ranked again after
// a failed attempt are one more): a fleet whose requests are all such
// learns nothing, and this says why.
func (o *Online) Unjudged() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.unjudged
}

// Config returns the configuration, defaults filled in (ES and
// BaseParams as StartFrom last set them).
func (o *Online) Config() OnlineConfig {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.cfg
}

// Base returns the name of the tuned policy.
func (o *Online) Base() string { return o.cfg.Base }

// IncumbentPolicy returns a fresh instance of the base policy with the
// incumbent weights: what the tuner would route with if it stopped now
// (to explain a decision without moving the tuner's arms).
func (o *Online) IncumbentPolicy() (policy.Policy, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.policy(o.es.Incumbent())
}

// Pause stops tuning: every request is routed with the incumbent, and
// outcomes are not judged. Resume starts a new round with a fresh
// candidate. Both are idempotent.
func (o *Online) Pause() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.paused = true
}

// Resume resumes tuning after Pause.
func (o *Online) Resume() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.paused {
		return nil
	}
	o.paused = false
	return o.next()
}

// Paused reports whether tuning is paused.
func (o *Online) Paused() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.paused
}

// Sigma returns the current step size.
func (o *Online) Sigma() float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.es.Sigma()
}

// ES returns the underlying strategy (for formatting points); do not call
// its methods while the tuner is in use.
func (o *Online) ES() *ES {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.es
}

var (
	_ policy.Tuner        = (*Online)(nil)
	_ policy.FleetWatcher = (*Online)(nil)
)
