// Package proxy is gorgo serve's data plane: the OpenAI-compatible HTTP
// front end over a fleet (internal/fleet). For each request it reads the
// body (bounded), and the lifecycle (internal/lifecycle) drives the rest:
// the proxy forwards each attempt to the replica chosen, relays the answer
// as it comes and hands the replica's events back. Around that, the client
// listener's limits, client authentication, rate limits and TLS.
package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/httpapi"
	"github.com/gorgo-llm/gorgo/internal/lifecycle"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// Headers the proxy reads and sets.
const (
	// SessionHeader names the conversation a request belongs to (else the
	// request's "user" field is used).
	SessionHeader = "X-Session-ID"
	// ReplicaHeader, on every forwarded response, names the replica that
	// served it.
	ReplicaHeader = "X-Gorgo-Replica"
	// MissedHeader, on an adapter's load that some replicas took, names
	// those that did not (they refused it, or were not reached).
	MissedHeader = "X-Gorgo-Missed"
)

// Server is the HTTP front end. Create it with New and serve Handler on the
// client listener.
type Server struct {
	cfg    atomic.Pointer[Config]
	fleet  *fleet.Fleet
	keys   atomic.Pointer[[]httpapi.Token]
	cert   atomic.Pointer[tls.Certificate]
	limits atomic.Pointer[limiters]
	m      *metrics
	mux    *http.ServeMux
	log    *slog.Logger

	inFlight atomic.Int64   // requests being served
	bodies   httpapi.Budget // request bodies being read and served
	answers  httpapi.Budget // whole answers being held, past answerBase each
}

// New returns the front end of a fleet: its config (defaults applied
// here), the registry its metrics join, what it serves at /metrics, and
// the log of failed attempts (nil: discarded).
func New(f *fleet.Fleet, cfg Config, reg prometheus.Registerer, metrics prometheus.Gatherer, log *slog.Logger) (*Server, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	keys, err := cfg.Auth.keys()
	if err != nil {
		return nil, err
	}
	cert, err := cfg.TLS.load()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{fleet: f, log: log, m: newMetrics(reg)}
	s.cfg.Store(&cfg)
	s.bodies.SetMax(cfg.MaxBodyBytesInFlight)
	s.answers.SetMax(cfg.MaxAnswerBytesInFlight)
	s.keys.Store(&keys)
	s.cert.Store(cert)
	s.limits.Store(newLimiters(cfg.RateLimit))
	s.routes(metrics)
	return s, nil
}

// Config returns the running config.
func (s *Server) Config() Config { return *s.cfg.Load() }

// Handler serves the OpenAI API, /health and /metrics to clients, every
// answer with an X-Request-Id (answerRequestID).
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answerRequestID(w, r)
		s.mux.ServeHTTP(w, r)
	})
}

// Prepare judges next as the running config, for a reload: the client
// listener's settings cannot change while it serves (restart lists them)
// and neither can TLS be turned on or off (an error); apply makes the rest
// the running config: client keys, the certificate (renewed), rate limits,
// body and answer limits, requests in flight and the attempts' timeouts.
func (s *Server) Prepare(next Config) (apply func(), restart []string, err error) {
	next = next.Defaults()
	cur := s.Config()
	keep := func(name string, a, b any, reset func()) {
		if a != b {
			restart = append(restart, fmt.Sprintf("%s (running %v, file %v)", name, a, b))
			reset()
		}
	}
	keep("listen", cur.Listen, next.Listen, func() { next.Listen = cur.Listen })
	keep("max_connections", cur.MaxConnections, next.MaxConnections, func() { next.MaxConnections = cur.MaxConnections })
	keep("idle_timeout", cur.IdleTimeout, next.IdleTimeout, func() { next.IdleTimeout = cur.IdleTimeout })
	keep("read_header_timeout", cur.ReadHeaderTimeout, next.ReadHeaderTimeout, func() { next.ReadHeaderTimeout = cur.ReadHeaderTimeout })
	keep("shutdown_timeout", cur.ShutdownTimeout, next.ShutdownTimeout, func() { next.ShutdownTimeout = cur.ShutdownTimeout })
	if err := next.Validate(); err != nil {
		return nil, restart, err
	}
	keys, err := next.Auth.keys()
	if err != nil {
		return nil, restart, err
	}
	cert, err := next.TLS.load()
	if err != nil {
		return nil, restart, err
	}
	if (cert == nil) != (s.cert.Load() == nil) {
		return nil, restart, errors.New("config: turning TLS on or off needs a restart (a reload only renews the certificate)")
	}
	return func() {
		s.cfg.Store(&next)
		s.bodies.SetMax(next.MaxBodyBytesInFlight)
		s.answers.SetMax(next.MaxAnswerBytesInFlight)
		s.keys.Store(&keys)
		if cert != nil {
			s.cert.Store(cert)
		}
		if next.RateLimit != cur.RateLimit {
			s.limits.Store(newLimiters(next.RateLimit))
		}
	}, restart, nil
}

