// Package mesh shares routing state between gorgo routers in different
// regions, over NATS: each router tells the others of its own requests
// (dispatch with the prompt's blocks, first token, end), and mirrors
// theirs in its router.Router (Router.Enter), so that each sees the whole
// fleet's load and prefix caches, a one-way delay late. The simulator
// measured that this pays (docs/results.md, part 7).
//
// The sharing is best-effort. A router that loses the bus forgets what it
// mirrored and routes on its own signals until it is back; the others
// forget a router they stop hearing from (heartbeats); a mirror whose end
// never came is dropped after RemoteTTL. Nothing a router does for its own
// requests waits on the bus.
package mesh

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// Config configures a router's connection to the mesh bus.
type Config struct {
	// URL is the NATS server (or cluster) to use, e.g. nats://host:4222;
	// default: the embedded one.
	URL string `yaml:"url"`
	// Embed, if set, runs a NATS server inside this process on that
	// address (host:port), for a mesh on one machine or for the other
	// routers to join (see Serve).
	Embed string `yaml:"embed"`
	// Name is this router's name, unique in the mesh (default
	// DefaultName: the region and the host's name, so that several routers
	// of one region, on several hosts or pods, are told apart).
	Name string `yaml:"name"`
	// Subject is the NATS subject the routers share (default gorgo.mesh).
	Subject string `yaml:"subject"`
	// Heartbeat is how often a router says it is alive (default 2 s); a
	// router not heard from for 5 heartbeats is forgotten.
	Heartbeat time.Duration `yaml:"heartbeat"`
	// RemoteTTL drops a mirrored request whose end never came (default
	// 10 min).
	RemoteTTL time.Duration `yaml:"remote_ttl"`
}

// DefaultName is a router's name in the mesh when its config gives none:
// "REGION/HOST" (the region alone if the host's name is unknown; none
// without a region). Routers of one region behind a load balancer, each on
// its own host or pod, get names of their own; two on one host need a name
// each.
func DefaultName(region string) string {
	if region == "" {
		return ""
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		return region + "/" + h
	}
	return region
}

func (c *Config) defaults() {
	if c.Subject == "" {
		c.Subject = "gorgo.mesh"
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 2 * time.Second
	}
	if c.RemoteTTL <= 0 {
		c.RemoteTTL = 10 * time.Minute
	}
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	switch {
	case c.URL == "":
		return errors.New("mesh: url is required")
	case c.Name == "":
		return errors.New("mesh: name is required (default: the router's region and host)")
	case c.Heartbeat < 0 || c.RemoteTTL < 0:
		return errors.New("mesh: heartbeat and remote_ttl must not be negative")
	}
	return nil
}

// Event kinds.
const (
	kindDispatch = "d"
	kindFirst    = "f"
	kindEnd      = "e"
	kindAlive    = "h"
	kindReset    = "r" // forget every mirror of my requests: I lost some events
	kindCharge   = "c" // a charge to a tenant's budgets
)

// event is what a router tells the others.
type event struct {
	Router string `json:"r"`
	// Boot tells a router's runs apart: a router restarted under the same
	// name starts its attempt ids again.
	Boot uint64 `json:"o"`
	// Heartbeat is the sender's heartbeat period (ms): it is quiet after
	// five of its own, whatever the receiver's period.
	Heartbeat int64    `json:"hb,omitempty"`
	Kind      string   `json:"k"`
	ID        uint64   `json:"i,omitempty"`
	Replica   string   `json:"rep,omitempty"`
	Prompt    int      `json:"p,omitempty"`
	Blocks    []uint64 `json:"b,omitempty"`
	// Unstreamed: no first-token event will follow (a non-streaming
	// answer); the mirror leaves the backlog when its first token is due.
	Unstreamed bool `json:"u,omitempty"`
	// Out and DecodeUS are an end's answer length and the µs from its
	// first token to its last (0 when not streamed), when it completed:
	// every router learns the replica's ITL and answers' lengths from them
	// (router.Decoded).
	Out      int   `json:"n,omitempty"`
	DecodeUS int64 `json:"du,omitempty"`
	// Application and Conversation are a dispatch's router.OutputKeys:
	// the answer's length, at its end, feeds every router's estimate
	// under them.
	Application  uint64 `json:"oa,omitempty"`
	Conversation uint64 `json:"oc,omitempty"`
	// Tenant, Requests and Tokens are a charge to a tenant's budgets
	// (negative: given back).
	Tenant   string  `json:"t,omitempty"`
	Requests float64 `json:"rq,omitempty"`
	Tokens   float64 `json:"tk,omitempty"`
}

