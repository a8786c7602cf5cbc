// Package emulator serves an engine model over HTTP the way an SGLang or
// vLLM replica does: OpenAI chat and completions (streaming SSE or not),
// /v1/models, /health and a Prometheus /metrics in either engine's names,
// with tokens coming out when the model says, optionally faster than real
// time, and with injected faults. With netem it also sits behind a region's
// round trip. It lets the proxy be built, tested and demonstrated without GPUs.
package emulator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/prompt"
)

// Config configures an emulated replica. Zero fields take defaults.
type Config struct {
	Profile engine.Profile
	// PageTokens is the prefix cache's block size in tokens (default 16, vLLM's).
	PageTokens int
	// Model is the served model's primary name: the default of a request
	// that names none, and the model_name of the metrics (default the first
	// of ServedNames, else "gorgo-emulated").
	Model string
	// ServedNames are every name the base model is served under, as
	// vLLM's --served-model-name a b (empty: Model alone). Model is served
	// whether listed or not, first.
	ServedNames []string
	// LoRAModules are the LoRA adapters on the base model at start, each
	// NAME or NAME=PATH (vLLM's --lora-modules; the path is what
	// /v1/models says, default /adapters/NAME). More can be loaded at
	// runtime (POST /v1/load_lora_adapter). Names and adapters are at most
	// 1024 in all.
	LoRAModules []string
	// MaxLoRAs is the engine's adapter slots (engine.Config.MaxLoRAs;
	// default the engine's own: 1 for vLLM's --max-loras, 8 for SGLang's
	// --max-loras-per-batch). LoRA is on, in /metrics, when it or
	// LoRAModules is given, or once an adapter is loaded at runtime.
	MaxLoRAs int
	// LoRALoadTime is what loading an adapter adds to the engine step
	// that needs it, in model time (engine.Config.LoRALoadTime).
	LoRALoadTime time.Duration
	// MetricsFormat is the engine the replica answers as, "sglang"
	// (default) or "vllm": its /metrics names, its models' owner, and
	// whether it serves SGLang's native POST /generate.
	MetricsFormat string
	// Speedup runs the model this many times faster than real time (default 1).
	Speedup float64
	// MaxWaiting caps the waiting queue; beyond it requests get 503
	// (default 4096).
	MaxWaiting int
	// DefaultMaxTokens is the output length of a request without max_tokens
	// (default 128).
	DefaultMaxTokens int
	// StoreResponses keeps each Responses API response in the replica's
	// memory, for a follow-up that names it and for GET (vLLM's
	// VLLM_ENABLE_RESPONSES_API_STORE; off, a request's "store" is
	// ignored). See responses.go.
	StoreResponses bool
	// HealthGenerates makes GET /health answer as SGLang's does by default
	// (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION): it has the scheduler
	// generate a token and answers once a second has passed and the
	// engine has shown life, a second or more after it was asked. The
	// emulated engine always shows life within it. Off, /health answers
	// at once, as vLLM's does.
	HealthGenerates bool
	// Estimator turns prompt bytes into tokens.
	Estimator prompt.Estimator
	Faults    Faults
	// Seed fixes the fault draws.
	Seed uint64
	// SetRTT, if set, is what POST /admin/network calls to change the
	// network delay (the caller owns the netem link).
	SetRTT func(rtt, jitter time.Duration)
	// Spin trades CPU for timing: the driver spins (yielding) the last
	// stretch before each step ends instead of trusting a timer, which an
	// idle Go process fires up to a millisecond late. It costs up to a
	// quarter of a core while the model is busy; leave it off when many
	// emulators share a machine.
	Spin bool
}

// Faults are injected failures.
type Faults struct {
	// FailFraction of completion requests get an HTTP 500.
	FailFraction float64
	// HangAfter: after this many completion requests, every request
	// (health and metrics included) hangs until the client gives up. Zero: never.
	HangAfter int
	// ExitAfter: after this many completion requests, Run returns
	// ErrExitFault (the command exits as if it crashed). Zero: never.
	ExitAfter int
	// Slowdown makes the model this many times slower (default 1).
	Slowdown float64
}

// ErrExitFault is returned by Run when the exit-after fault fires.
var ErrExitFault = errors.New("exiting on injected fault (exit after N requests)")

