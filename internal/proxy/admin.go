package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gorgo-llm/gorgo/internal/lifecycle"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// maxAdminJSON bounds an admin request's JSON body (decide's is a request
// body, bounded by max_body_bytes).
const maxAdminJSON = 1 << 20

func (s *Server) routes(g prometheus.Gatherer) {
	metrics := promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	s.mux = http.NewServeMux()
	client := []endpoint{
		{"POST", "/v1/chat/completions", s.guard(s.limitInFlight(s.handleCompletion(lifecycle.Chat)))},
		{"POST", "/v1/completions", s.guard(s.limitInFlight(s.handleCompletion(lifecycle.Completion)))},
		{"POST", "/v1/embeddings", s.guard(s.limitInFlight(s.handleCompletion(lifecycle.Input)))},
		{"POST", "/v1/responses", s.guard(s.limitInFlight(s.handleCompletion(lifecycle.Input)))},
		// Other OpenAI paths: POSTs routed by load, GETs answered by an
		// available replica.
		{"POST", "/v1/{rest...}", s.guard(s.limitInFlight(s.handleCompletion(lifecycle.Opaque)))},
		{"GET", "/v1/{rest...}", s.guard(s.handleModels)},
		{"GET", "/health", func(w http.ResponseWriter, r *http.Request) {
			for _, st := range s.rt.Replicas() {
				if st.Available() {
					w.WriteHeader(http.StatusOK)
					return
				}
			}
			w.Header().Set("Retry-After", "5")
			writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "no available replica")
		}},
		{"GET", "/metrics", metrics.ServeHTTP},
	}
	register(s.mux, client)

	s.admin = http.NewServeMux()
	admin := []endpoint{
		{"GET", "/metrics", metrics.ServeHTTP},
		{"GET", "/admin/replicas", s.adminReplicas},
		{"GET", "/admin/ui/stream", s.uiStream},
		{"POST", "/admin/replicas", s.adminAdd},
		{"DELETE", "/admin/replicas/{id}", s.adminMember(func(id string) error { return s.RemoveReplica(id) }, "remove")},
		{"POST", "/admin/replicas/{id}/drain", s.adminMember(s.rt.Drain, "drain")},
		{"POST", "/admin/replicas/{id}/undrain", s.adminMember(s.rt.Undrain, "undrain")},
		{"GET", "/admin/weights", s.adminWeights},
		{"PUT", "/admin/weights", s.adminSetWeights},
		{"GET", "/admin/tuner", s.adminTuner},
		{"POST", "/admin/tuner/pause", s.adminTunerPause(true)},
		{"POST", "/admin/tuner/resume", s.adminTunerPause(false)},
		{"POST", "/admin/decide", s.adminDecide},
	}
	// Go's profiler, for operators (behind the tokens like the rest).
	s.admin.HandleFunc("GET /debug/pprof/", pprof.Index)
	s.admin.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	s.admin.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	s.admin.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	register(s.admin, admin)
}

// endpoint is a method and a path pattern, and their handler.
type endpoint struct {
	method, pattern string
	h               http.HandlerFunc
}

// register adds the routes to mux; a known path asked with another method
// gets 405 with Allow, any other path 404, both in OpenAI's error shape.
// (Under a catch-all pattern, PREFIX{rest...}, the catch-all's methods
// take every path, and only other methods get the 405.)
func register(mux *http.ServeMux, endpoints []endpoint) {
	allowed := map[string][]string{}
	var catchAll []string
	for _, e := range endpoints {
		mux.HandleFunc(e.method+" "+e.pattern, e.h)
		allowed[e.pattern] = append(allowed[e.pattern], e.method)
		if prefix, ok := strings.CutSuffix(e.pattern, "{rest...}"); ok {
			catchAll = append(catchAll, prefix)
		}
	}
	for pattern, methods := range allowed {
		if !strings.HasSuffix(pattern, "{rest...}") && slices.ContainsFunc(catchAll, func(p string) bool { return strings.HasPrefix(pattern, p) }) {
			continue
		}
		allow := strings.Join(methods, ", ")
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, "MethodNotAllowedError", "%s %s: use %s", r.Method, r.URL.Path, allow)
		})
	}
	if allowed["/"] == nil {
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusNotFound, "NotFoundError", "no route for %s %s", r.Method, r.URL.Path)
		})
	}
}

