package tune

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// State is what an online tuner has learned, to resume it after a restart
// (gorgo serve's tuner_state): the policy it tunes and what it minimises
// (Online.Objective), the base's values it started from (all of them:
// the tuned parameters' starts and the others'), its incumbent's, its
// step size, and how far the incumbent has moved on each guarded metric
// since the start (so that a restart does not give the guard its whole
// allowance again); and the replicas it was learned with (Fleet: those a
// resumed state named and the tuner has not heard of since, to which the
// caller adds the fleet's own, a tuner knowing no replicas), whose
// joining after a restart is no change of the fleet; and whether an
// operator paused it. A round's outcomes are not kept:
// the first round after a restart starts afresh. FirstSigma is the step
// size the tuner was configured to start with: an operator who set
// another means it, and the restored tuner takes it.
type State struct {
	Policy     string             `json:"policy"`
	Objective  string             `json:"objective"`
	Start      map[string]float64 `json:"start"`
	Incumbent  map[string]float64 `json:"incumbent"`
	Sigma      float64            `json:"sigma"`
	FirstSigma float64            `json:"first_sigma"`
	Drift      map[string]float64 `json:"drift,omitempty"`
	Fleet      []string           `json:"fleet,omitempty"`
	// Paused: an operator paused the tuner (Online.Pause), and a restart
	// keeps it paused until they resume it.
	Paused bool `json:"paused,omitempty"`
}

// Equal reports whether s and t are the same state.
func (s State) Equal(t State) bool {
	return s.Policy == t.Policy && s.Objective == t.Objective && s.Sigma == t.Sigma && s.FirstSigma == t.FirstSigma && s.Paused == t.Paused &&
		maps.Equal(s.Start, t.Start) && maps.Equal(s.Incumbent, t.Incumbent) && maps.Equal(s.Drift, t.Drift) && slices.Equal(s.Fleet, t.Fleet)
}

// Moved reports whether the incumbent is not the start.
func (s State) Moved() bool { return !maps.Equal(s.Start, s.Incumbent) }

// State returns what the tuner has learned so far.
func (o *Online) State() State {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.es
	s := State{Policy: o.cfg.Base, Objective: objective(e.cfg), Start: o.start(), Incumbent: Apply(e, e.inc, o.cfg.BaseParams),
		Sigma: e.sigma, FirstSigma: e.cfg.Sigma, Paused: o.paused}
	if len(o.known) > 0 {
		s.Fleet = slices.Sorted(maps.Keys(o.known))
	}
	for i, g := range e.cfg.Guards {
		if s.Drift == nil {
			s.Drift = map[string]float64{}
		}
		s.Drift[g.Metric] = e.drift[i]
	}
	return s
}

// Restore resumes what a tuner with the same start learned (State): its
// incumbent routes, and is measured against a new candidate drawn from the
// restored step size (the configured first one if that changed), or
// paused if it was. A fleet
// change falls back to the start, as before the restart, but for one of
// the state's replicas joining (FleetChanged). It refuses, changing
// nothing, a state of another policy, another objective or another start
// (the operator changed the weights, any of them, or the parameters
// tuned, or what they minimise: they win), or one whose values are out of
// the tuner's bounds.
func (o *Online) Restore(s State) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.es
	if s.Policy == "" {
		return fmt.Errorf("it names no policy")
	}
	if policy.Canonical(s.Policy) != o.cfg.Base {
		return fmt.Errorf("it is the tuner's of %s; this one tunes %s", s.Policy, o.cfg.Base)
	}
	if obj := objective(e.cfg); s.Objective != obj {
		return fmt.Errorf("it was learned for %q; this tuner minimises %q", s.Objective, obj)
	}
	start := o.start()
	if !maps.Equal(start, s.Start) {
		return fmt.Errorf("it started from %s, this tuner from %s (the weights or the parameters tuned changed since)", formatValues(s.Start), formatValues(start))
	}
	inc := make(Point, len(e.cfg.Params))
	tuned := map[string]bool{}
	for i, p := range e.cfg.Params {
		v, ok := s.Incumbent[p.Name]
		if !ok || !(v >= p.Min && v <= p.Max) {
			return fmt.Errorf("its incumbent %s = %v is outside [%v, %v]", p.Name, s.Incumbent[p.Name], p.Min, p.Max)
		}
		inc[i], tuned[p.Name] = v, true
	}
	for k, v := range s.Incumbent {
		if w, ok := start[k]; !ok || !tuned[k] && v != w {
			return fmt.Errorf("its incumbent %s moved %s, which this tuner does not tune", formatValues(s.Incumbent), k)
		}
	}
	if len(s.Incumbent) != len(start) {
		return fmt.Errorf("its incumbent %s lacks some of the base's parameters %s", formatValues(s.Incumbent), formatValues(start))
	}
	drift := make([]float64, len(e.cfg.Guards))
	for i, g := range e.cfg.Guards {
		d, ok := s.Drift[g.Metric]
		if !ok || !(d > 0) || math.IsInf(d, 0) {
			return fmt.Errorf("its drift of %s is %v, want a positive ratio", g.Metric, s.Drift[g.Metric])
		}
		drift[i] = d
	}
	if !(s.Sigma >= e.cfg.SigmaMin && s.Sigma <= e.cfg.SigmaMax) {
		return fmt.Errorf("its step size %v is outside [%v, %v]", s.Sigma, e.cfg.SigmaMin, e.cfg.SigmaMax)
	}
	p, err := o.policy(inc)
	if err != nil {
		return err
	}
	sigma := s.Sigma
	if s.FirstSigma != 0 && s.FirstSigma != e.cfg.Sigma { // 0: not said
		sigma = e.cfg.Sigma // the operator's new first step
	}
	e.inc, e.drift, e.sigma = inc, drift, sigma
	o.arms[0] = p
	o.moved, o.paused = s.Moved(), s.Paused
	o.known = map[string]bool{}
	for _, id := range s.Fleet {
		o.known[id] = true
	}
	if err := o.next(); err != nil {
		o.arms[1] = o.arms[0]
	}
	return nil
}

// start is the base's values the tuner started from: the tuned
// parameters' starts, the others' values. Call with o.mu held.
func (o *Online) start() map[string]float64 {
	first := make(Point, len(o.es.cfg.Params))
	for i, p := range o.es.cfg.Params {
		first[i] = p.Init
	}
	return Apply(o.es, first, o.cfg.BaseParams)
}

// formatValues writes values as name=value, sorted by name.
func formatValues(v map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(v)) {
		parts = append(parts, fmt.Sprintf("%s=%v", k, v[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}
