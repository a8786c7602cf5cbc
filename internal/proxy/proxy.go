// Package proxy is gorgo's OpenAI-compatible proxy: an HTTP front end over
// the transport-free request lifecycle (internal/lifecycle). It reads each
// chat or completion request, lets the lifecycle pick a replica (and its
// fallbacks), forwards the request there, relays the answer as it comes
// and hands the upstream's events back to the lifecycle. Around it, it
// keeps the fleet: replicas from the config file (reloaded on SIGHUP or
// when the file changes), from DNS groups, and from the authenticated
// admin API on its own listener; round-trip probes, /metrics scrapes and
// passive failure counting keep the router's view of each replica current.
package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/gorgo-llm/gorgo/internal/discover"
	"github.com/gorgo-llm/gorgo/internal/lifecycle"
	"github.com/gorgo-llm/gorgo/internal/mesh"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// Server is the proxy. Create it with New, serve Handler (clients) and
// AdminHandler (operators), and run Run for the probes, scrapes, DNS
// discovery and config reloads.
type Server struct {
	cfg      atomic.Pointer[Config] // the running config (live settings change on reload)
	path     string                 // the config file, if any
	core     *lifecycle.Core
	rt       *router.Router
	policy   policy.Policy
	bus      *mesh.Bus // nil off a mesh
	dash     *dashboard
	quit     chan struct{} // closed when Run's context ends: long streams (the live view) end
	quitOnce sync.Once
	nats     func() // stops the embedded NATS server, if any
	client   *http.Client
	start    time.Time
	m        *metrics
	mux      *http.ServeMux
	admin    *http.ServeMux
	log      *slog.Logger
	tokens   atomic.Pointer[[]token] // admin
	keys     atomic.Pointer[[]token] // clients
	cert     atomic.Pointer[tls.Certificate]
	limits   atomic.Pointer[limiters]

	// ups maps replica ids to upstreams; it changes under upMu and is
	// read through the atomic pointer.
	upMu sync.Mutex
	ups  atomic.Pointer[map[string]*upstream]

	// run is the context of Run, for the loops of replicas added later.
	runMu sync.Mutex
	run   context.Context
	loops sync.WaitGroup

	// discoMu serialises (re)starting the DNS watcher; dnsMu guards the
	// DNS groups' replicas and the watcher. Lock order: reloadMu, discoMu,
	// dnsMu, upMu, runMu.
	discoMu     sync.Mutex
	dnsMu       sync.Mutex
	dnsSets     map[string]map[string]bool // group name -> replica ids
	stopWatcher context.CancelFunc
	watcherDone chan struct{}
	resolver    discover.Resolver

	inFlight atomic.Int64 // requests being served

	reloadMu sync.Mutex // serialises reloads; guards fileMod
	fileMod  time.Time
	flags    flags
}

// Sources of a replica.
const (
	sourceConfig = "config"
	sourceAdmin  = "admin"
	sourceDNS    = "dns:" // + the group's name
)

// upstream is one replica as the proxy reaches it.
type upstream struct {
	cfg    ReplicaConfig
	source string

	mu      sync.Mutex
	health  health
	stop    context.CancelFunc // ends its probe and scrape loops
	stopped bool

	scrapeFailing atomic.Bool
	// attemptLog limits the log lines of its failed attempts.
	attemptLog rate.Sometimes
	apiKey     string // sent as Authorization with auth.upstream: replica
}

func newUpstream(rc ReplicaConfig, source string) *upstream {
	return &upstream{cfg: rc, source: source, attemptLog: rate.Sometimes{First: 3, Interval: 10 * time.Second}}
}

// halt ends the upstream's loops, and keeps loops from starting after.
func (u *upstream) halt() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.stopped = true
	if u.stop != nil {
		u.stop()
	}
}

// maxResponseHeaderBytes bounds a replica's response headers.
const maxResponseHeaderBytes = 64 << 10