// handleModels answers a GET (/v1/models, and any other GET under /v1)
// from the first available replica that answers.
func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	for _, st := range s.rt.Replicas() {
		u := s.upstream(st.ID)
		if !st.Available() || u == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(r.Context(), s.Config().HeaderTimeout)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.cfg.URL+r.URL.RequestURI(), nil)
		if err != nil {
			cancel()
			continue
		}
		req.Header = forwardHeaders(r)
		s.upstreamAuth(req.Header, u)
		resp, err := s.client.Do(req)
		if err != nil || resp.StatusCode >= 500 {
			if resp != nil {
				resp.Body.Close()
			}
			cancel()
			continue
		}
		copyHeaders(w.Header(), resp.Header)
		w.Header().Set(ReplicaHeader, st.ID)
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
		resp.Body.Close()
		cancel()
		return
	}
	writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "no available replica")
}

// minTokenLen is the shortest admin token accepted.
const minTokenLen = 16

// token is an admin bearer token and the name the log gives its holder.
type token struct{ name, secret string }

// tokens reads the configured admin tokens.
func (a AdminConfig) tokens() ([]token, error) {
	var out []token
	if a.TokenEnv != "" {
		v := strings.TrimSpace(os.Getenv(a.TokenEnv))
		if len(v) < minTokenLen {
			return nil, fmt.Errorf("config: admin.token_env: $%s is unset or shorter than %d characters", a.TokenEnv, minTokenLen)
		}
		out = append(out, token{name: "$" + a.TokenEnv, secret: v})
	}
	if a.TokenFile != "" {
		toks, err := readTokens(a.TokenFile, "admin.token_file")
		if err != nil {
			return nil, err
		}
		out = append(out, toks...)
	}
	return out, nil
}

// readTokens reads a file of secrets, one per line, each "SECRET" or
// "NAME SECRET" (a name for the logs; else FILE:LINE); blank lines and
// lines starting with # are skipped. Every secret is at least minTokenLen
// characters, and the file holds at least one.
func readTokens(path, what string) ([]token, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", what, err)
	}
	var out []token
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		switch len(f) {
		case 1:
			out = append(out, token{name: fmt.Sprintf("%s:%d", path, n), secret: f[0]})
		case 2:
			out = append(out, token{name: f[0], secret: f[1]})
		default:
			return nil, fmt.Errorf("config: %s %s:%d: want SECRET or NAME SECRET", what, path, n)
		}
		if len(out[len(out)-1].secret) < minTokenLen {
			return nil, fmt.Errorf("config: %s %s:%d: a secret must be at least %d characters", what, path, n, minTokenLen)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("config: %s %s holds no secret", what, path)
	}
	return out, nil
}

// match returns the name of the token the request's bearer credential is,
// comparing in constant time against every token; "" if none.
func match(r *http.Request, toks []token) string {
	given, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	name := ""
	for _, t := range toks {
		if ok && subtle.ConstantTimeCompare([]byte(given), []byte(t.secret)) == 1 {
			name = t.name
		}
	}
	return name
}

