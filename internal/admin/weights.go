package admin

import (
	"encoding/json"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/httpapi"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// weights shows the policy's parameters (for the online tuner, its
// incumbent's, with its base).
func (s *Server) weights(w http.ResponseWriter, r *http.Request) {
	p := s.fleet.Policy()
	v := fleet.Params(p)
	if v == nil {
		httpapi.Error(w, http.StatusNotFound, "policy %s has no weights", p.Name())
		return
	}
	out := paramsJSON(p.Name(), v)
	if t, ok := p.(policy.Tuner); ok {
		out["base"], out["tuned"] = t.Base(), true
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// setWeights sets some of the policy's parameters: a JSON object of names
// and numbers; the others keep their values. The policy validates them.
// An online tuner starts from them afresh (policy.Tuner.StartFrom): the
// operator's weights are its incumbent, and its start from then on.
func (s *Server) setWeights(w http.ResponseWriter, r *http.Request) {
	pol := s.fleet.Policy()
	p, tunable := pol.(policy.Tunable)
	o, tuned := pol.(policy.Tuner)
	if !tunable && !tuned {
		httpapi.Error(w, http.StatusConflict, "policy %s has no weights to set", pol.Name())
		return
	}
	name := pol.Name()
	if tuned {
		name = o.Base()
	}
	var in map[string]json.RawMessage
	if !httpapi.DecodeJSON(w, r, &in, maxJSON) {
		return
	}
	v := policy.Values{}
	for k, raw := range in {
		if k == policy.FileKey {
			// Whose they are, as the GET shows them and gorgo tune writes
			// them: the running policy's, or refused.
			var named string
			if json.Unmarshal(raw, &named) != nil || policy.Canonical(named) != name && !(tuned && named == pol.Name()) {
				httpapi.Error(w, http.StatusBadRequest, "these are the weights of %s; the router runs %s", raw, name)
				return
			}
			continue
		}
		var x *float64
		if err := json.Unmarshal(raw, &x); err != nil || x == nil {
			httpapi.Error(w, http.StatusBadRequest, "%s: want a number, got %s", k, raw)
			return
		}
		v[k] = *x
	}
	if tuned && len(v) > 0 { // none given: nothing to start from afresh
		if err := o.StartFrom(v); err != nil {
			httpapi.Error(w, http.StatusBadRequest, "%v", err)
			return
		}
		s.log.Info("admin change", "who", who(r), "op", "weights", "weights", policy.Format(name, o.Incumbent()), "tuner", "starts from them")
	}
	if !tuned {
		all := p.Params()
		maps.Copy(all, v)
		if err := p.SetParams(all); err != nil {
			httpapi.Error(w, http.StatusBadRequest, "%v", err)
			return
		}
		s.log.Info("admin change", "who", who(r), "op", "weights", "weights", policy.Format(p.Name(), p.Params()))
	}
	s.weights(w, r) // the parameters now, as GET shows them
}

// paramsJSON is a policy's parameters as the admin API shows them.
func paramsJSON(name string, v policy.Values) map[string]any {
	out := map[string]any{"policy": name}
	for k, x := range v {
		out[k] = x
	}
	return out
}

// tuner shows the online tuner's state, when the policy tunes itself.
func (s *Server) tuner(w http.ResponseWriter, r *http.Request) {
	o, ok := s.fleet.Policy().(*tune.Online)
	if !ok {
		httpapi.Error(w, http.StatusNotFound, "policy %s does not tune itself", s.fleet.Policy().Name())
		return
	}
	judged, accepted := o.Counts()
	resets, why := o.Resets()
	out := map[string]any{"base": o.Base(), "objective": o.Objective(), "judges": o.Judges(), "unjudged_decisions": o.Unjudged(), "incumbent": o.Incumbent(), "sigma": o.Sigma(), "paused": o.Paused(),
		"round": roundOf(o), "judged": judged, "accepted": accepted, "history": tunerSteps(o, 0), "fallbacks": resets, "last_fallback": why}
	if fn := s.tunerFile.Load(); fn != nil {
		out["state_file"] = (*fn)()
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// tunerRound is the online tuner's round under way as the admin API shows
// it.
type tunerRound struct {
	Candidate  map[string]float64 `json:"candidate"` // the tuned parameters' values being tried
	Confirming bool               `json:"confirming"`
	Window     int                `json:"window"`
	// Scored is how many outcomes each arm has of its window.
	Scored struct {
		Incumbent int `json:"incumbent"`
		Candidate int `json:"candidate"`
	} `json:"scored"`
}

func roundOf(o *tune.Online) tunerRound {
	r := o.Round()
	out := tunerRound{Candidate: r.Candidate, Confirming: r.Confirming, Window: r.Window}
	out.Scored.Incumbent, out.Scored.Candidate = r.Scored[0], r.Scored[1]
	return out
}

// tunerStep is one verdict of the online tuner as the admin API shows it.
type tunerStep struct {
	Candidate      map[string]float64 `json:"candidate"` // the tuned parameters' values
	Score          *float64           `json:"score"`     // the objective's, the candidate's; null where undefined
	IncumbentScore *float64           `json:"incumbent_score"`
	Accepted       bool               `json:"accepted"`
	Reason         string             `json:"reason,omitempty"` // why not: worse, a guard, dropped early
	Sigma          float64            `json:"sigma"`            // the step size after it
}

// tunerSteps returns the tuner's latest verdicts, at most last (0: all it
// keeps), oldest first; never nil.
func tunerSteps(o *tune.Online, last int) []tunerStep {
	steps := o.Steps()
	if last > 0 {
		steps = steps[max(0, len(steps)-last):]
	}
	out := make([]tunerStep, len(steps))
	for i, s := range steps {
		// Candidate: the values as the parameters were named then.
		out[i] = tunerStep{Candidate: s.Values, Score: finite(s.Score), IncumbentScore: finite(s.Incumbent), Accepted: s.Accepted, Reason: s.Reason, Sigma: s.Sigma}
	}
	return out
}

// finite is x, or nil where JSON cannot say it: an objective over a window
// whose requests all failed is NaN.
func finite(x float64) *float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return nil
	}
	return &x
}

func (s *Server) pauseTuner(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		o, ok := s.fleet.Policy().(*tune.Online)
		if !ok {
			httpapi.Error(w, http.StatusNotFound, "policy %s does not tune itself", s.fleet.Policy().Name())
			return
		}
		op := "tuner resume"
		if pause {
			op = "tuner pause"
			o.Pause()
		} else if err := o.Resume(); err != nil {
			httpapi.Error(w, http.StatusInternalServerError, "%v", err)
			return
		}
		s.log.Info("admin change", "who", who(r), "op", op)
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"paused": o.Paused()})
	}
}