// New builds a proxy from a config (defaults are applied here) and a
// policy; nil policy means the config's. Its metrics are registered on reg
// and served at /metrics on both listeners. path is the config file that
// Reload reads again ("" if the config came from flags alone). log gets
// membership changes and reloads (nil: discarded).
func New(cfg Config, pol policy.Policy, reg *prometheus.Registry, path string, log *slog.Logger) (*Server, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if pol == nil {
		var err error
		if pol, err = policy.New(cfg.Policy, cfg.PolicyOptions(cfg.Policy)); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	toks, err := cfg.Admin.tokens()
	if err != nil {
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
	upTLS, err := cfg.UpstreamTLS.client()
	if err != nil {
		return nil, err
	}
	rt, err := router.New(router.Config{Policy: pol, BlockTokens: cfg.BlockTokens, RTTAlpha: cfg.RTTAlpha,
		OnlineRates: cfg.OnlineRates, TieMargin: cfg.TieMargin})
	if err != nil {
		return nil, err
	}
	s := &Server{path: path, rt: rt, policy: pol, start: time.Now(), log: log, dnsSets: map[string]map[string]bool{}}
	s.cfg.Store(&cfg)
	s.tokens.Store(&toks)
	s.keys.Store(&keys)
	s.cert.Store(cert)
	s.limits.Store(newLimiters(cfg.RateLimit))
	s.ups.Store(&map[string]*upstream{})
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	s.client = &http.Client{Transport: &http.Transport{
		DialContext:         dialer.DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		// A ~1k-token request (4 KB) leaves in one write with its headers,
		// and an answer comes in with few reads.
		WriteBufferSize: 64 << 10,
		ReadBufferSize:  64 << 10,
		// A replica's response headers are capped: past it the attempt
		// fails as the replica's fault (and the next fallback is tried), so
		// a hostile replica cannot grow the proxy or hand clients headers
		// larger than they take.
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
		TLSClientConfig:        upTLS,
	}}
	s.m = newMetrics(reg)
	reg.MustRegister(stateCollector{s})
	adm, _ := cfg.admission() // validated
	s.dash = newDashboard()
	s.quit = make(chan struct{})
	var obs lifecycle.Observer
	if cfg.Mesh != nil {
		if err := s.joinMesh(*cfg.Mesh, cfg.Region); err != nil {
			return nil, err
		}
		obs = s.bus
	}
	s.core = lifecycle.NewCore(lifecycle.Config{Router: rt, Est: prompt.Estimator{BytesPerToken: cfg.BytesPerToken}, BlockTokens: cfg.BlockTokens,
		MaxAttempts: cfg.MaxAttempts, Start: s.start, Health: s, Metrics: lifecycle.NewMetrics(reg), Seed: cfg.Seed, Admission: adm, Observer: obs, Tap: s.dash})
	for _, rc := range cfg.Replicas {
		if err := s.AddReplica(rc, sourceConfig); err != nil {
			s.leaveMesh()
			return nil, err
		}
	}
	if path != "" {
		s.fileMod = modTime(path)
	}
	s.routes(reg)
	return s, nil
}

// SetAccessLog makes the proxy log one line per request (replica, status,
// tokens, TTFT, E2E). Call it before serving.
func (s *Server) SetAccessLog(l *slog.Logger) { s.core.Log = l }

// Router exposes the routing core (for tests and the admin API).
func (s *Server) Router() *router.Router { return s.rt }

// Config returns the running config.
func (s *Server) Config() Config { return *s.cfg.Load() }

// now is the router's clock: time since the proxy started.
func (s *Server) now() time.Duration { return time.Since(s.start) }

// Handler serves the OpenAI API, /health and /metrics to clients.
func (s *Server) Handler() http.Handler { return s.mux }

// AdminHandler serves /admin/* and /metrics to operators, behind the
// bearer tokens if any are configured.
func (s *Server) AdminHandler() http.Handler {
	auth, assets := s.authenticated(s.admin), uiAssets()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/admin/ui":
			http.Redirect(w, r, "/admin/ui/", http.StatusFound)
		case strings.HasPrefix(r.URL.Path, "/admin/ui/") && r.URL.Path != "/admin/ui/stream" && r.Method == http.MethodGet:
			assets.ServeHTTP(w, r) // the page's files hold no data: no token
		default:
			auth.ServeHTTP(w, r)
		}
	})
}

func (s *Server) upstream(id string) *upstream { return (*s.ups.Load())[id] }

// upstreams returns every upstream.
func (s *Server) upstreams() map[string]*upstream { return *s.ups.Load() }