// Server is one emulated replica.
type Server struct {
	cfg   Config
	prof  engine.Profile
	page  int
	est   prompt.Estimator
	drv   *driver
	clk   *clock
	reg   *prometheus.Registry
	mux   *http.ServeMux
	count atomic.Int64
	exit  chan struct{}
	once  sync.Once

	mu       sync.Mutex
	rng      *rand.Rand
	speedup  float64
	slowdown float64

	models   atomic.Pointer[catalog] // what is served; swapped whole
	modelsMu sync.Mutex              // serialises loads and unloads
	lora     atomic.Bool             // LoRA is on: its metrics are exposed
	stored   responseStore           // Responses API responses (StoreResponses)
	aborts   abortable               // the requests a client may abort
	// unentered numbers the requests aborted before they entered the
	// engine, for their answers' ids (the engine's own are taken from 1).
	unentered atomic.Uint64
	holds     holds // what holds the engine: a pause, its sleep (hold.go)
}

// New builds a replica; Run starts its model.
func New(cfg Config) (*Server, error) {
	if cfg.PageTokens == 0 {
		cfg.PageTokens = 16
	}
	if cfg.MetricsFormat == "" {
		cfg.MetricsFormat = "sglang"
	}
	if cfg.Speedup == 0 {
		cfg.Speedup = 1
	}
	if cfg.MaxWaiting == 0 {
		cfg.MaxWaiting = 4096
	}
	if cfg.DefaultMaxTokens == 0 {
		cfg.DefaultMaxTokens = 128
	}
	if cfg.Faults.Slowdown == 0 {
		cfg.Faults.Slowdown = 1
	}
	switch {
	case cfg.MetricsFormat != "sglang" && cfg.MetricsFormat != "vllm":
		return nil, fmt.Errorf("metrics format must be sglang or vllm, got %q", cfg.MetricsFormat)
	case checkSpeed(cfg.Speedup, cfg.Faults.Slowdown) != nil:
		return nil, checkSpeed(cfg.Speedup, cfg.Faults.Slowdown)
	case !(cfg.Faults.FailFraction >= 0 && cfg.Faults.FailFraction <= 1):
		return nil, fmt.Errorf("fail fraction must be in [0, 1], got %v", cfg.Faults.FailFraction)
	case cfg.Faults.HangAfter < 0 || cfg.Faults.ExitAfter < 0 || cfg.PageTokens < 0 || cfg.MaxWaiting < 0 || cfg.DefaultMaxTokens < 0 ||
		cfg.MaxLoRAs < 0 || cfg.LoRALoadTime < 0:
		return nil, fmt.Errorf("counts, sizes and times must not be negative")
	}
	cat, err := buildCatalog(&cfg)
	if err != nil {
		return nil, err
	}
	loraOn := len(cfg.LoRAModules) > 0 || cfg.MaxLoRAs > 0
	if cfg.MaxLoRAs == 0 {
		cfg.MaxLoRAs = defaultMaxLoRAs[cfg.MetricsFormat]
	}
	eng, err := engine.New(engine.Config{Profile: cfg.Profile, PageTokens: cfg.PageTokens, MaxWaiting: cfg.MaxWaiting, TokenEvents: true,
		MaxLoRAs: cfg.MaxLoRAs, LoRALoadTime: cfg.LoRALoadTime})
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, prof: eng.Profile(), page: cfg.PageTokens, est: cfg.Estimator,
		clk:     newClock(time.Now(), cfg.Speedup/cfg.Faults.Slowdown),
		reg:     prometheus.NewRegistry(),
		exit:    make(chan struct{}),
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x853c49e6748fea9b)),
		speedup: cfg.Speedup, slowdown: cfg.Faults.Slowdown,
	}
	s.models.Store(cat)
	s.lora.Store(loraOn)
	s.drv = newDriver(eng, s.clk)
	s.drv.spin = cfg.Spin
	m := newMetrics(s)
	s.drv.observe = m.observe
	s.drv.forget = func(id uint64) { delete(m.lastToken, id) }
	s.reg.MustRegister(m)
	s.routes()
	return s, nil
}

// Handler is the replica's HTTP API.
func (s *Server) Handler() http.Handler { return s.mux }

// defaultMaxLoRAs are the engines' own default adapter slots.
var defaultMaxLoRAs = map[string]int{"vllm": 1, "sglang": 8}