type key struct {
	router string
	boot   uint64
	id     uint64
}

// heard is when another router was last heard from, and its heartbeat.
type heard struct {
	at        time.Time
	heartbeat time.Duration
}

type mirror struct {
	t  router.Ticket
	at time.Time
}

// Bus is one router's connection to the mesh.
type Bus struct {
	cfg Config
	rt  *router.Router
	now func() time.Duration // the router's clock
	log *slog.Logger
	nc  *nats.Conn

	boot uint64
	lost atomic.Bool // events were dropped while the bus was down
	// namesake: another router was heard under this router's name (it is
	// logged once).
	namesake  atomic.Bool
	mu        sync.Mutex
	closed    bool
	remote    map[key]*mirror
	seen      map[string]heard  // other routers, when last heard from
	boots     map[string]uint64 // other routers' current runs
	stop      chan struct{}
	stopped   sync.WaitGroup
	closeOnce sync.Once

	sent, applied, dropped atomic.Int64
	// charge applies the others' charges to this router's tenants' budgets
	// (OnCharge; nil: they are ignored).
	charge atomic.Pointer[func(tenant string, requests, tokens float64)]
}

// Connect joins the mesh: it mirrors the other routers' requests in rt
// (whose clock is now) and tells them of this router's through the
// methods of the lifecycle.Observer interface. The bus is best-effort: if
// the NATS server cannot be reached at first, Connect logs it and returns
// a bus that keeps trying (the router routes on its own state until
// then), so that a router does not fail to start, or crash-loop, for want
// of its peers. A URL that cannot work is an error.
func Connect(cfg Config, rt *router.Router, now func() time.Duration, log *slog.Logger) (*Bus, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Bus{cfg: cfg, rt: rt, now: now, log: log, remote: map[key]*mirror{}, seen: map[string]heard{}, boots: map[string]uint64{},
		stop: make(chan struct{}), boot: uint64(time.Now().UnixNano())}
	nc, err := nats.Connect(cfg.URL, nats.Name("gorgo "+cfg.Name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectBufSize(1<<20), nats.RetryOnFailedConnect(true),
		nats.ConnectHandler(func(*nats.Conn) { log.Info("mesh bus up"); b.resetIfLost() }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			// What was mirrored will not be kept up to date: forget it,
			// and route on this router's own signals until the bus is back.
			n := b.forgetAll()
			log.Warn("mesh bus lost: routing on this router's own state", "error", err, "forgotten", n)
		}),
		nats.ClosedHandler(func(*nats.Conn) { b.forgetAll() }),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("mesh bus back"); b.resetIfLost() }))
	if err != nil {
		return nil, fmt.Errorf("mesh: connecting to %s: %w", cfg.URL, err)
	}
	b.nc = nc
	if _, err := nc.Subscribe(cfg.Subject, b.receive); err != nil {
		nc.Close()
		return nil, fmt.Errorf("mesh: subscribing to %s: %w", cfg.Subject, err)
	}
	if !nc.IsConnected() {
		// The subscription is made once the first connection is.
		log.Warn("mesh bus not reachable yet: routing on this router's own state, and trying", "url", cfg.URL)
	} else if err := nc.FlushTimeout(5 * time.Second); err != nil { // the subscription is in place
		nc.Close()
		return nil, fmt.Errorf("mesh: %s: %w", cfg.URL, err)
	}
	b.stopped.Add(1)
	go b.housekeep()
	return b, nil
}

