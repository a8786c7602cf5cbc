// Package serve is a whole gorgo router as gorgo serve and gorgo epp run
// it: the config file (Config: the fleet's, the HTTP front end's and the
// admin listener's parts in one YAML document) and its reload, and the
// assembly of a fleet, its admin API and live view, and, for gorgo serve,
// the HTTP front end.
package serve

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/gorgo-llm/gorgo/internal/admin"
	"github.com/gorgo-llm/gorgo/internal/discover"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/proxy"
	"github.com/gorgo-llm/gorgo/internal/tracing"
)

// Options are what a Server is built with besides its config.
type Options struct {
	// Policy routes; nil means the config's (an online tuner configured on
	// the command line is built by the caller).
	Policy policy.Policy
	// Proxy builds the HTTP front end (gorgo serve); without it the
	// config's front-end settings are not used (gorgo epp).
	Proxy bool
	// Fallbacks is how many replicas after its choice a decision ranks
	// (default max_attempts − 1).
	Fallbacks int
	// Registry gets every metric and is what /metrics serves (nil: a new
	// one).
	Registry *prometheus.Registry
	// Log gets membership changes, health, reloads and admin changes (nil:
	// discarded); AccessLog one line per request (nil: none).
	Log, AccessLog *slog.Logger
	// Resolver resolves DNS groups (nil: the default, see discover).
	Resolver discover.Resolver
	// Path is the config file Reload reads again ("" if the config came from
	// flags alone); Overrides applies the command line over the file, at
	// start (the caller's config already has it) and on every reload.
	Path      string
	Overrides func(*Config) error
}

// Server is a router: its fleet, its admin API and live view, and its
// HTTP front end (nil without Options.Proxy); and its tracing (see
// Shutdown).
type Server struct {
	Fleet *fleet.Fleet
	Admin *admin.Server
	Proxy *proxy.Server

	tracing *tracing.Tracing
	tuner   *tunerState // keeps the online tuner's state (tuner_state); nil: none

	o       Options
	reloads *prometheus.CounterVec
	log     *slog.Logger
	mu      sync.Mutex // serialises reloads; guards cfg, fileMod and pollChanged
	cfg     Config     // the running config
	fileMod time.Time
	// pollChanged is closed, and replaced, when a reload changes
	// config_poll: the poll loop then waits the new interval.
	pollChanged chan struct{}
	// applied hear each config applied (OnApply).
	applied []func(Config)
}

// OnApply has fn called with the running config now and after each
// config is applied (a reload): a front end built outside Server (gorgo
// epp's picker) takes its settings so. fn runs under the Server's lock:
// it must not call the Server.
func (s *Server) OnApply(fn func(Config)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied = append(s.applied, fn)
	fn(s.cfg)
}

// New builds a router from a config (its defaults applied here).
func New(cfg Config, o Options) (*Server, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	view := admin.NewView()
	f, err := fleet.New(cfg.Config, fleet.Options{Policy: o.Policy, Registry: o.Registry, Log: o.Log, AccessLog: o.AccessLog,
		Tap: view, Resolver: o.Resolver, Fallbacks: o.Fallbacks})
	if err != nil {
		return nil, err
	}
	s := &Server{Fleet: f, o: o, log: o.Log, cfg: cfg, pollChanged: make(chan struct{})}
	if s.Admin, err = admin.New(f, view, cfg.Admin, o.Registry, o.Log); err == nil && o.Proxy {
		s.Proxy, err = proxy.New(f, cfg.Proxy, o.Registry, o.Registry, o.Log)
	}
	if err == nil {
		s.tracing, err = tracing.Start(cfg.Tracing, tracing.Options{Log: o.Log})
	}
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	if s.tracing.Enabled() {
		f.Core().SetTracer(s.tracing.Tracer())
	}
	if cfg.TunerState != "" {
		if s.tuner, err = resumeTuner(f.Policy(), cfg.TunerState, f.Router().IDs, o.Registry, o.Log); err != nil {
			return nil, errors.Join(err, s.tracing.Shutdown(context.Background()), f.Close())
		}
		s.Admin.ShowTunerFile(s.tuner.File)
	}
	s.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_config_reloads_total",
		Help: "Config reloads, by result (applied, unchanged, failed)."}, []string{"result"})
	o.Registry.MustRegister(s.reloads)
	if o.Path != "" {
		s.fileMod = modTime(o.Path)
	}
	return s, nil
}

// Registry is what the router's /metrics serves: a front end built
// outside Server (gorgo epp's picker) registers its own series there.
func (s *Server) Registry() *prometheus.Registry { return s.o.Registry }

// Shutdown writes the online tuner's state a last time (tuner_state:
// with what it learned from the requests the front ends drained), and
// exports the spans that ended and stops the tracing's exporter, within
// ctx: call it once Run returned and the front ends have stopped serving.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.tuner != nil {
		s.tuner.save() // a failure is logged
	}
	return s.tracing.Shutdown(ctx)
}