// decide explains where a request would go: the body is a chat completion
// request; nothing is sent or recorded.
func (s *Server) decide(w http.ResponseWriter, r *http.Request) {
	body := httpapi.GetBuffer()
	defer httpapi.PutBuffer(body)
	if err := httpapi.ReadBody(r, body, maxDecideBody, nil); err != nil {
		httpapi.WriteError(w, httpapi.BodyError(err))
		return
	}
	req, perr := s.fleet.Core().DryRun(*body, r.Header.Get("X-Session-ID"))
	if perr != nil {
		httpapi.WriteError(w, perr)
		return
	}
	defer req.Discard()
	// A fresh instance of the policy (for an online tuner, its base with
	// the incumbent's parameters) and a random source of its own:
	// explaining a decision must not move a round-robin counter or a
	// tuner's arms.
	pol, err := s.explainPolicy()
	if err != nil {
		httpapi.Error(w, http.StatusInternalServerError, "%v", err)
		return
	}
	now := s.fleet.Now()
	c, scored, err := s.fleet.Router().Explain(now, &req.Route, pol, rand.New(rand.NewPCG(s.fleet.Config().Seed, 1)))
	if err != nil {
		httpapi.Error(w, http.StatusServiceUnavailable, "%v", err)
		return
	}
	scores := map[string]policy.Terms{}
	for _, sc := range scored {
		scores[sc.ID] = sc.Terms
	}
	out := map[string]any{"replica": c.ID, "prompt_tokens": req.Route.PromptTokens, "expected_output_tokens": req.Route.ExpectedOutputTokens,
		"est_cached_tokens": c.EstCachedTokens, "policy": pol.Name(), "scores": scores, "model": req.Route.Model}
	if c.Adapter != "" {
		// What the decision priced there: 0 where the adapter is resident.
		out["adapter"], out["adapter_load_ms"], out["adapter_wait_ms"] = c.Adapter, c.AdapterLoadMS, c.WeightsWaitMS
	}
	if f, err := s.fleet.Router().Predict(now, &req.Route); err == nil {
		out["predicted_ttft_ms"], out["predicted_ttft_idle_ms"] = float64(f.Best.Microseconds())/1000, float64(f.Floor.Microseconds())/1000
		out["replicas_waiting_least"] = f.Waiting
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// explainPolicy returns a fresh instance of the fleet's policy with its
// parameters now (an online tuner's base with the incumbent's).
func (s *Server) explainPolicy() (policy.Policy, error) {
	cfg := s.fleet.Config()
	p := s.fleet.Policy()
	name := p.Name()
	if t, ok := p.(policy.Tuner); ok {
		name = t.Base()
	}
	opts := cfg.PolicyOptions(name)
	if v := fleet.Params(p); v != nil {
		opts.Params = v
	}
	return policy.New(name, opts)
}