// Gauges is the engine model's gauges and counters now (its queue, cache
// and adapter counts), as a harness reads them beside the replica's
// /metrics.
func (s *Server) Gauges() engine.Gauges {
	g, _ := s.drv.gauges()
	return g
}

// Run drives the model until ctx ends (nil) or the exit fault fires.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.drv.run(ctx) }()
	select {
	case <-s.exit:
		cancel()
		<-done
		return ErrExitFault
	case err := <-done:
		return err
	}
}

func (s *Server) routes() {
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("/v1/chat/completions", s.guard(true, func(w http.ResponseWriter, r *http.Request) {
		if j, ok := s.parseChat(w, r); ok {
			s.serve(w, r, j)
		}
	}))
	s.mux.HandleFunc("/v1/completions", s.guard(true, func(w http.ResponseWriter, r *http.Request) {
		if j, ok := s.parseCompletion(w, r); ok {
			s.serve(w, r, j)
		}
	}))
	s.mux.HandleFunc("POST /v1/responses", s.guard(true, func(w http.ResponseWriter, r *http.Request) {
		if j, ok := s.parseResponses(w, r); ok {
			s.serve(w, r, j)
		}
	}))
	if s.cfg.MetricsFormat == "sglang" { // SGLang's own API: vLLM has none
		generate := s.guard(true, func(w http.ResponseWriter, r *http.Request) {
			if j, ok := s.parseGenerate(w, r); ok {
				s.serve(w, r, j)
			}
		})
		s.mux.HandleFunc("POST /generate", generate)
		s.mux.HandleFunc("PUT /generate", generate)
		s.mux.HandleFunc("POST /abort_request", s.guard(false, s.abortRequest))
		s.mux.HandleFunc("GET /flush_cache", s.guard(false, s.flushCache))
		s.mux.HandleFunc("POST /flush_cache", s.guard(false, s.flushCache))
		s.mux.HandleFunc("POST /load_lora_adapter", s.guard(false, s.sglangAdapter(s.addAdapter)))
		s.mux.HandleFunc("POST /unload_lora_adapter", s.guard(false, s.sglangAdapter(s.removeAdapter)))
		s.mux.HandleFunc("POST /pause_generation", s.guard(false, s.pauseGeneration))
		s.mux.HandleFunc("POST /continue_generation", s.guard(false, s.continueGeneration))
		s.mux.HandleFunc("POST /update_weights_from_disk", s.guard(false, s.updateWeightsFromDisk))
		for _, method := range []string{"GET ", "POST "} {
			s.mux.HandleFunc(method+"/release_memory_occupation", s.guard(false, s.memory(true)))
			s.mux.HandleFunc(method+"/resume_memory_occupation", s.guard(false, s.memory(false)))
		}
	} else { // vLLM's development mode (VLLM_SERVER_DEV_MODE=1)
		s.mux.HandleFunc("POST /pause", s.guard(false, s.pause))
		s.mux.HandleFunc("POST /resume", s.guard(false, s.resume))
		s.mux.HandleFunc("GET /is_paused", s.guard(false, s.isPaused))
		s.mux.HandleFunc("POST /sleep", s.guard(false, s.sleep))
		s.mux.HandleFunc("POST /wake_up", s.guard(false, s.wakeUp))
		s.mux.HandleFunc("GET /is_sleeping", s.guard(false, s.isSleeping))
		s.mux.HandleFunc("POST /reset_prefix_cache", s.guard(false, s.resetPrefixCache))
		s.mux.HandleFunc("POST /abort_requests", s.guard(false, s.abortRequests))
	}
	s.mux.HandleFunc("GET /v1/responses/{id}", s.guard(false, s.getResponse))
	s.mux.HandleFunc("POST /v1/responses/{id}/cancel", s.guard(false, s.cancelResponse))
	s.mux.HandleFunc("GET /v1/models", s.guard(false, s.listModels))
	s.mux.HandleFunc("POST /v1/load_lora_adapter", s.guard(false, s.loadAdapter))
	s.mux.HandleFunc("POST /v1/unload_lora_adapter", s.guard(false, s.unloadAdapter))
	s.mux.HandleFunc("GET /health", s.guard(false, func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.HealthGenerates {
			select {
			case <-time.After(time.Second): // SGLang's first look, in wall time as its HTTP server's
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(http.StatusOK)
	}))
	s.mux.Handle("GET /metrics", s.guard(false, promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}).ServeHTTP))
	s.mux.HandleFunc("POST /admin/network", s.adminNetwork)
	s.mux.HandleFunc("POST /admin/speed", s.adminSpeed)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// As both engines' servers (FastAPI) answer a path they have no
		// route for.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"detail":"Not Found"}`)
	})
}