// resetIfLost tells the others to forget this router's requests if some of
// its events never left (the buffer kept while the bus was down filled):
// they must not keep mirrors whose ends they will never hear of.
func (b *Bus) resetIfLost() {
	if b.lost.Swap(false) {
		b.publish(event{Kind: kindReset})
	}
}

// Close leaves the mesh, forgetting what was mirrored. Calling it again
// does nothing.
func (b *Bus) Close() {
	b.closeOnce.Do(func() {
		close(b.stop)
		b.stopped.Wait()
		b.mu.Lock()
		b.closed = true // a message delivered after this is ignored
		b.mu.Unlock()
		b.nc.Close()
		b.forgetAll()
	})
}

// Connected reports whether the bus is up.
func (b *Bus) Connected() bool { return b.nc.IsConnected() }

// Conn is the NATS connection (for tests that cut it).
func (b *Bus) Conn() *nats.Conn { return b.nc }

// Counts returns the events published, the others' events applied, and
// the mirrors dropped (their router went quiet, or their end never came).
func (b *Bus) Counts() (sent, applied, dropped int64) {
	return b.sent.Load(), b.applied.Load(), b.dropped.Load()
}

// Mirrors returns how many of the others' requests this router mirrors.
func (b *Bus) Mirrors() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.remote)
}

// Dispatched tells the others that request attempt id went to replica.
func (b *Bus) Dispatched(id uint64, replica string, req *policy.Request) {
	k := b.rt.OutputKeys(req)
	b.publish(event{Kind: kindDispatch, ID: id, Replica: replica, Prompt: req.PromptTokens, Blocks: req.Blocks, Unstreamed: req.Unstreamed,
		Application: k[0], Conversation: k[1]})
}

// FirstToken tells the others that attempt id produced its first token.
func (b *Bus) FirstToken(id uint64) { b.publish(event{Kind: kindFirst, ID: id}) }

// Charged tells the others of a charge to a tenant's budgets made here
// (tenant.Set.Share).
func (b *Bus) Charged(tenant string, requests, tokens float64) {
	b.publish(event{Kind: kindCharge, Tenant: tenant, Requests: requests, Tokens: tokens})
}

// OnCharge has the others' charges to tenants' budgets applied by fn
// (tenant.Set.ChargeRemote), so that a tenant's budget is the mesh's.
func (b *Bus) OnCharge(fn func(tenant string, requests, tokens float64)) { b.charge.Store(&fn) }

// Finished tells the others that attempt id ended.
func (b *Bus) Finished(id uint64, outputTokens int, decode time.Duration) {
	b.publish(event{Kind: kindEnd, ID: id, Out: outputTokens, DecodeUS: decode.Microseconds()})
}

// publish sends an event; it never blocks on the network. While the bus
// reconnects the NATS client buffers what is published (up to 1 MiB); an
// event that does not fit is lost, and the others are told to forget this
// router's mirrors once the bus is back.
func (b *Bus) publish(e event) {
	e.Router, e.Boot, e.Heartbeat = b.cfg.Name, b.boot, b.cfg.Heartbeat.Milliseconds()
	data, err := json.Marshal(&e)
	if err != nil {
		return
	}
	if err := b.nc.Publish(b.cfg.Subject, data); err != nil {
		if !errors.Is(err, nats.ErrConnectionClosed) {
			b.lost.Store(true)
		}
		return
	}
	b.sent.Add(1)
}