func (s *Server) setUpstream(id string, u *upstream) {
	old := s.upstreams()
	next := make(map[string]*upstream, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	if u == nil {
		delete(next, id)
	} else {
		next[id] = u
	}
	s.ups.Store(&next)
}

// AddReplica brings a replica into the fleet: it is probed at once (if
// the proxy runs) and routed to once a probe has reached it.
func (s *Server) AddReplica(rc ReplicaConfig, source string) error {
	rc = rc.Defaults()
	if err := rc.Validate(); err != nil {
		return fmt.Errorf("replica %s: %w", rc.ID, err)
	}
	key, err := replicaKey(rc)
	if err != nil {
		return err
	}
	s.upMu.Lock()
	defer s.upMu.Unlock()
	if err := s.rt.Add(routerConfig(rc)); err != nil {
		return err
	}
	if old := s.upstream(rc.ID); old != nil {
		old.halt() // a replica of the same id that has left the router since
	}
	u := newUpstream(rc, source)
	u.apiKey = key
	s.setUpstream(rc.ID, u)
	s.m.healthy.WithLabelValues(rc.ID).Set(0)
	s.startLoops(u)
	s.log.Info("replica added", "replica", rc.ID, "url", rc.URL, "region", rc.Region, "source", source)
	return nil
}

func routerConfig(rc ReplicaConfig) router.ReplicaConfig {
	return router.ReplicaConfig{ID: rc.ID, Region: rc.Region, KVCapacityTokens: rc.KVCapacityTokens,
		PrefillMSPerToken: rc.PrefillMSPerTok, QueueMSPerToken: rc.QueueMSPerTok, ITLBaseMS: rc.ITLMS, ITLSlopeMS: rc.ITLSlopeMS}
}

// RemoveReplica drains a replica and forgets it once its requests in
// flight have finished.
func (s *Server) RemoveReplica(id string) error {
	if err := s.rt.Remove(id); err != nil {
		return err
	}
	s.log.Info("replica removing", "replica", id)
	s.reap(id)
	return nil
}

// reap drops the upstream of a replica the router has forgotten.
func (s *Server) reap(id string) {
	s.upMu.Lock()
	defer s.upMu.Unlock()
	u := s.upstream(id)
	if u == nil || s.rt.Has(id) {
		return
	}
	u.halt()
	s.setUpstream(id, nil)
	s.m.forget(id)
	s.core.Metrics.Forget(id)
	s.log.Info("replica removed", "replica", id)
}

// replaceReplica swaps a replica for a new one of the same id (its URL
// changed): the old one's requests in flight finish where they are; the
// new one starts afresh.
func (s *Server) replaceReplica(rc ReplicaConfig, source string) error {
	s.upMu.Lock()
	if u := s.upstream(rc.ID); u != nil {
		u.halt()
	}
	s.setUpstream(rc.ID, nil)
	s.upMu.Unlock()
	if err := s.rt.Forget(rc.ID); err != nil && !errors.Is(err, router.ErrUnknown) {
		return err
	}
	return s.AddReplica(rc, source)
}

// Run probes and scrapes every replica, watches DNS groups and the config
// file, until ctx ends. Replicas are routed to only after a probe has
// reached them, so call ProbeOnce before serving.
func (s *Server) Run(ctx context.Context) error {
	s.runMu.Lock()
	s.run = ctx
	for _, u := range s.upstreams() {
		s.startLoopsLocked(u, false) // ProbeOnce probed them
	}
	s.runMu.Unlock()
	if err := s.startDiscovery(s.Config().Discover); err != nil {
		s.leaveMesh()
		return err
	}
	s.loops.Add(2)
	go func() {
		defer s.loops.Done()
		s.core.RunAdmission(ctx)
	}()
	go func() {
		defer s.loops.Done()
		s.runDashboard(ctx.Done())
		s.quitOnce.Do(func() { close(s.quit) }) // a shutdown does not wait for open live views
	}()
	if s.path != "" && s.Config().ConfigPoll > 0 {
		s.loops.Add(1)
		go func() {
			defer s.loops.Done()
			s.pollConfig(ctx)
		}()
	}
	<-ctx.Done()
	s.runMu.Lock()
	s.run = nil
	s.runMu.Unlock()
	s.loops.Wait()
	s.leaveMesh()
	return nil
}

// startLoops starts a replica's probe and scrape loops, probing at once,
// if Run is running (else Run starts them).
func (s *Server) startLoops(u *upstream) {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	s.startLoopsLocked(u, true)
}

func (s *Server) startLoopsLocked(u *upstream, probeNow bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if s.run == nil || u.stop != nil || u.stopped {
		return
	}
	ctx, cancel := context.WithCancel(s.run)
	u.stop = cancel
	s.loops.Add(2)
	go func() {
		defer s.loops.Done()
		s.probeLoop(ctx, u, probeNow)
	}()
	go func() {
		defer s.loops.Done()
		s.scrapeLoop(ctx, u)
	}()
}

// ProbeOnce probes every replica once, concurrently.
func (s *Server) ProbeOnce(ctx context.Context) {
	var wg sync.WaitGroup
	for _, u := range s.upstreams() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.probe(ctx, u)
		}()
	}
	wg.Wait()
}

// SetResolver sets the DNS resolver of discover groups; call it before
// Run. The default is a strict pure-Go resolver (see discover.NewWatcher).
func (s *Server) SetResolver(r discover.Resolver) { s.resolver = r }

