// Package fleet is a gorgo router's control plane, apart from any front
// end: the replicas (an upstream registry of ids, URLs, endpoints,
// credentials and the transport that reaches them, beside the routing
// core's router.Router), membership from every source through one
// reconciler (Want), the probe and scrape loops that keep the router's view
// of each replica current, health and outlier ejection, the mesh
// connection, the admission loop, and the fleet's part of the config with
// its reload. The HTTP proxy (internal/proxy) and the endpoint picker
// (internal/epp) are front ends over a Fleet; the admin API
// (internal/admin) operates it.
package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/discover"
	"github.com/gorgo-llm/gorgo/internal/lifecycle"
	"github.com/gorgo-llm/gorgo/internal/mesh"
	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// Fleet is a router's replicas and what keeps them current. Create it
// with New and run Run for the loops; it is safe for concurrent use.
type Fleet struct {
	cfg    atomic.Pointer[Config] // the running config (live settings change on reload)
	rt     *router.Router
	policy policy.Policy
	core   *lifecycle.Core
	client *http.Client // probes, scrapes, model lists
	// forward is the client of clients' requests: it shares client's
	// connections and follows no redirect.
	forward *http.Client
	start   time.Time
	bus     *mesh.Bus // nil off a mesh
	// abortGrace is the mesh's abort_grace (see AbortGrace).
	abortGrace time.Duration
	nats       func() // stops the embedded NATS server, if any
	m          *metrics
	log        *slog.Logger

	// ups maps replica ids to upstreams; it changes under mu and is read
	// through the atomic pointer.
	ups atomic.Pointer[map[string]*Upstream]
	// mu serialises membership: the sources' wishes, the upstream map,
	// the start of loops, the running sources.
	mu      sync.Mutex
	wishes  map[string]map[string]ReplicaConfig // source -> id -> replica
	sources map[string]*running                 // watching sources, by name
	run     context.Context                     // Run's, nil when not running
	loops   sync.WaitGroup
	// intervals is closed (and replaced) when a reload changes the probe
	// or scrape interval: the loops waiting on the old one wake up.
	intervals atomic.Pointer[chan struct{}]
	// ejectMu serialises ejections caused by requests against the share
	// of the fleet ejected (max_ejection_percent); taken under an
	// Upstream's mu.
	ejectMu sync.Mutex

	resolver discover.Resolver
	// aliases are the router's own model names (the config's models:).
	aliases *models.Resolver
}

// Options are what a Fleet is built with besides its config.
type Options struct {
	// Policy routes; nil means the config's policy.
	Policy policy.Policy
	// Registry gets the fleet's and the requests' metrics (required).
	Registry prometheus.Registerer
	// Log gets membership changes, health and reloads (nil: discarded);
	// AccessLog one line per request (nil: none).
	Log, AccessLog *slog.Logger
	// Tap hears of every request's decision and end (a live view).
	Tap lifecycle.Tap
	// Resolver resolves DNS groups (nil: a strict pure-Go resolver, see
	// discover.NewWatcher).
	Resolver discover.Resolver
	// Fallbacks is how many replicas after its choice a decision ranks
	// (default max_attempts − 1; more for a front end that hands the list
	// on).
	Fallbacks int
}

// maxResponseHeaderBytes bounds a replica's response headers: past it the
// attempt fails as the replica's fault (and the next fallback is tried),
// so a hostile replica cannot grow the router or hand clients headers
// larger than they take.
const maxResponseHeaderBytes = 64 << 10

