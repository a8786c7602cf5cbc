// Package proxy is gorgo's OpenAI-compatible proxy: it parses each chat or
// completion request, asks the routing core which replica should serve it,
// forwards it there, streams the answer back as it comes, measures what
// the client sees, and feeds the outcome back to the router (and to an
// online tuner). Round-trip probes, /metrics scrapes and passive failure
// counting keep the router's view of the fleet current; a replica that
// fails before anything reached the client is skipped and another tried.
package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/route"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// Server is the proxy. Create it with New, serve Handler, and run Run for
// the probes and scrapes.
type Server struct {
	cfg    Config
	rt     *router.Router
	policy route.Policy
	est    prompt.Estimator
	client *http.Client
	start  time.Time
	reps   []*upstream
	m      *metrics
	mux    *http.ServeMux

	// rng is only used inside router calls, which the router serialises.
	rng *rand.Rand
	// log, if set, gets one line per request answered by a replica.
	log *slog.Logger
}

// upstream is one replica and its failure count.
type upstream struct {
	cfg      ReplicaConfig
	mu       sync.Mutex
	failures int // in a row
}

// New builds a proxy from a config (defaults are applied here) and a
// policy; nil policy means the config's. Its metrics are registered on reg
// and served, with whatever else reg holds, at /metrics.
func New(cfg Config, policy route.Policy, reg *prometheus.Registry) (*Server, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if policy == nil {
		opts := route.Options{TieMargin: cfg.TieMargin}
		if cfg.Weights != nil {
			opts.Weights = *cfg.Weights
		}
		if cfg.MSWeights != nil {
			opts.MSWeights = *cfg.MSWeights
		}
		var err error
		if policy, err = route.New(cfg.Policy, opts); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	rcs := make([]router.ReplicaConfig, len(cfg.Replicas))
	s := &Server{cfg: cfg, policy: policy, est: prompt.Estimator{BytesPerToken: cfg.BytesPerToken}, start: time.Now(),
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x4f1bbcdcbfa53e0a))}
	for i, r := range cfg.Replicas {
		rcs[i] = router.ReplicaConfig{ID: r.ID, Region: r.Region, KVCapacityTokens: r.KVCapacityTokens,
			PrefillMSPerToken: r.PrefillMSPerTok, QueueMSPerToken: r.QueueMSPerTok}
		s.reps = append(s.reps, &upstream{cfg: r})
	}
	rt, err := router.New(router.Config{Replicas: rcs, Policy: policy, BlockTokens: cfg.BlockTokens, RTTAlpha: cfg.RTTAlpha, OnlineRates: cfg.OnlineRates})
	if err != nil {
		return nil, err
	}
	s.rt = rt
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	s.client = &http.Client{Transport: &http.Transport{
		DialContext:         dialer.DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}}
	s.m = newMetrics(reg)
	// A replica is routed to only once a probe has reached it: until then
	// its round trip is unknown (and would count as zero).
	for i := range s.reps {
		s.rt.SetHealthy(i, false)
		s.m.healthy.WithLabelValues(s.reps[i].cfg.ID).Set(0)
	}
	s.routes(reg)
	return s, nil
}

// SetAccessLog makes the proxy log one line per request (replica, status,
// tokens, TTFT, E2E). Call it before serving.
func (s *Server) SetAccessLog(l *slog.Logger) { s.log = l }

// Router exposes the routing core (for tests and the admin API).
func (s *Server) Router() *router.Router { return s.rt }

// now is the router's clock: time since the proxy started.
func (s *Server) now() time.Duration { return time.Since(s.start) }

// Handler serves the OpenAI API, /health, /metrics and /admin.
func (s *Server) Handler() http.Handler { return s.mux }

// Run probes and scrapes every replica until ctx ends, the first probes one
// interval after it starts. Replicas are routed to only after a probe has
// reached them, so call ProbeOnce before serving.
func (s *Server) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for i := range s.reps {
		g.Go(func() error { return s.probeLoop(ctx, i) })
		g.Go(func() error { return s.scrapeLoop(ctx, i) })
	}
	return g.Wait()
}

// ProbeOnce probes every replica once, concurrently.
func (s *Server) ProbeOnce(ctx context.Context) {
	var wg sync.WaitGroup
	for i := range s.reps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.probe(ctx, i)
		}()
	}
	wg.Wait()
}

// failed counts a failure of replica i (a request or a probe) and marks it
// unhealthy at the threshold.
func (s *Server) failed(i int) {
	u := s.reps[i]
	u.mu.Lock()
	u.failures++
	down := u.failures >= s.cfg.FailureThreshold
	u.mu.Unlock()
	if down {
		s.rt.SetHealthy(i, false)
		s.m.healthy.WithLabelValues(u.cfg.ID).Set(0)
	}
}

// succeeded clears replica i's failures and marks it healthy.
func (s *Server) succeeded(i int) {
	u := s.reps[i]
	u.mu.Lock()
	u.failures = 0
	u.mu.Unlock()
	s.rt.SetHealthy(i, true)
	s.m.healthy.WithLabelValues(u.cfg.ID).Set(1)
}