// validate refuses an admin listener that would be open to the network
// without a token.
func (a AdminConfig) validate() error {
	if a.Listen == AdminOff {
		return nil
	}
	host, _, err := net.SplitHostPort(a.Listen)
	if err != nil {
		return fmt.Errorf("config: admin.listen %q: %w", a.Listen, err)
	}
	if !loopback(host) && a.TokenFile == "" && a.TokenEnv == "" {
		return fmt.Errorf("config: admin.listen %s is not a loopback address: refusing to serve the admin API there without a token (set admin.token_file or admin.token_env)", a.Listen)
	}
	return nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

type whoKey struct{}

// who is the name of the admin token a request carried.
func who(r *http.Request) string {
	if n, ok := r.Context().Value(whoKey{}).(string); ok {
		return n
	}
	return "anonymous"
}

// authenticated lets through requests that carry one of the admin tokens
// (compared in constant time), or every request when none is configured
// (a loopback listener).
func (s *Server) authenticated(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		toks := *s.tokens.Load()
		if len(toks) == 0 {
			h.ServeHTTP(w, r)
			return
		}
		name := match(r, toks)
		if name == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="gorgo admin"`)
			writeError(w, http.StatusUnauthorized, "AuthenticationError", "a valid admin bearer token is required")
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), whoKey{}, name)))
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// decodeJSON reads a bounded JSON body, unknown fields refused.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if r.ContentLength > maxAdminJSON {
		writeError(w, http.StatusRequestEntityTooLarge, "BadRequestError", "the body is larger than %d bytes", maxAdminJSON)
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "malformed JSON: %v", err)
		return false
	}
	return true
}

// replicaJSON is a replica as the admin API shows it.
type replicaJSON struct {
	ID      string `json:"id"`
	URL     string `json:"url"`
	Region  string `json:"region"`
	Profile string `json:"profile,omitempty"`
	Source  string `json:"source"`
	// State is active, draining, removing, down (ejected by failures, or
	// failing its probes) or unprobed (no probe has reached it yet).
	State    string `json:"state"`
	Failures int    `json:"failures"` // in a row
	// Ejections counts the times it was ejected (reset once it stays up),
	// EjectedUntil when the current ejection ends.
	Ejections        int                  `json:"ejections"`
	EjectedUntil     *time.Time           `json:"ejected_until,omitempty"`
	RTTMS            float64              `json:"rtt_ms"`
	InFlight         int                  `json:"in_flight"`
	UnfinishedTokens int                  `json:"unfinished_tokens"`
	BacklogTokens    int                  `json:"backlog_tokens"`
	IndexBlocks      int                  `json:"index_blocks"`
	KVCapacityTokens int                  `json:"kv_capacity_tokens"`
	Engine           *policy.EngineGauges `json:"engine,omitempty"`
	EngineAgeS       *float64             `json:"engine_age_s,omitempty"`
	PrefillMSPerTok  float64              `json:"prefill_ms_per_token"`
	QueueMSPerTok    float64              `json:"queue_ms_per_token"`
	Decoding         int                  `json:"decoding"`
	ITLMS            float64              `json:"itl_ms"`
	ITLSlopeMS       float64              `json:"itl_slope_ms"`
	ITLSamples       int                  `json:"itl_samples"`
}

func (s *Server) replicaJSON(st router.ReplicaState) replicaJSON {
	out := replicaJSON{ID: st.ID, Region: st.Region, State: st.State.String(), RTTMS: float64(st.RTT.Microseconds()) / 1000,
		InFlight: st.InFlight, UnfinishedTokens: st.UnfinishedTokens, BacklogTokens: st.BacklogTokens, IndexBlocks: st.IndexBlocks,
		KVCapacityTokens: st.KVCapacityTokens, PrefillMSPerTok: st.PrefillMSPerToken, QueueMSPerTok: st.QueueMSPerToken,
		Decoding: st.Decoding, ITLMS: st.ITLBaseMS, ITLSlopeMS: st.ITLSlopeMS, ITLSamples: st.ITLSamples}
	switch {
	case st.State != router.Active:
	case !st.Healthy:
		out.State = "down"
	case !st.Probed:
		out.State = "unprobed"
	}
	if u := s.upstream(st.ID); u != nil {
		out.URL, out.Profile, out.Source = u.cfg.URL, u.cfg.Profile, u.source
		u.mu.Lock()
		out.Failures, out.Ejections = u.health.failures, u.health.ejections
		if until := u.health.until; time.Now().Before(until) {
			out.EjectedUntil = &until
		}
		u.mu.Unlock()
	}
	if st.EngineKnown {
		g, age := st.Engine, (s.now() - st.EngineAt).Seconds()
		out.Engine, out.EngineAgeS = &g, &age
	}
	return out
}

// adminReplicas shows every replica as the router sees it.
func (s *Server) adminReplicas(w http.ResponseWriter, r *http.Request) {
	out := []replicaJSON{}
	for _, st := range s.rt.Replicas() {
		out = append(out, s.replicaJSON(st))
	}
	writeJSON(w, http.StatusOK, map[string]any{"policy": s.policy.Name(), "replicas": out})
}

// adminAdd adds a replica: {"id","url","region","profile"}.
func (s *Server) adminAdd(w http.ResponseWriter, r *http.Request) {
	var in struct {
		ID      string `json:"id"`
		URL     string `json:"url"`
		Region  string `json:"region"`
		Profile string `json:"profile"`
	}
	if !decodeJSON(w, r, &in) {
		return
	}
	if in.ID == "" {
		writeError(w, http.StatusBadRequest, "BadRequestError", "id is required")
		return
	}
	err := s.AddReplica(ReplicaConfig{ID: in.ID, URL: in.URL, Region: in.Region, Profile: in.Profile}, sourceAdmin)
	switch {
	case errors.Is(err, router.ErrExists):
		writeError(w, http.StatusConflict, "ConflictError", "replica %s already exists", in.ID)
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
		return
	}
	s.log.Info("admin change", "who", who(r), "op", "add", "replica", in.ID, "url", in.URL)
	st, _ := s.rt.Replica(in.ID)
	writeJSON(w, http.StatusCreated, s.replicaJSON(st))
}

// adminMember applies a membership change to the replica in the path.
func (s *Server) adminMember(change func(id string) error, op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := change(id); err != nil {
			if errors.Is(err, router.ErrUnknown) {
				writeError(w, http.StatusNotFound, "NotFoundError", "no replica %s", id)
				return
			}
			writeError(w, http.StatusInternalServerError, "InternalServerError", "%v", err)
			return
		}
		s.log.Info("admin change", "who", who(r), "op", op, "replica", id)
		st, err := s.rt.Replica(id)
		if err != nil { // removed at once: it had nothing in flight
			writeJSON(w, http.StatusOK, map[string]any{"id": id, "state": "removed"})
			return
		}
		writeJSON(w, http.StatusOK, s.replicaJSON(st))
	}
}

// adminWeights shows the policy's parameters (for the online tuner, its
// incumbent's, with its base).
func (s *Server) adminWeights(w http.ResponseWriter, r *http.Request) {
	switch p := s.policy.(type) {
	case policy.Tunable:
		writeJSON(w, http.StatusOK, paramsJSON(s.policy.Name(), p.Params()))
	case *tune.Online:
		out := paramsJSON(s.policy.Name(), p.Incumbent())
		out["base"], out["tuned"] = p.Base(), true
		writeJSON(w, http.StatusOK, out)
	default:
		writeError(w, http.StatusNotFound, "NotFoundError", "policy %s has no weights", s.policy.Name())
	}
}

// adminSetWeights sets some of the policy's parameters: a JSON object of
// names and numbers; the others keep their values.
func (s *Server) adminSetWeights(w http.ResponseWriter, r *http.Request) {
	p, ok := s.policy.(policy.Tunable)
	if !ok {
		writeError(w, http.StatusConflict, "ConflictError", "policy %s has no weights to set (gorgo-online tunes its own)", s.policy.Name())
		return
	}
	var in map[string]*float64
	if !decodeJSON(w, r, &in) {
		return
	}
	v := p.Params()
	for k, x := range in {
		if x == nil {
			writeError(w, http.StatusBadRequest, "BadRequestError", "%s: want a number, got null", k)
			return
		}
		v[k] = *x
	}
	if err := p.SetParams(v); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
		return
	}
	info, _ := policy.Lookup(s.policy.Name())
	s.log.Info("admin change", "who", who(r), "op", "weights", "weights", info.Format(p.Params()))
	writeJSON(w, http.StatusOK, paramsJSON(s.policy.Name(), p.Params()))
}

// paramsJSON is a policy's parameters as the admin API shows them.
func paramsJSON(name string, v policy.Values) map[string]any {
	out := map[string]any{"policy": name}
	for k, x := range v {
		out[k] = x
	}
	return out
}

// adminDecide explains where a request would go: the body is a chat
// completion request; nothing is sent or recorded.
func (s *Server) adminDecide(w http.ResponseWriter, r *http.Request) {
	body := getBuffer()
	defer putBuffer(body)
	if err := readBody(r, body, s.cfg.Load().MaxBodyBytes); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "BadRequestError", "the request body is larger than %d bytes", tooBig.Limit)
			return
		}
		writeError(w, http.StatusBadRequest, "BadRequestError", "could not read the request body")
		return
	}
	req, perr := s.core.Begin(*body, lifecycle.Chat, r.Header.Get(SessionHeader), time.Now())
	if perr != nil {
		writeLifecycleError(w, perr)
		return
	}
	defer req.Discard()
	// A fresh instance of the policy (for the online tuner, its base with
	// the incumbent weights) and a random source of its own: explaining a
	// decision must not move a round-robin counter or a tuner's arms.
	pol, err := s.explainPolicy()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "InternalServerError", "%v", err)
		return
	}
	c, scored, err := s.rt.Explain(s.now(), &req.Route, pol, rand.New(rand.NewPCG(s.Config().Seed, 1)))
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "%v", err)
		return
	}
	scores := map[string]policy.Terms{}
	for _, sc := range scored {
		scores[sc.ID] = sc.Terms
	}
	out := map[string]any{"replica": c.ID, "prompt_tokens": req.Route.PromptTokens, "expected_output_tokens": req.Route.ExpectedOutputTokens,
		"est_cached_tokens": c.EstCachedTokens, "policy": pol.Name(), "scores": scores}
	if best, floor, err := s.rt.Predict(s.now(), &req.Route); err == nil {
		out["predicted_ttft_ms"], out["predicted_ttft_idle_ms"] = float64(best.Microseconds())/1000, float64(floor.Microseconds())/1000
	}
	writeJSON(w, http.StatusOK, out)
}

// explainPolicy returns a fresh instance of the proxy's policy.
func (s *Server) explainPolicy() (policy.Policy, error) {
	cfg := s.Config()
	opts := cfg.PolicyOptions(s.policy.Name())
	switch p := s.policy.(type) {
	case *tune.Online:
		return p.IncumbentPolicy()
	case policy.Tunable:
		opts.Params = p.Params()
	}
	return policy.New(s.policy.Name(), opts)
}

// adminTuner shows the online tuner's state, when the policy tunes itself.
func (s *Server) adminTuner(w http.ResponseWriter, r *http.Request) {
	o, ok := s.policy.(*tune.Online)
	if !ok {
		writeError(w, http.StatusNotFound, "NotFoundError", "policy %s does not tune itself", s.policy.Name())
		return
	}
	judged, accepted := o.Counts()
	writeJSON(w, http.StatusOK, map[string]any{"base": o.Base(), "incumbent": o.Incumbent(), "sigma": o.Sigma(), "paused": o.Paused(),
		"judged": judged, "accepted": accepted, "history": o.Steps()})
}

func (s *Server) adminTunerPause(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		o, ok := s.policy.(*tune.Online)
		if !ok {
			writeError(w, http.StatusNotFound, "NotFoundError", "policy %s does not tune itself", s.policy.Name())
			return
		}
		op := "tuner resume"
		if pause {
			op = "tuner pause"
			o.Pause()
		} else if err := o.Resume(); err != nil {
			writeError(w, http.StatusInternalServerError, "InternalServerError", "%v", err)
			return
		}
		s.log.Info("admin change", "who", who(r), "op", op)
		writeJSON(w, http.StatusOK, map[string]any{"paused": o.Paused()})
	}
}