// New builds a fleet from a config (its defaults applied here) and brings
// in the config's replicas; it joins the mesh if the config has one (Run
// leaves it when it ends).
func New(cfg Config, o Options) (*Fleet, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	pol := o.Policy
	if pol == nil {
		var err error
		if pol, err = policy.New(cfg.Policy, cfg.PolicyOptions(cfg.Policy)); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	upTLS, err := cfg.UpstreamTLS.client()
	if err != nil {
		return nil, err
	}
	rt, err := router.New(router.Config{Policy: pol, FleetChanged: fleetChangedLog(o.Log, pol), BlockTokens: cfg.BlockTokens, RTTAlpha: cfg.RTTAlpha,
		OnlineRates: cfg.OnlineRates, TieMargin: cfg.TieMargin, AdapterLoad: cfg.AdapterLoadTime, AdapterLoads: cfg.AdapterLoadTimes,
		GlobalOutput: cfg.OutputEstimate == "global"})
	if err != nil {
		return nil, err
	}
	aliases, _ := models.ParseAliases(cfg.Models) // validated
	f := &Fleet{rt: rt, policy: pol, start: time.Now(), log: o.Log, resolver: o.Resolver, aliases: models.NewResolver(aliases),
		wishes: map[string]map[string]ReplicaConfig{}, sources: map[string]*running{}}
	f.cfg.Store(&cfg)
	f.ups.Store(&map[string]*Upstream{})
	wake := make(chan struct{})
	f.intervals.Store(&wake)
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext:         dialer.DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		// A ~1k-token request (4 KB) leaves in one write with its headers,
		// and an answer comes in with few reads.
		WriteBufferSize:        64 << 10,
		ReadBufferSize:         64 << 10,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
		TLSClientConfig:        upTLS,
	}
	// Probes, scrapes and model lists follow redirects (an ingress in
	// front of a replica may send them); clients' requests do not (see
	// Client).
	f.client = &http.Client{Transport: tr}
	f.forward = &http.Client{Transport: tr,
		// A replica's redirect is not followed: the client's request (and
		// headers) would go, as a GET, wherever the replica points. The
		// proxy takes it as the replica's failure.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	f.m = newMetrics(o.Registry)
	o.Registry.MustRegister(stateCollector{f})
	ts, _ := cfg.tenants()      // validated
	adm, _ := cfg.admission(ts) // validated
	var obs lifecycle.Observer
	if cfg.Mesh != nil {
		if err := f.joinMesh(*cfg.Mesh, cfg.Region); err != nil {
			return nil, err
		}
		obs = f.bus
	}
	ts = f.shared(ts)
	f.core = lifecycle.NewCore(lifecycle.Config{Router: rt, Est: cfg.Estimator(), BlockTokens: cfg.BlockTokens,
		MaxAttempts: cfg.MaxAttempts, Fallbacks: o.Fallbacks, Start: f.start, Health: f, Metrics: lifecycle.NewMetrics(o.Registry),
		Log: o.AccessLog, Seed: cfg.Seed, Admission: adm, Observer: obs, Tap: o.Tap, Aliases: f.aliases, Tenants: ts})
	if f.bus != nil {
		// The engines a client's abort reaches serve the others'
		// requests too: each router relays their aborts, and ends those
		// it covers in its own queue.
		f.bus.OnAbort(func(body []byte, at time.Time) { _, _ = f.core.Abort(body, at) })
		// The others' charges go to the tenants of the moment (a reload
		// changes them).
		f.bus.OnCharge(func(name string, requests, tokens float64) {
			if ts := f.core.Tenants(); ts != nil {
				ts.ChargeRemote(time.Now(), name, requests, tokens)
			}
		})
		f.bus.OnHeld(f.setHeld)
		f.bus.OnProgress(func(id string) {
			if u := f.Upstream(id); u != nil {
				u.Progressed(time.Now())
			}
		})
	}
	if _, err := f.Want(SourceConfig, cfg.Replicas); err != nil {
		f.leaveMesh()
		return nil, err
	}
	f.setSources(dnsSources(cfg.Discover, f.resolver, f.log))
	return f, nil
}

// Run probes and scrapes every replica, runs the watching sources (DNS
// groups) and the admission loop, until ctx ends; then it leaves the mesh.
// Replicas are routed to only after a probe has reached them, so call
// ProbeOnce before serving.
func (f *Fleet) Run(ctx context.Context) error {
	f.mu.Lock()
	f.run = ctx
	for _, u := range f.upstreams() {
		f.startLoops(u, false) // ProbeOnce probed them
	}
	for _, s := range f.sources {
		f.startSource(s)
	}
	f.mu.Unlock()
	f.loops.Add(1)
	go func() {
		defer f.loops.Done()
		f.core.RunAdmission(ctx)
	}()
	<-ctx.Done()
	f.mu.Lock()
	f.run = nil
	f.mu.Unlock()
	f.loops.Wait()
	f.leaveMesh()
	return nil
}

// Close leaves the mesh, for a fleet that will not Run (Run leaves it when
// it ends).
func (f *Fleet) Close() error {
	f.leaveMesh()
	return nil
}

// ProbeOnce probes every replica once, firstProbes at a time, every
// firstProbesPace: a burst of hundreds is the router's own load, timed as
// the network's (2026-12-07, a user's test: 500 local replicas first
// measured at 37–74 ms, whose estimates, settling, were hundreds of
// changes of the fleet). Paced, not bounded in number: replicas that
// never answer would each hold a place for a probe's timeout (a review:
// 64 hung replicas took two timeouts to start, 500 would take 16).
func (f *Fleet) ProbeOnce(ctx context.Context) {
	var wg sync.WaitGroup
	i := 0
	for _, u := range f.upstreams() {
		if i++; i > firstProbes && i%firstProbes == 1 {
			select { // paced: not waiting for the probes sent, a hung replica holds up none
			case <-ctx.Done():
			case <-time.After(firstProbesPace):
			}
		}
		wg.Go(func() { f.probe(ctx, u) })
	}
	wg.Wait()
}

// firstProbes go every firstProbesPace when a fleet starts (ProbeOnce).
const firstProbes = 32

var firstProbesPace = 10 * time.Millisecond // a variable for tests

// startLoops starts a replica's probe and scrape loops, probing at once
// if probeNow, when the fleet runs (else Run starts them). Call with f.mu
// held.
func (f *Fleet) startLoops(u *Upstream, probeNow bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if f.run == nil || u.stop != nil || u.stopped {
		return
	}
	ctx, cancel := context.WithCancel(f.run)
	u.stop = cancel
	f.loops.Add(2)
	go func() {
		defer f.loops.Done()
		f.probeLoop(ctx, u, probeNow)
	}()
	go func() {
		defer f.loops.Done()
		f.scrapeLoop(ctx, u)
	}()
}

// Router is the routing core.
func (f *Fleet) Router() *router.Router { return f.rt }

// Core is the request lifecycle the front ends serve through.
func (f *Fleet) Core() *lifecycle.Core { return f.core }

// Abort takes a client's abort (the body of SGLang's /abort_request),
// received at, before the front end sends it to the replicas: the
// requests in this router's queue it covers end, the engines' aborts of
// the others are relayed (lifecycle.Core.Abort), and the other routers of
// a mesh, whose requests the same engines abort, are told. It returns how
// many requests left this router's queue.
func (f *Fleet) Abort(body []byte, at time.Time) int {
	n, named := f.core.Abort(body, at)
	if named && f.bus != nil && !f.bus.Aborted(body, at) {
		f.log.Warn("a client's abort is too long to tell the other routers of the mesh: their requests it covers may fail over", "bytes", len(body))
	}
	if n > 0 {
		f.log.Info("aborted in the router's queue", "requests", n)
	}
	return n
}

// AbortGrace is how long to wait for the news of a client's abort before
// an engine's abort of a request is taken for the engine's own (see
// lifecycle.Request.AwaitClientAbort): the mesh's abort_grace (an
// engine's own abort, before a first token, is rare: shutting down,
// paused), 0 off a mesh, where the router hears of every abort before the
// engines do.
func (f *Fleet) AbortGrace() time.Duration {
	if f.bus == nil {
		return 0
	}
	return f.abortGrace
}

// Policy is the routing policy.
func (f *Fleet) Policy() policy.Policy { return f.policy }

// Config returns the running config.
func (f *Fleet) Config() Config { return *f.cfg.Load() }

// Client is the client of clients' requests to the replicas: it follows no
// redirect (see fleet.New).
func (f *Fleet) Client() *http.Client { return f.forward }

// Bus is the mesh bus (nil off a mesh).
func (f *Fleet) Bus() *mesh.Bus { return f.bus }

// Now is the router's clock: time since the fleet started.
func (f *Fleet) Now() time.Duration { return time.Since(f.start) }

// Upstream returns the replica of that id (nil if none).
func (f *Fleet) Upstream(id string) *Upstream { return (*f.ups.Load())[id] }

func (f *Fleet) upstreams() map[string]*Upstream { return *f.ups.Load() }

// Endpoint returns a replica's address as host:port.
func (f *Fleet) Endpoint(id string) (string, bool) {
	u := f.Upstream(id)
	if u == nil {
		return "", false
	}
	return u.Endpoint()
}

// EndpointIDs maps host:port addresses to replica ids, for a gateway's
// subset hints.
func (f *Fleet) EndpointIDs() map[string]string {
	out := map[string]string{}
	for id, u := range f.upstreams() {
		if ep, ok := u.Endpoint(); ok {
			out[ep] = id
		}
	}
	return out
}

// Aliases are the router's own model names: aliases and canary splits.
func (f *Fleet) Aliases() *models.Resolver { return f.aliases }

// Drain stops new requests to a replica; its requests in flight finish.
func (f *Fleet) Drain(id string) error { return f.rt.Drain(id) }

// Undrain makes a draining (or leaving) replica active again. One that was
// leaving (Remove, or its source no longer wanted it) is its source's
// again, back in that source's wish: a later Add does not take it out
// again, and its source may still let it go (a reload of a config file
// without it, a DNS group's next change); one whose source is gone (a DNS
// group no longer in the config) becomes the admin API's.
func (f *Fleet) Undrain(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := f.rt.Replica(id)
	if err != nil {
		return err
	}
	if err := f.rt.Undrain(id); err != nil {
		return err
	}
	if u := f.Upstream(id); u != nil && st.State == router.Removing {
		f.adopt(u)
	}
	return nil
}

// adopt puts an undrained replica back in its source's wish, or in the
// admin API's if its source is gone. Call with f.mu held.
func (f *Fleet) adopt(u *Upstream) {
	id, source := u.cfg.ID, u.source
	if source != SourceConfig && source != SourceAdmin && f.sources[source] == nil {
		nu, err := newUpstream(u.cfg, SourceAdmin)
		if err != nil {
			f.log.Error("undrained replica left to its gone source", "replica", id, "source", source, "error", err)
			return
		}
		f.swap(u, nu)
		f.log.Info("undrained replica's source is gone: the replica is the admin API's now", "replica", id, "source", source)
		source = SourceAdmin
	}
	if f.wishes[source] == nil {
		f.wishes[source] = map[string]ReplicaConfig{}
	}
	f.wishes[source][id] = u.cfg
}