// startDiscovery (re)starts the DNS watcher for groups; replicas of groups
// no longer listed leave.
func (s *Server) startDiscovery(groups []discover.Group) error {
	s.discoMu.Lock()
	defer s.discoMu.Unlock()
	s.dnsMu.Lock()
	stop, done := s.stopWatcher, s.watcherDone
	s.stopWatcher, s.watcherDone = nil, nil
	s.dnsMu.Unlock()
	if stop != nil {
		stop()
		<-done // its last callback has run
	}
	s.dnsMu.Lock()
	defer s.dnsMu.Unlock()
	keep := map[string]bool{}
	for _, g := range groups {
		keep[g.Name()] = true
	}
	for name, ids := range s.dnsSets {
		if !keep[name] {
			for id := range ids {
				s.removeQuietly(id)
			}
			delete(s.dnsSets, name)
		}
	}
	if len(groups) == 0 {
		return nil
	}
	w, err := discover.NewWatcher(groups, s.resolver, func(i int, eps []discover.Endpoint) { s.discovered(groups[i], eps) },
		s.log.With("component", "discover"))
	if err != nil {
		return err
	}
	s.runMu.Lock()
	defer s.runMu.Unlock()
	if s.run == nil {
		return nil // not running (yet): Run starts it
	}
	ctx, cancel := context.WithCancel(s.run)
	s.stopWatcher, s.watcherDone = cancel, make(chan struct{})
	s.loops.Add(1)
	go func(done chan struct{}) {
		defer s.loops.Done()
		defer close(done)
		_ = w.Run(ctx)
	}(s.watcherDone)
	return nil
}

// discovered makes a DNS group's replicas those it resolved to.
func (s *Server) discovered(g discover.Group, eps []discover.Endpoint) {
	s.dnsMu.Lock()
	defer s.dnsMu.Unlock()
	name := g.Name()
	old := s.dnsSets[name]
	now := map[string]bool{}
	for _, ep := range eps {
		now[ep.ID] = true
		rc := ReplicaConfig{ID: ep.ID, URL: ep.URL, Region: ep.Region, Profile: ep.Profile}.Defaults()
		var err error
		switch u := s.upstream(ep.ID); {
		case !old[ep.ID] || u == nil || !s.rt.Has(ep.ID):
			err = s.AddReplica(rc, sourceDNS+name)
		case u.source != sourceDNS+name || u.cfg == rc:
		case u.cfg.URL != rc.URL: // the group's scheme changed
			err = s.replaceReplica(rc, sourceDNS+name)
		default: // its region or profile changed
			err = s.reconfigure(rc)
		}
		if err != nil {
			s.log.Error("discovered replica not added", "replica", ep.ID, "group", name, "error", err)
			delete(now, ep.ID)
		}
	}
	for id := range old {
		if !now[id] {
			s.removeQuietly(id)
		}
	}
	s.dnsSets[name] = now
}

func (s *Server) removeQuietly(id string) {
	if err := s.RemoveReplica(id); err != nil && !errors.Is(err, router.ErrUnknown) {
		s.log.Error("replica not removed", "replica", id, "error", err)
	}
}

// joinMesh connects to the mesh bus (running the embedded NATS server
// first, if the config asks for one).
func (s *Server) joinMesh(mc mesh.Config, region string) error {
	if mc.Name == "" {
		mc.Name = region
	}
	if mc.Embed != "" {
		url, stop, err := mesh.Serve(mc.Embed)
		if err != nil {
			return err
		}
		s.nats = stop
		if mc.URL == "" {
			mc.URL = url
		}
	}
	b, err := mesh.Connect(mc, s.rt, s.now, s.log)
	if err != nil {
		if s.nats != nil {
			s.nats()
		}
		return err
	}
	s.bus = b
	s.log.Info("joined the mesh", "name", mc.Name, "url", mc.URL)
	return nil
}

// leaveMesh closes the bus and the embedded NATS server.
func (s *Server) leaveMesh() {
	if s.bus != nil {
		s.bus.Close()
	}
	if s.nats != nil {
		s.nats()
	}
}

// Bus is the mesh bus (nil off a mesh).
func (s *Server) Bus() *mesh.Bus { return s.bus }

// Core is the request lifecycle core the proxy's front ends share (the
// HTTP proxy, an endpoint picker).
func (s *Server) Core() *lifecycle.Core { return s.core }

// Endpoint returns a replica's address as host:port (from its URL, the
// scheme's port when none is given), for front ends that name endpoints
// rather than forward to them.
func (s *Server) Endpoint(id string) (string, bool) {
	u := s.upstream(id)
	if u == nil {
		return "", false
	}
	parsed, err := url.Parse(u.cfg.URL)
	if err != nil || parsed.Host == "" {
		return "", false
	}
	host, port := parsed.Hostname(), parsed.Port()
	if port == "" {
		port = "80"
		if parsed.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(host, port), true
}

// EndpointIDs maps host:port addresses to replica ids, for a gateway's
// subset hints.
func (s *Server) EndpointIDs() map[string]string {
	out := map[string]string{}
	for id := range s.upstreams() {
		if ep, ok := s.Endpoint(id); ok {
			out[ep] = id
		}
	}
	return out
}