// Config returns the running config.
func (s *Server) Config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// Run runs the fleet's loops, the live view's clock and the config file's
// poll until ctx ends. Replicas are routed to only after a probe has
// reached them: call s.Fleet.ProbeOnce before serving.
func (s *Server) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.Fleet.Run(ctx) })
	g.Go(func() error { return s.Admin.Run(ctx) })
	if s.tuner != nil {
		g.Go(func() error { s.tuner.keep(ctx); return nil })
	}
	if s.o.Path != "" {
		g.Go(func() error { s.pollConfig(ctx); return nil })
	}
	return g.Wait()
}

// Reload reads the config file again and applies it (see Apply). A file
// that fails to read, parse or validate changes nothing: the running
// config stays, and the error is logged and returned.
func (s *Server) Reload() error {
	if s.o.Path == "" {
		return errors.New("no config file to reload (gorgo was started without --config)")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fileMod = modTime(s.o.Path)
	cfg, err := LoadConfig(s.o.Path)
	if err == nil && s.o.Overrides != nil {
		err = s.o.Overrides(&cfg)
	}
	if err != nil {
		s.reloads.WithLabelValues("failed").Inc()
		s.log.Error("config not reloaded: the running config stays", "file", s.o.Path, "error", err)
		return err
	}
	return s.apply(cfg)
}

// Apply makes next the running config, as far as it can change live: each
// part (the fleet's, the front end's, the admin listener's) is judged with
// what cannot change while it runs kept at its running value (logged as
// needing a restart), and only if every part accepts it is any applied.
// See fleet.Fleet.Prepare, proxy.Server.Prepare and admin.Server.Prepare.
func (s *Server) Apply(next Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.apply(next)
}

func (s *Server) apply(next Config) error {
	next = next.Defaults()
	cur := s.cfg
	fail := func(err error) error {
		s.reloads.WithLabelValues("failed").Inc()
		s.log.Error("config not applied: the running config stays", "error", err)
		return err
	}
	// The file as written, first: what needs a restart keeps its running
	// value below, and a file told so must then start.
	if err := next.Validate(); err != nil {
		return fail(err)
	}
	if len(next.Replicas) == 0 && len(next.Discover) == 0 && s.Admin.Config().Listen == admin.Off {
		return fail(errors.New("config: no replicas, no discover groups and no admin API to add any"))
	}
	applyFleet, restart, err := s.Fleet.Prepare(next.Config)
	if err != nil {
		return fail(err)
	}
	applyAdmin, r, err := s.Admin.Prepare(next.Admin)
	if err != nil {
		return fail(err)
	}
	restart = append(restart, r...)
	applyProxy := func() {}
	if s.Proxy != nil {
		if applyProxy, r, err = s.Proxy.Prepare(next.Proxy); err != nil {
			return fail(err)
		}
		restart = append(restart, r...)
	}
	if !next.Tracing.Equal(cur.Tracing) {
		restart = append(restart, "tracing")
		next.Tracing = cur.Tracing
	}
	if next.TunerState != cur.TunerState {
		restart = append(restart, "tuner_state")
		next.TunerState = cur.TunerState
	}
	applyAdmin()
	applyProxy()
	ch, werr := applyFleet()
	// The running config is what each part runs (the settings that cannot
	// change keep their running values).
	next.Config, next.Admin = s.Fleet.Config(), s.Admin.Config()
	if s.Proxy != nil {
		next.Proxy = s.Proxy.Config()
	}
	s.cfg = next
	for _, fn := range s.applied {
		fn(next)
	}
	if next.ConfigPoll != cur.ConfigPoll {
		close(s.pollChanged)
		s.pollChanged = make(chan struct{})
	}
	result := "applied"
	if ch.Empty() && reflect.DeepEqual(cur, next) {
		result = "unchanged"
	}
	s.reloads.WithLabelValues(result).Inc()
	attrs := []any{"result", result, "added", ch.Added, "removed", ch.Removed, "changed", ch.Changed}
	if len(restart) > 0 {
		attrs = append(attrs, "needs_restart", strings.Join(restart, "; "))
	}
	if werr != nil {
		attrs = append(attrs, "not_applied", werr.Error())
	}
	s.log.Info("config reloaded", attrs...)
	return nil
}

// pollConfig reloads the config file when its modification time changes,
// every config_poll. While that is negative (never) it waits for a reload
// (SIGHUP, the admin API) to set it; a reload that changes it starts the
// new interval at once.
func (s *Server) pollConfig(ctx context.Context) {
	for {
		s.mu.Lock()
		every, changed := s.cfg.ConfigPoll, s.pollChanged
		s.mu.Unlock()
		if !waitPoll(ctx, every, changed) {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		s.mu.Lock()
		mod := !s.fileMod.Equal(modTime(s.o.Path))
		s.mu.Unlock()
		if mod {
			_ = s.Reload()
		}
	}
}

// waitPoll waits every (for ever if it is not positive) and reports
// true, or reports false when changed is closed or ctx ends first.
func waitPoll(ctx context.Context, every time.Duration, changed <-chan struct{}) bool {
	var tick <-chan time.Time
	if every > 0 {
		t := time.NewTimer(every)
		defer t.Stop()
		tick = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-changed:
		return false
	case <-tick:
		return true
	}
}

func modTime(path string) time.Time {
	st, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return st.ModTime()
}