// guard applies the faults: hang after N requests, then (for completion
// requests) exit after N and fail a fraction.
func (s *Server) guard(completion bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f := s.cfg.Faults
		n := s.count.Load()
		if completion {
			n = s.count.Add(1)
		}
		if f.HangAfter > 0 && n > int64(f.HangAfter) {
			hang(r)
			return
		}
		if completion && f.ExitAfter > 0 && n > int64(f.ExitAfter) {
			s.once.Do(func() { close(s.exit) })
			hang(r)
			return
		}
		if completion && f.FailFraction > 0 {
			s.mu.Lock()
			fail := s.rng.Float64() < f.FailFraction
			s.mu.Unlock()
			if fail {
				writeError(w, http.StatusInternalServerError, "InternalServerError", "injected fault")
				return
			}
		}
		h(w, r)
	}
}

// hang never answers, until the client goes away. The body is read first:
// net/http notices a client hanging up only once the body is consumed.
func hang(r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	<-r.Context().Done()
}

// adminNetwork changes the injected round trip: POST /admin/network?rtt=80ms&jitter=10ms.
func (s *Server) adminNetwork(w http.ResponseWriter, r *http.Request) {
	if s.cfg.SetRTT == nil {
		writeError(w, http.StatusNotFound, "NotFoundError", "this replica has no injected network delay")
		return
	}
	rtt, err1 := time.ParseDuration(r.URL.Query().Get("rtt"))
	jitter := time.Duration(0)
	var err2 error
	if j := r.URL.Query().Get("jitter"); j != "" {
		jitter, err2 = time.ParseDuration(j)
	}
	if err1 != nil || err2 != nil || rtt < 0 || jitter < 0 {
		writeError(w, http.StatusBadRequest, "BadRequestError", "want ?rtt=DURATION[&jitter=DURATION], non-negative")
		return
	}
	s.cfg.SetRTT(rtt, jitter)
	w.WriteHeader(http.StatusNoContent)
}

// Bounds of the model's speed against the wall clock (speedup over
// slowdown). Tests stall a replica with a slowdown of 1e9 (a 9 ms step
// lasts 104 days); the clock holds its conversions in range whatever the
// speed (see scale), so these bounds only keep the ratio a number.
const (
	minSpeed = 1e-12
	maxSpeed = 1e12
)

// checkSpeed refuses a speedup and slowdown that are not positive and
// finite, or whose ratio is out of [minSpeed, maxSpeed].
func checkSpeed(speedup, slowdown float64) error {
	if !(speedup > 0) || !(slowdown > 0) || math.IsInf(speedup, 0) || math.IsInf(slowdown, 0) {
		return fmt.Errorf("speedup and slowdown must be positive and finite, got %v and %v", speedup, slowdown)
	}
	if r := speedup / slowdown; !(r >= minSpeed && r <= maxSpeed) {
		return fmt.Errorf("speedup over slowdown must be within [%g, %g], got %g", minSpeed, maxSpeed, r)
	}
	return nil
}

// adminSpeed changes the model's speed: POST /admin/speed?speedup=10&slowdown=2.
func (s *Server) adminSpeed(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	up, down := s.speedup, s.slowdown
	for key, p := range map[string]*float64{"speedup": &up, "slowdown": &down} {
		if v := r.URL.Query().Get(key); v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f > 0) {
				writeError(w, http.StatusBadRequest, "BadRequestError", "%s must be a positive number, got %q", key, v)
				return
			}
			*p = f
		}
	}
	if err := checkSpeed(up, down); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
		return
	}
	s.speedup, s.slowdown = up, down
	s.drv.mu.Lock()
	s.clk.setSpeed(time.Now(), up/down)
	s.drv.mu.Unlock()
	s.drv.wake()
	w.WriteHeader(http.StatusNoContent)
}