func (b *Bus) receive(m *nats.Msg) {
	var e event
	if err := json.Unmarshal(m.Data, &e); err != nil || e.Router == "" {
		return
	}
	if e.Router == b.cfg.Name {
		if e.Boot != b.boot && b.namesake.CompareAndSwap(false, true) {
			// Another router goes by this name: neither can tell the
			// other's requests from its own, and both route as if alone.
			b.log.Error("another router in the mesh has this router's name: give each a name of its own (mesh.name); its requests are ignored", "name", e.Router)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	hb := time.Duration(e.Heartbeat) * time.Millisecond
	if hb <= 0 {
		hb = b.cfg.Heartbeat
	}
	b.seen[e.Router] = heard{at: time.Now(), heartbeat: hb}
	if old, ok := b.boots[e.Router]; ok && old != e.Boot {
		b.forgetRouter(e.Router) // it restarted: its old requests are gone
	}
	b.boots[e.Router] = e.Boot
	k := key{e.Router, e.Boot, e.ID}
	switch e.Kind {
	case kindDispatch:
		req := policy.Request{PromptTokens: e.Prompt, Blocks: e.Blocks, Unstreamed: e.Unstreamed}
		if _, dup := b.remote[k]; dup {
			return
		}
		t, ok := b.rt.Enter(b.now(), e.Replica, &req, router.OutputKeys{e.Application, e.Conversation})
		if !ok {
			return // a replica this router does not know, or not active
		}
		b.rt.Accepted(&t, &req)
		b.remote[k] = &mirror{t: t, at: time.Now()}
	case kindFirst:
		if mr := b.remote[k]; mr != nil {
			b.rt.FirstToken(&mr.t, 0)
		}
	case kindEnd:
		if mr := b.remote[k]; mr != nil {
			if e.Out > 0 { // a completed answer (its decode is 0 when not streamed)
				b.rt.Decoded(&mr.t, e.Out, time.Duration(e.DecodeUS)*time.Microsecond)
			}
			b.rt.Finish(&mr.t)
			delete(b.remote, k)
		}
	case kindReset:
		b.forgetRouter(e.Router)
	case kindCharge:
		fn := b.charge.Load()
		if fn == nil || e.Tenant == "" {
			return
		}
		(*fn)(e.Tenant, e.Requests, e.Tokens)
	case kindAlive:
		return
	default:
		return
	}
	b.applied.Add(1)
}

// housekeep says this router is alive, and drops the mirrors of routers
// gone quiet and of requests whose end never came.
func (b *Bus) housekeep() {
	defer b.stopped.Done()
	tick := time.NewTicker(b.cfg.Heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-tick.C:
		}
		b.publish(event{Kind: kindAlive})
		b.sweep(time.Now())
	}
}

func (b *Bus) sweep(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, mr := range b.remote {
		if seen, ok := b.seen[k.router]; !ok || now.Sub(seen.at) > 5*seen.heartbeat || now.Sub(mr.at) > b.cfg.RemoteTTL {
			b.rt.Finish(&mr.t)
			delete(b.remote, k)
			b.dropped.Add(1)
		}
	}
}

// forgetRouter drops every mirror of one router's requests; call it with
// b.mu.
func (b *Bus) forgetRouter(name string) {
	for k, mr := range b.remote {
		if k.router == name {
			b.rt.Finish(&mr.t)
			delete(b.remote, k)
			b.dropped.Add(1)
		}
	}
}

// forgetAll drops every mirror.
func (b *Bus) forgetAll() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.remote)
	for k, mr := range b.remote {
		b.rt.Finish(&mr.t)
		delete(b.remote, k)
	}
	b.dropped.Add(int64(n))
	return n
}

// Serve runs a NATS server inside this process on listen (host:port; port
// 0 picks one), for a mesh on one machine or as one node for the others
// to join. It returns the server's client URL and a function that stops
// it.
func Serve(listen string) (url string, stop func(), err error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", nil, fmt.Errorf("mesh: serve %q: %w", listen, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", nil, fmt.Errorf("mesh: serve %q: bad port", listen)
	}
	if p == 0 {
		p = -1 // the server's "any port"
	}
	ns, err := server.NewServer(&server.Options{Host: host, Port: p, NoLog: true, NoSigs: true})
	if err != nil {
		return "", nil, fmt.Errorf("mesh: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return "", nil, fmt.Errorf("mesh: the NATS server on %s did not start", listen)
	}
	return ns.ClientURL(), ns.Shutdown, nil
}
