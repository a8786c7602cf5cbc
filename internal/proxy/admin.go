package proxy

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gorgo-llm/gorgo/internal/route"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

func (s *Server) routes(g prometheus.Gatherer) {
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/chat/completions", s.handleCompletion(true))
	s.mux.HandleFunc("POST /v1/completions", s.handleCompletion(false))
	s.mux.HandleFunc("GET /v1/models", s.handleModels)
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		for _, st := range s.rt.Snapshot() {
			if st.Healthy {
				w.WriteHeader(http.StatusOK)
				return
			}
		}
		writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "no healthy replica")
	})
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("GET /admin/replicas", s.adminReplicas)
	s.mux.HandleFunc("POST /admin/decide", s.adminDecide)
	s.mux.HandleFunc("GET /admin/tuner", s.adminTuner)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "NotFoundError", "no route for %s %s", r.Method, r.URL.Path)
	})
}

// handleModels answers from the first healthy replica that answers.
func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	for i, st := range s.rt.Snapshot() {
		if !st.Healthy {
			continue
		}
		resp, err := s.send(r, s.reps[i], nil)
		if err != nil {
			continue
		}
		defer resp.Body.Close()
		copyHeaders(w.Header(), resp.Header)
		w.Header().Set(ReplicaHeader, s.reps[i].cfg.ID)
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
		return
	}
	writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "no healthy replica")
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// adminReplicas shows every replica as the router sees it.
func (s *Server) adminReplicas(w http.ResponseWriter, r *http.Request) {
	type replica struct {
		ID, URL, Region      string
		Healthy              bool
		Failures             int
		RTTMS                float64
		InFlight             int
		UnfinishedTokens     int
		BacklogTokens        int
		IndexBlocks          int
		Engine               route.EngineGauges
		EngineKnown          bool
		EngineAgeS           float64
		PrefillMS, QueueMSPT float64
	}
	now := s.now()
	var out []replica
	for i, st := range s.rt.Snapshot() {
		u := s.reps[i]
		u.mu.Lock()
		f := u.failures
		u.mu.Unlock()
		rep := replica{ID: st.ID, URL: u.cfg.URL, Region: st.Region, Healthy: st.Healthy, Failures: f, RTTMS: st.RTT.Seconds() * 1000,
			InFlight: st.InFlight, UnfinishedTokens: st.UnfinishedTokens, BacklogTokens: st.BacklogTokens, IndexBlocks: st.IndexBlocks,
			Engine: st.Engine, EngineKnown: st.EngineKnown, PrefillMS: st.PrefillMSPerToken, QueueMSPT: st.QueueMSPerToken}
		if st.EngineKnown {
			rep.EngineAgeS = (now - st.EngineAt).Seconds()
		}
		out = append(out, rep)
	}
	writeJSON(w, map[string]any{"policy": s.policy.Name(), "replicas": out})
}

// adminDecide explains where a request would go: the body is a chat
// completion request; nothing is sent or recorded.
func (s *Server) adminDecide(w http.ResponseWriter, r *http.Request) {
	_, req, _, err := s.parse(r, true)
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
		return
	}
	// A fresh instance of the policy (for the online tuner, gorgo with its
	// incumbent weights) and a random source of its own: explaining a
	// decision must not move a round-robin counter or a tuner's arms.
	pol, err := s.explainPolicy()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "InternalServerError", "%v", err)
		return
	}
	t, d, err := s.rt.Explain(s.now(), &req, pol, rand.New(rand.NewPCG(s.cfg.Seed, 1)))
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "%v", err)
		return
	}
	scores := map[string]route.Terms{}
	for i, sc := range d.Scores {
		scores[s.reps[i].cfg.ID] = sc
	}
	writeJSON(w, map[string]any{"replica": s.reps[t.Replica].cfg.ID, "prompt_tokens": req.PromptTokens,
		"est_cached_tokens": t.EstCachedTokens, "policy": pol.Name(), "scores": scores})
}

// explainPolicy returns a fresh instance of the proxy's policy.
func (s *Server) explainPolicy() (route.Policy, error) {
	opts := route.Options{TieMargin: s.cfg.TieMargin}
	if s.cfg.Weights != nil {
		opts.Weights = *s.cfg.Weights
	}
	if s.cfg.MSWeights != nil {
		opts.MSWeights = *s.cfg.MSWeights
	}
	if o, ok := s.policy.(*tune.Online); ok {
		opts.Weights = o.Incumbent()
		return route.New("gorgo", opts)
	}
	return route.New(s.policy.Name(), opts)
}

// adminTuner shows the online tuner's state, when the policy tunes itself.
func (s *Server) adminTuner(w http.ResponseWriter, r *http.Request) {
	o, ok := s.policy.(*tune.Online)
	if !ok {
		writeError(w, http.StatusNotFound, "NotFoundError", "policy %s does not tune itself", s.policy.Name())
		return
	}
	steps := o.Steps()
	writeJSON(w, map[string]any{"incumbent": o.Incumbent(), "steps": len(steps), "sigma": o.Sigma(), "history": steps})
}