func (s *Server) routes(g prometheus.Gatherer) {
	metrics := promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	s.mux = http.NewServeMux()
	api := func(kind lifecycle.Kind) http.HandlerFunc { return s.guard(s.limitInFlight(s.handleCompletion(kind))) }
	httpapi.Register(s.mux, []httpapi.Endpoint{
		{Method: "POST", Pattern: "/v1/chat/completions", Handler: api(lifecycle.Chat)},
		{Method: "POST", Pattern: "/v1/completions", Handler: api(lifecycle.Completion)},
		{Method: "POST", Pattern: "/v1/embeddings", Handler: api(lifecycle.Input)},
		{Method: "POST", Pattern: "/v1/responses", Handler: api(lifecycle.Input)},
		// SGLang's native API, routed on its text or token ids.
		{Method: "POST", Pattern: "/generate", Handler: api(lifecycle.Generate)},
		{Method: "PUT", Pattern: "/generate", Handler: api(lifecycle.Generate)}, // SGLang takes both
		{Method: "GET", Pattern: "/v1/models", Handler: s.guard(s.listModels)},
		{Method: "GET", Pattern: "/v1/models/{id...}", Handler: s.guard(s.getModel)},
		// A stored response, its cancel and delete: no work for a model,
		// but for the replica that holds it, draining or not (handleGet).
		{Method: "GET", Pattern: "/v1/responses/{id}", Handler: s.guard(s.handleGet)},
		{Method: "POST", Pattern: "/v1/responses/{id}/cancel", Handler: s.guard(s.handleGet)},
		{Method: "DELETE", Pattern: "/v1/responses/{id}", Handler: s.guard(s.handleGet)},
		// Other OpenAI paths: POSTs routed by load, GETs answered by an
		// available replica.
		{Method: "POST", Pattern: "/v1/{rest...}", Handler: api(lifecycle.Opaque)},
		{Method: "GET", Pattern: "/v1/{rest...}", Handler: s.guard(s.handleGet)},
		// The engines' own endpoints outside /v1 (vLLM's and SGLang's
		// tokenizer, pooling and scoring APIs): routed by load, as other
		// POSTs; their version and model info from an available replica.
		{Method: "POST", Pattern: "/tokenize", Handler: api(lifecycle.Opaque)},
		{Method: "POST", Pattern: "/detokenize", Handler: api(lifecycle.Opaque)},
		{Method: "POST", Pattern: "/pooling", Handler: api(lifecycle.Opaque)},
		{Method: "POST", Pattern: "/classify", Handler: api(lifecycle.Opaque)},
		{Method: "POST", Pattern: "/score", Handler: api(lifecycle.Opaque)},
		{Method: "POST", Pattern: "/rerank", Handler: api(lifecycle.Opaque)},
		{Method: "POST", Pattern: "/v2/rerank", Handler: api(lifecycle.Opaque)},
		{Method: "POST", Pattern: "/encode", Handler: api(lifecycle.Opaque)},
		// SGLang takes these as PUT too.
		{Method: "PUT", Pattern: "/encode", Handler: api(lifecycle.Opaque)},
		{Method: "PUT", Pattern: "/classify", Handler: api(lifecycle.Opaque)},
		{Method: "POST", Pattern: "/v1/rerank", Handler: api(lifecycle.Opaque)},
		{Method: "PUT", Pattern: "/v1/rerank", Handler: api(lifecycle.Opaque)},
		// The engines' operations on their own state: sent to every
		// replica (operations.go).
		{Method: "POST", Pattern: "/flush_cache", Handler: s.guard(s.handleOperation)},
		{Method: "GET", Pattern: "/flush_cache", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/abort_request", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/abort_requests", Handler: s.guard(s.handleOperation)}, // vLLM's, by request_ids
		{Method: "POST", Pattern: "/reset_prefix_cache", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/v1/load_lora_adapter", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/v1/unload_lora_adapter", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/load_lora_adapter", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/unload_lora_adapter", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/update_weights_from_disk", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/pause_generation", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/continue_generation", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/pause", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/resume", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/sleep", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/wake_up", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/release_memory_occupation", Handler: s.guard(s.handleOperation)},
		{Method: "POST", Pattern: "/resume_memory_occupation", Handler: s.guard(s.handleOperation)},
		{Method: "GET", Pattern: "/release_memory_occupation", Handler: s.guard(s.handleOperation)}, // SGLang's, as POST
		{Method: "GET", Pattern: "/resume_memory_occupation", Handler: s.guard(s.handleOperation)},
		{Method: "GET", Pattern: "/version", Handler: s.guard(s.handleGet)},
		{Method: "GET", Pattern: "/get_model_info", Handler: s.guard(s.handleGet)},
		{Method: "GET", Pattern: "/get_server_info", Handler: s.guard(s.handleGet)},
		{Method: "GET", Pattern: "/health", Handler: s.health},
		{Method: "GET", Pattern: "/readyz", Handler: s.health},
		{Method: "GET", Pattern: "/livez", Handler: live},
		{Method: "GET", Pattern: "/metrics", Handler: metrics.ServeHTTP},
	})
}

// live is the router's liveness: 200 while it serves at all. A liveness
// probe pointed at /health (or /readyz, its readiness) would restart the
// router whenever no replica is available: all asleep while a trainer
// trains, or all down, when a restart mends nothing.
func live(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ok\n")
}

// health is 200 while a replica is available, else 503 (/health and
// /readyz: the router's readiness).
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	asleep := 0
	for _, st := range s.fleet.Router().Replicas() {
		if st.Available() {
			w.WriteHeader(http.StatusOK)
			return
		}
		if st.Asleep {
			asleep++
		}
	}
	w.Header().Set("Retry-After", "5")
	if asleep > 0 {
		httpapi.Error(w, http.StatusServiceUnavailable, "no available replica: %d asleep (put to sleep by a client, until woken)", asleep)
		return
	}
	httpapi.Error(w, http.StatusServiceUnavailable, "no available replica")
}

// handleGet answers a GET (/v1/models, and any other GET under /v1) from
// the first available replica that answers; a stored response's
// (/v1/responses/{id}...: a GET, or its cancel or DELETE, which carry no
// body) from the replica that stored it, draining or not (its 404 is
// relayed), else from the first that holds it. A replica's 404 for a path
// it has no route for (SGLang's /get_model_info on a vLLM replica, in a
// fleet of both) has the next asked.
func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	reps := s.fleet.Router().Replicas()
	stored := wire.StoredID(r.URL.Path)
	holder, held := s.fleet.Router().StoredAt(stored)
	if held {
		// The replica that stored the response first.
		if i := slices.IndexFunc(reps, func(st router.ReplicaState) bool { return st.ID == holder }); i > 0 {
			reps[0], reps[i] = reps[i], reps[0]
		}
	}
	last := -1       // the last replica that answered 404 for a stored response
	noRoute := false // a replica answered it has no such endpoint
	for i, st := range reps {
		u := s.fleet.Upstream(st.ID)
		// A draining holder still holds its store: a GET of it is no new
		// work (a client polling a background response's result), nor is
		// a cancel.
		keeps := held && st.ID == holder && st.Healthy && st.State != router.Active
		if !st.Available() && !keeps || u == nil {
			continue
		}
		// header_timeout bounds the wait for the answer's headers, not
		// its body: a stored response's replayed events
		// (?stream=true) last as long as its generation.
		ctx, cancel := context.WithCancel(r.Context())
		late := time.AfterFunc(s.Config().HeaderTimeout, cancel)
		req, err := http.NewRequestWithContext(ctx, r.Method, u.URL()+r.URL.RequestURI(), nil)
		if err != nil {
			late.Stop()
			cancel()
			continue
		}
		req.Header = forwardHeaders(r)
		s.upstreamAuth(req.Header, u)
		resp, err := s.fleet.Client().Do(req)
		if !late.Stop() && err == nil { // the headers came as it fired
			resp.Body.Close()
			err = context.DeadlineExceeded
		}
		if err != nil || resp.StatusCode >= 500 {
			if resp != nil {
				resp.Body.Close()
			}
			cancel()
			continue
		}
		var body io.Reader = resp.Body
		if resp.StatusCode == http.StatusNotFound {
			pre, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorPeek+1))
			switch {
			case err != nil:
				resp.Body.Close()
				cancel()
				continue
			case len(pre) <= maxErrorPeek && wire.NoRoute(pre):
				// It has no such endpoint (SGLang's /get_model_info on a
				// vLLM replica, in a fleet of both): another may.
				resp.Body.Close()
				cancel()
				noRoute = true
				continue
			case stored != "" && i < len(reps)-1 && !(held && st.ID == holder):
				// Not stored there: another replica may hold it (the
				// router did not see its answer: it restarted, or forgot
				// it). The holder's 404 is the last word: a store the
				// replicas shared would have answered it.
				resp.Body.Close()
				cancel()
				last = i
				continue
			}
			body = io.MultiReader(bytes.NewReader(pre), resp.Body)
		}
		copyHeaders(w.Header(), resp.Header)
		w.Header().Set(ReplicaHeader, st.ID)
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, body)
		resp.Body.Close()
		cancel()
		return
	}
	switch {
	case last >= 0:
		httpapi.Error(w, http.StatusNotFound, "no replica holds response %q", stored)
		return
	case noRoute:
		httpapi.Error(w, http.StatusNotFound, "no replica tried serves %s %s", r.Method, r.URL.Path)
		return
	}
	httpapi.WriteError(w, noReplica())
}

// noReplica is the 503 for a request no replica is available to serve,
// with its Retry-After, as the lifecycle answers it.
func noReplica() *wire.Error {
	e := wire.Errorf(http.StatusServiceUnavailable, "no available replica")
	e.RetryAfter = "5"
	return e
}
