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
// requests waits on the bus, and nothing the others send grows what a
// router keeps without bound (maxPeers, maxMirrorsPerPeer, maxHeldBlocks).
package mesh

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/prefix"
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
	// Heartbeat is how often a router says it is alive (default 2 s, at
	// most MaxHeartbeat); a router not heard from for 5 of its
	// heartbeats has its requests forgotten.
	Heartbeat time.Duration `yaml:"heartbeat"`
	// RemoteTTL drops a mirrored request whose end never came, and
	// forgets a router not heard from for as long (default 10 min).
	RemoteTTL time.Duration `yaml:"remote_ttl"`
	// AbortGrace is how long a router waits for the news of a client's
	// abort through another router before it takes an engine's abort of a
	// request, before its first token, for the engine's own and tries the
	// request elsewhere (default 250 ms, at most 10 s): the engine's answer
	// may come before the bus's news.
	AbortGrace time.Duration `yaml:"abort_grace"`
	// Dial, if set, makes the bus's connections to the NATS server (not
	// in a config file: `gorgo demo --mesh` delays its routers' legs to
	// the bus with it, in user space).
	Dial func(network, address string) (net.Conn, error) `yaml:"-"`
}

// dialer is a Config.Dial as nats.go takes it.
type dialer func(network, address string) (net.Conn, error)

func (d dialer) Dial(network, address string) (net.Conn, error) { return d(network, address) }

// MaxAbortGrace bounds Config.AbortGrace.
const MaxAbortGrace = 10 * time.Second

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
	if c.AbortGrace <= 0 {
		c.AbortGrace = 250 * time.Millisecond
	}
}

// Defaults returns the config with its defaults filled in.
func (c Config) Defaults() Config {
	c.defaults()
	return c
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	switch {
	case c.URL == "":
		return errors.New("mesh: url is required")
	case c.Name == "":
		return errors.New("mesh: name is required (default: the router's region and host)")
	case len(c.Name) > maxRouterName:
		return fmt.Errorf("mesh: name must be at most %d bytes", maxRouterName)
	case c.Heartbeat < 0 || c.RemoteTTL < 0 || c.AbortGrace < 0:
		return errors.New("mesh: heartbeat, remote_ttl and abort_grace must not be negative")
	case c.AbortGrace > MaxAbortGrace:
		return errors.New("mesh: abort_grace must be at most 10s")
	case c.Heartbeat > MaxHeartbeat:
		// The others take a period of at most MaxHeartbeat.
		return errors.New("mesh: heartbeat must be at most 1m")
	}
	return nil
}

// Bounds on what the others' events make a router keep: names and ids
// come from the bus, and a buggy or hostile publisher must not grow them
// without end.
const (
	// maxRouterName bounds a router's name: an event under a longer one
	// is not heard (a peer is kept under its name until it goes quiet).
	maxRouterName = 256
	// maxPeers is how many other routers are tracked at once. A mesh is a
	// few regions of a few routers each; pods rolled out under new names
	// take the places of quiet ones (see hear), and a router that finds
	// the table full of routers still heard from is not mirrored.
	maxPeers = 256
	// maxMirrorsPerPeer is how many of one router's requests are mirrored
	// at once: far above what one router keeps in flight (a replica runs a
	// few hundred requests at a time), so that only a router that leaks
	// or invents requests reaches it; its further requests are not
	// mirrored until some end. With maxPeers, at most about 2M tickets.
	maxMirrorsPerPeer = 8192
	// maxMirrorBlocks is how many of a mirrored prompt's blocks are kept
	// until its replica takes it (a prompt of 128k tokens at 16 a block),
	// and maxHeldBlocks how many all mirrors keep (32 MiB): past it a
	// mirror is counted in its replica's ledger but not credited in the
	// prefix index.
	maxMirrorBlocks = 1 << 13
	maxHeldBlocks   = 1 << 22
	// maxMirrorPrompt is the longest prompt (tokens) a mirror is charged
	// with: far above any model's context, and small enough that all the
	// mirrors' prompts together cannot overflow a replica's ledger. A
	// dispatch naming a negative or longer prompt is not mirrored.
	maxMirrorPrompt = 1 << 24
)

// Event kinds.
const (
	kindDispatch = "d"
	kindFirst    = "f"
	kindEnd      = "e"
	kindAlive    = "h"
	kindReset    = "r" // forget every mirror of my requests: I lost some events
	kindCharge   = "c" // a charge to a tenant's budgets
	kindAccepted = "a" // the replica took the request: its prompt is cached there
	kindStored   = "s" // the replica answered (and stores) a Responses API response
	kindAbort    = "x" // a client aborted requests (SGLang's /abort_request)
	kindFlushed  = "z" // a client emptied the replica's prefix cache (/flush_cache)
	kindSlept    = "p" // a client put the replica's engine to sleep, or woke it
	kindHeld     = "k" // a client paused the replica's engine, or let it go on
)

// event is what a router tells the others.
type event struct {
	Router string `json:"r"`
	// Boot tells a router's runs apart: a router restarted under the same
	// name starts its attempt ids again.
	Boot uint64 `json:"o"`
	// Heartbeat is the sender's heartbeat period (ms): it is quiet after
	// five of its own, whatever the receiver's period.
	Heartbeat int64 `json:"hb,omitempty"`
	// Mark, on a heartbeat, is the sender's resync epoch: when it hears
	// its own mark back, every event queued for it before is behind it
	// (see unsync). Other routers ignore it.
	Mark uint64 `json:"m,omitempty"`
	// Seq numbers a run's events, one after another: a receiver that
	// finds one missing lost some (a route between NATS servers that
	// blipped drops what crossed it meanwhile, and neither router sees a
	// disconnect), and forgets the sender's mirrors, whose ends may be
	// among them. 0: a sender that does not number them.
	Seq     uint64   `json:"q,omitempty"`
	Kind    string   `json:"k"`
	ID      uint64   `json:"i,omitempty"`
	Replica string   `json:"rep,omitempty"`
	Prompt  int      `json:"p,omitempty"`
	Blocks  []uint64 `json:"b,omitempty"`
	// BlockEnds is a batch's policy.Request.BlockEnds: where each of its
	// prompts' chains ends in Blocks.
	BlockEnds []int `json:"be,omitempty"`
	// Unstreamed: no first-token event will follow (a non-streaming
	// answer); the mirror leaves the backlog when its first token is due.
	Unstreamed bool `json:"u,omitempty"`
	// Choices is a dispatch's count of answers (policy.Request.Choices;
	// omitted for one): the others count its sequences in flight as this
	// router does.
	Choices int `json:"c,omitempty"`
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
	// Response is a stored event's response id: a follow-up that names
	// it, sent to any router, goes to the event's Replica.
	Response string `json:"rs,omitempty"`
	// Model is a dispatch's model (policy.Request.Model): a mirror of a
	// request for a LoRA adapter holds the adapter at its replica, as the
	// request does at its own router. Longer than maxModelName: not read.
	Model string `json:"mo,omitempty"`
	// Abort is an abort event's: the client's /abort_request body (at
	// most maxAbortBody bytes).
	Abort string `json:"ab,omitempty"`
	// At is when the sender received an abort, or sent a dispatch or a
	// heartbeat (Unix ns, its clock): from the latter two the others
	// measure how late its news comes (peer.leg).
	At int64 `json:"at,omitempty"`
	// RTT is a dispatch's: the round trip (µs) the sender believed it had
	// to the replica; the others reckon from it and the leg between them
	// how many of its dispatches reach the replica before they hear of
	// them (router.Origin).
	RTT int64 `json:"rt,omitempty"`
	// Legs is a heartbeat's: the one-way delay (µs, by the two clocks)
	// at which the sender hears each other router's news. With its own
	// measure of the other way, a router has the leg between the two
	// whatever the clocks' difference (it cancels out).
	Legs map[string]int64 `json:"lg,omitempty"`
	// Asleep is a slept event's: the replica sleeps (or was woken).
	Asleep bool `json:"sl,omitempty"`
	// Held is a held event's: the replica's engine is paused (or was let
	// go on).
	Held bool `json:"hd,omitempty"`
}

// maxAbortBody bounds an abort's body told to the others: a list of
// rids of 64 KiB is hundreds of them; a longer one is not shared.
const maxAbortBody = 64 << 10

// MaxHeartbeat bounds every router's heartbeat period: its own (Validate)
// and another's as heard, whatever either's remote_ttl.
const MaxHeartbeat = time.Minute

// maxModelName bounds a mirrored dispatch's model: a name the router
// serves is at most 513 bytes (models.Set's BASE:ADAPTER).
const maxModelName = 1024

// peer is another router, as heard from.
type peer struct {
	boot      uint64             // its current run
	at        time.Time          // when it was last heard from
	heartbeat time.Duration      // its heartbeat period
	seq       uint64             // its last event's Seq
	mirrors   map[uint64]*mirror // its requests in flight, by attempt id
	// ahead is how late its news comes (ns: now − its At, the least in
	// the last minute; off by the clocks' difference), back how late this
	// router's news comes to it, as it said (ns, the other way, off by
	// the opposite); each valid when its flag is set. legs holds the
	// least of each of the latest quarters of a minute.
	ahead, back         float64
	heardAt, heardsBack bool
	legs                [legQuarters]legLeast
}

// legLeast is the least one-way delay of the events received in one
// quarter of a minute (by index: Unix time / legQuarter).
type legLeast struct {
	index int64
	least float64
}

// A router's leg is the least one-way delay of its events received in the
// last minute (legQuarters quarters of legQuarter), not a mean: a one-way
// delay only grows with queueing, and the events a router buffered while it
// was cut off from the bus come, when it is back, all at once with their
// old times, seconds late, which a mean would carry for tens of events and
// a window of the latest events would be filled with. A leg that truly
// grows is taken within the minute.
const (
	legQuarter  = 15 * time.Second
	legQuarters = 4
)

// maxLegSample is the largest one-way delay a sample may say (either
// way): beyond it the clocks are too far apart, or the sender made it up.
const maxLegSample = time.Minute

// timed takes the one-way delay of an event sent at at (Unix ns, its
// clock) and received at now.
func (p *peer) timed(at int64, now time.Time) {
	d := float64(now.UnixNano() - at)
	if at <= 0 || math.Abs(d) > float64(maxLegSample) {
		return
	}
	i := now.UnixNano() / int64(legQuarter)
	q := &p.legs[i%legQuarters]
	if q.index != i || !p.heardAt {
		*q = legLeast{index: i, least: d}
	} else {
		q.least = min(q.least, d)
	}
	p.heardAt = true
	p.ahead = math.Inf(1)
	for _, q := range p.legs {
		if q.index > i-legQuarters {
			p.ahead = min(p.ahead, q.least)
		}
	}
}

// leg is the one-way delay of its news to this router, and whether it is
// known: the mean of the two ways when it told its own, in which the
// clocks' difference cancels out; else this way alone.
func (p *peer) leg() (time.Duration, bool) {
	switch {
	case !p.heardAt:
		return 0, false
	case p.heardsBack:
		return time.Duration(max((p.ahead+p.back)/2, 0)), true
	}
	return time.Duration(max(p.ahead, 0)), true
}

// quiet reports whether the router has missed five of its heartbeats.
func (p *peer) quiet(now time.Time) bool { return now.Sub(p.at) > 5*p.heartbeat }

// mirror is another router's request, entered in this router's ledger.
type mirror struct {
	t  router.Ticket
	at time.Time
	// blocks are its prompt's, for the prefix index once its router says
	// the replica took it (nil after).
	blocks []uint64
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
	namesake atomic.Bool
	// slow, crowded, busy and failing say that a slow consumer, a full
	// table of routers, a router at maxMirrorsPerPeer and another error of
	// the NATS client were logged (each is, once).
	slow, crowded, busy, failing, gap atomic.Bool
	// pubMu numbers the events in the order they are published (seq).
	pubMu      sync.Mutex
	seq        uint64
	mu         sync.Mutex
	closed     bool
	peers      map[string]*peer
	heldBlocks int // the mirrors' blocks kept (see hold)
	// stale: events may have been lost (a disconnect, a slow consumer),
	// and those still queued for this router may be older than the loss:
	// no dispatch is mirrored until this router hears its own mark of
	// epoch back (see unsync).
	stale     bool
	epoch     uint64
	stop      chan struct{}
	stopped   sync.WaitGroup
	closeOnce sync.Once

	sent, applied, dropped atomic.Int64
	// charge applies the others' charges to this router's tenants' budgets
	// (OnCharge; nil: they are ignored).
	charge atomic.Pointer[func(tenant string, requests, tokens float64)]
	// abort applies the others' client aborts here (OnAbort; nil: they
	// are ignored).
	abort atomic.Pointer[func(body []byte, at time.Time)]
	// held and progressed tell this router's fleet of the others' pauses
	// and of the progress they see at a replica (OnHeld, OnProgress).
	held       atomic.Pointer[func(replica string, held bool)]
	progressed atomic.Pointer[func(replica string)]
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
	b := newBus(cfg, rt, now, log)
	opts := []nats.Option{nats.Name("gorgo " + cfg.Name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(1 << 20), nats.RetryOnFailedConnect(true),
		nats.ConnectHandler(func(*nats.Conn) { log.Info("mesh bus up"); b.resetIfLost() }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { b.disconnected(err) }),
		nats.ClosedHandler(func(*nats.Conn) { b.forgetAll() }),
		nats.ReconnectHandler(func(*nats.Conn) { b.reconnected() }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { b.asyncError(err) })}
	if cfg.Dial != nil {
		opts = append(opts, nats.SetCustomDialer(dialer(cfg.Dial)))
	}
	nc, err := nats.Connect(cfg.URL, opts...)
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

func newBus(cfg Config, rt *router.Router, now func() time.Duration, log *slog.Logger) *Bus {
	return &Bus{cfg: cfg, rt: rt, now: now, log: log, peers: map[string]*peer{},
		stop: make(chan struct{}), boot: uint64(time.Now().UnixNano())}
}

// disconnected: what was mirrored will not be kept up to date, so it is
// forgotten, and the router routes on its own signals until the bus is
// back.
func (b *Bus) disconnected(err error) {
	n := b.unsync()
	b.log.Warn("mesh bus lost: routing on this router's own state", "error", err, "forgotten", n)
}

func (b *Bus) reconnected() {
	b.log.Info("mesh bus back")
	b.resetIfLost()
	b.heartbeat() // the mark that ends the resync
}

// asyncError handles the NATS client's errors. On a slow consumer the
// client dropped some of the others' events, ends among them: what was
// mirrored is forgotten, as on a disconnect.
func (b *Bus) asyncError(err error) {
	if !errors.Is(err, nats.ErrSlowConsumer) {
		if b.failing.CompareAndSwap(false, true) {
			b.log.Warn("mesh bus error (logged once)", "error", err)
		}
		return
	}
	n := b.unsync()
	b.heartbeat()
	if b.slow.CompareAndSwap(false, true) {
		b.log.Warn("mesh bus: this router fell behind the others' events and some were dropped; it forgot what it mirrored (logged once)",
			"forgotten", n)
	}
}

// unsync forgets every mirror after events were lost, and mirrors no
// dispatch until this router hears its own mark of the new epoch back (a
// heartbeat carries it while stale): the events still queued for it,
// received before the loss and delivered after this, include dispatches
// whose ends it will never hear of, and all of them come before the mark.
// It returns how many mirrors were forgotten.
func (b *Bus) unsync() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.epoch++
	b.stale = true
	return b.forgetAllLocked()
}

// heartbeat says this router is alive, with its mark while it is stale,
// and how late each other router's news comes to it.
func (b *Bus) heartbeat() {
	b.mu.Lock()
	var mark uint64
	if b.stale {
		mark = b.epoch
	}
	var legs map[string]int64
	now := time.Now()
	for name, p := range b.peers {
		if p.heardAt && !p.quiet(now) {
			if legs == nil {
				legs = map[string]int64{}
			}
			legs[name] = int64(p.ahead) / 1e3
		}
	}
	b.mu.Unlock()
	b.publish(event{Kind: kindAlive, Mark: mark, At: now.UnixNano(), Legs: legs})
}

// marked: this router heard its own mark back.
func (b *Bus) marked(epoch uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stale && epoch == b.epoch {
		b.stale = false
	}
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
	n := 0
	for _, p := range b.peers {
		n += len(p.mirrors)
	}
	return n
}

// Dispatched tells the others that request attempt id went to replica,
// to which this router believes its round trip is rtt.
func (b *Bus) Dispatched(id uint64, replica string, rtt time.Duration, req *policy.Request) {
	k := b.rt.OutputKeys(req)
	// The others keep a prompt's first maxMirrorBlocks blocks (hold): a
	// long prompt's whole list would pass NATS's max_payload (1 MiB), and
	// its dispatch would be lost.
	blocks, ends := req.Blocks, req.BlockEnds
	if len(blocks) > maxMirrorBlocks {
		blocks = blocks[:maxMirrorBlocks]
		if ends != nil {
			ends = slices.Clone(ends)
			for i := range ends {
				ends[i] = min(ends[i], maxMirrorBlocks)
			}
		}
	}
	b.publish(event{Kind: kindDispatch, ID: id, Replica: replica, Prompt: req.PromptTokens, Blocks: blocks, BlockEnds: ends, Unstreamed: req.Unstreamed,
		Choices: req.Choices, Application: k[0], Conversation: k[1], Model: req.Model, RTT: rtt.Microseconds(), At: time.Now().UnixNano()})
}

// FirstToken tells the others that attempt id produced its first token.
func (b *Bus) FirstToken(id uint64) { b.publish(event{Kind: kindFirst, ID: id}) }

// Accepted tells the others that the replica took attempt id: they enter
// its prompt in their prefix index, as this router did.
func (b *Bus) Accepted(id uint64) { b.publish(event{Kind: kindAccepted, ID: id}) }

// Charged tells the others of a charge to a tenant's budgets made here
// (tenant.Set.Share).
func (b *Bus) Charged(tenant string, requests, tokens float64) {
	b.publish(event{Kind: kindCharge, Tenant: tenant, Requests: requests, Tokens: tokens})
}

// OnCharge has the others' charges to tenants' budgets applied by fn
// (tenant.Set.ChargeRemote), so that a tenant's budget is the mesh's.
func (b *Bus) OnCharge(fn func(tenant string, requests, tokens float64)) { b.charge.Store(&fn) }

// Stored tells the others that replica answered, and stores, the
// Responses API response responseID (router.Router.Stored).
func (b *Bus) Stored(responseID, replica string) {
	b.publish(event{Kind: kindStored, Response: responseID, Replica: replica})
}

// Aborted tells the others that a client aborted requests through this
// router, at (the body of SGLang's /abort_request): the engines end the
// others' requests it covers too, which they are to relay, not fail over,
// and those waiting in their queues end. It reports whether it was sent
// (a body over maxAbortBody is not).
func (b *Bus) Aborted(body []byte, at time.Time) bool {
	if len(body) == 0 || len(body) > maxAbortBody {
		return false
	}
	b.publish(event{Kind: kindAbort, Abort: string(body), At: at.UnixNano()})
	return true
}

// OnAbort has the others' client aborts applied by fn (the lifecycle's
// Core.Abort), each at when its router received it, or when it was heard
// if that is earlier (clocks differ: an abort is not taken to cover the
// requests that arrived here after it was heard).
func (b *Bus) OnAbort(fn func(body []byte, at time.Time)) { b.abort.Store(&fn) }

// Flushed tells the others that a client emptied replica's prefix cache
// through this router (SGLang's /flush_cache, vLLM's
// /reset_prefix_cache): they forget what it held, as this router did.
func (b *Bus) Flushed(replica string) { b.publish(event{Kind: kindFlushed, Replica: replica}) }

// Slept tells the others that a client put replica's engine to sleep
// through this router, or woke it: they pass it over while it sleeps, as
// this router does.
func (b *Bus) Slept(replica string, asleep bool) {
	b.publish(event{Kind: kindSlept, Replica: replica, Asleep: asleep})
}

// Held tells the others that a client paused replica's engine through
// this router (SGLang's /pause_generation, vLLM's /pause), or let it go
// on: they do not take its held requests for a stall.
func (b *Bus) Held(replica string, held bool) {
	b.publish(event{Kind: kindHeld, Replica: replica, Held: held})
}

// OnHeld has fn hear of the others' pauses and their ends, with the bus's
// lock held (it must not call the bus).
func (b *Bus) OnHeld(fn func(replica string, held bool)) { b.held.Store(&fn) }

// OnProgress has fn hear of the progress the others see at a replica (a
// first token, a finished answer), which this router's own requests there
// may not show. fn is called with the bus's lock held: it must not call
// the bus.
func (b *Bus) OnProgress(fn func(replica string)) { b.progressed.Store(&fn) }

// progress tells the fleet of progress at replica.
func (b *Bus) progress(replica string) {
	if fn := b.progressed.Load(); fn != nil {
		(*fn)(replica)
	}
}

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
	data, err := json.Marshal(&e) // outside the lock: a dispatch's blocks take a while
	if err != nil || len(data) < 2 {
		return
	}
	// The number goes in front ({"q":N,...}) under the lock, so that the
	// events go out in the order they are numbered.
	msg := make([]byte, 0, len(data)+24)
	b.pubMu.Lock()
	b.seq++
	msg = strconv.AppendUint(append(msg, `{"q":`...), b.seq, 10)
	msg = append(append(msg, ','), data[1:]...)
	err = b.nc.Publish(b.cfg.Subject, msg)
	b.pubMu.Unlock()
	if err != nil {
		if !errors.Is(err, nats.ErrConnectionClosed) {
			b.lost.Store(true)
		}
		return
	}
	b.sent.Add(1)
}

func (b *Bus) receive(m *nats.Msg) {
	var e event
	if err := json.Unmarshal(m.Data, &e); err != nil || e.Router == "" || len(e.Router) > maxRouterName || len(e.Abort) > maxAbortBody {
		return
	}
	if e.Router == b.cfg.Name {
		b.own(&e)
		return
	}
	b.apply(&e, time.Now())
}

// own handles an event under this router's name: its own, or a namesake's.
func (b *Bus) own(e *event) {
	switch {
	case e.Boot == b.boot:
		if e.Mark != 0 {
			b.marked(e.Mark)
		}
	case b.namesake.CompareAndSwap(false, true):
		// Another router goes by this name: neither can tell the
		// other's requests from its own, and both route as if alone.
		b.log.Error("another router in the mesh has this router's name: give each a name of its own (mesh.name); its requests are ignored", "name", e.Router)
	}
}

// apply applies another router's event, received at now.
func (b *Bus) apply(e *event, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	p := b.hear(e, now)
	if p == nil {
		return
	}
	if e.Kind == kindDispatch || e.Kind == kindAlive {
		p.timed(e.At, now)
	}
	if back, ok := e.Legs[b.cfg.Name]; ok && e.Kind == kindAlive {
		if lim := maxLegSample.Microseconds(); back >= -lim && back <= lim { // before it is scaled: it could overflow
			p.back, p.heardsBack = float64(time.Duration(back)*time.Microsecond), true
		}
	}
	switch e.Kind {
	case kindDispatch:
		if !b.enter(p, e, now) {
			return
		}
	case kindAccepted:
		if mr := p.mirrors[e.ID]; mr != nil {
			b.credit(mr)
		}
	case kindFirst:
		if mr := p.mirrors[e.ID]; mr != nil {
			b.credit(mr) // the replica is answering: it took the request (a router that sends no accepted event)
			b.rt.FirstToken(&mr.t, 0)
			b.progress(mr.t.ID)
		}
	case kindEnd:
		if mr := p.mirrors[e.ID]; mr != nil {
			if e.Out > 0 { // a completed answer (its decode is 0 when not streamed)
				b.credit(mr)
				b.rt.Decoded(&mr.t, e.Out, time.Duration(e.DecodeUS)*time.Microsecond)
				b.progress(mr.t.ID)
			}
			b.rt.Finish(&mr.t)
			b.let(mr)
			delete(p.mirrors, e.ID)
		}
	case kindStored:
		b.rt.Stored(e.Response, e.Replica)
	case kindReset:
		b.forgetMirrors(p)
	case kindCharge:
		fn := b.charge.Load()
		if fn == nil || e.Tenant == "" {
			return
		}
		(*fn)(e.Tenant, e.Requests, e.Tokens)
	case kindAbort:
		fn := b.abort.Load()
		if fn == nil || e.Abort == "" {
			return
		}
		at := now
		if e.At > 0 && e.At < now.UnixNano() {
			at = time.Unix(0, e.At)
		}
		(*fn)([]byte(e.Abort), at) // it takes the queue's lock, never the bus's
	case kindFlushed:
		_ = b.rt.ClearCache(e.Replica) // a replica this router does not have: nothing to forget
	case kindSlept:
		_ = b.rt.SetAsleep(e.Replica, e.Asleep)
	case kindHeld:
		if fn := b.held.Load(); fn != nil {
			(*fn)(e.Replica, e.Held)
		}
	case kindAlive:
		return
	default:
		return
	}
	b.applied.Add(1)
}

// hear records that the sender of e was heard from at now, and returns it;
// nil if it is new and the table of routers is full of routers still heard
// from. Call it with b.mu.
func (b *Bus) hear(e *event, now time.Time) *peer {
	p := b.peers[e.Router]
	switch {
	case p == nil:
		if len(b.peers) >= maxPeers && !b.evictQuietest(now) {
			if b.crowded.CompareAndSwap(false, true) {
				b.log.Warn("mesh: too many routers heard from at once: the newest are not mirrored (logged once)",
					"max", maxPeers, "router", e.Router)
			}
			return nil
		}
		p = &peer{boot: e.Boot}
		b.peers[e.Router] = p
	case p.boot != e.Boot:
		b.forgetMirrors(p) // it restarted: its old requests are gone
		p.boot = e.Boot
	case e.Seq != 0 && p.seq != 0 && e.Seq != p.seq+1:
		// Some of its events never came: ends among them, maybe.
		if n := b.forgetMirrors(p); n > 0 && b.gap.CompareAndSwap(false, true) {
			b.log.Warn("mesh: some of a router's events were lost on the way; its mirrors were forgotten (logged once)",
				"router", e.Router, "forgotten", n)
		}
	}
	p.seq = e.Seq
	// Its period as it says, at most MaxHeartbeat (whatever either's
	// remote_ttl): a made-up one must not overflow the quiet check, nor
	// keep its mirrors for as long as the router is remembered.
	p.at, p.heartbeat = now, time.Duration(min(e.Heartbeat, MaxHeartbeat.Milliseconds()))*time.Millisecond
	if p.heartbeat <= 0 {
		p.heartbeat = b.cfg.Heartbeat
	}
	return p
}

// evictQuietest makes room for a new router by forgetting the quiet one
// heard from longest ago (a pod rolled out, say); a router still heard
// from is never pushed out by a newer one. Call it with b.mu.
func (b *Bus) evictQuietest(now time.Time) bool {
	var oldest string
	for name, p := range b.peers {
		if p.quiet(now) && (oldest == "" || p.at.Before(b.peers[oldest].at)) {
			oldest = name
		}
	}
	if oldest == "" {
		return false
	}
	b.forgetMirrors(b.peers[oldest])
	delete(b.peers, oldest)
	return true
}

// enter mirrors p's dispatch e, and reports whether it did. While stale a
// dispatch may be one whose end was lost: it is not mirrored. Call it with
// b.mu.
func (b *Bus) enter(p *peer, e *event, now time.Time) bool {
	if b.stale || p.mirrors[e.ID] != nil || e.Prompt < 0 || e.Prompt > maxMirrorPrompt {
		return false
	}
	if len(p.mirrors) >= maxMirrorsPerPeer {
		if b.busy.CompareAndSwap(false, true) {
			b.log.Warn("mesh: a router has too many requests in flight to mirror them all: its newest are not mirrored (logged once)",
				"router", e.Router, "max", maxMirrorsPerPeer)
		}
		return false
	}
	req := policy.Request{PromptTokens: e.Prompt, Blocks: e.Blocks, Unstreamed: e.Unstreamed, Choices: e.Choices}
	if len(e.Model) <= maxModelName {
		req.Model = e.Model
	}
	if prefix.ValidEnds(e.BlockEnds, len(e.Blocks)) {
		req.BlockEnds = e.BlockEnds
	}
	var from router.Origin
	if leg, ok := p.leg(); ok && e.RTT > 0 {
		from = router.Origin{Name: e.Router, Leg: leg, RTT: time.Duration(min(e.RTT, maxLegSample.Microseconds())) * time.Microsecond}
	}
	t, ok := b.rt.Enter(b.now(), e.Replica, &req, router.OutputKeys{e.Application, e.Conversation}, from)
	if !ok {
		return false // a replica this router does not know, or not active
	}
	if p.mirrors == nil {
		p.mirrors = map[uint64]*mirror{}
	}
	p.mirrors[e.ID] = &mirror{t: t, at: now, blocks: b.hold(e.Blocks)}
	return true
}

// hold returns the blocks a mirror keeps until its replica takes it: the
// prompt's first maxMirrorBlocks (what later requests share), none once
// the mirrors hold maxHeldBlocks in all (it is then not credited). Call
// it, and let, with b.mu.
func (b *Bus) hold(blocks []uint64) []uint64 {
	if len(blocks) > maxMirrorBlocks {
		blocks = slices.Clone(blocks[:maxMirrorBlocks]) // not the whole decoded array
	}
	if b.heldBlocks+len(blocks) > maxHeldBlocks {
		return nil
	}
	b.heldBlocks += len(blocks)
	return blocks
}

// let lets go of a mirror's blocks.
func (b *Bus) let(mr *mirror) {
	b.heldBlocks -= len(mr.blocks)
	mr.blocks = nil
}

// credit enters a mirrored request's prompt in its replica's share of the
// prefix index once its router reported that the replica took it (its
// accepted event, sent at the replica's 200; from a router that sends
// none, a first token or a complete answer), as a router does for its own
// requests at the replica's 200 (Router.Accepted): an attempt the replica
// refused leaves no blocks behind.
func (b *Bus) credit(mr *mirror) {
	if mr.blocks == nil {
		return
	}
	b.rt.Accepted(&mr.t, &policy.Request{Blocks: mr.blocks})
	b.let(mr)
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
		b.heartbeat()
		b.sweep(time.Now())
	}
}

// sweep drops the mirrors of routers gone quiet and of requests whose end
// never came, and forgets the routers not heard from for RemoteTTL.
func (b *Bus) sweep(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for name, p := range b.peers {
		switch {
		case now.Sub(p.at) > b.cfg.RemoteTTL:
			b.forgetMirrors(p)
			delete(b.peers, name)
		case p.quiet(now):
			b.forgetMirrors(p)
		default:
			for id, mr := range p.mirrors {
				if now.Sub(mr.at) > b.cfg.RemoteTTL {
					b.rt.Finish(&mr.t)
					b.let(mr)
					delete(p.mirrors, id)
					b.dropped.Add(1)
				}
			}
		}
	}
}

// forgetMirrors drops every mirror of one router's requests; call it with
// b.mu.
func (b *Bus) forgetMirrors(p *peer) int {
	n := len(p.mirrors)
	for _, mr := range p.mirrors {
		b.rt.Finish(&mr.t)
		b.let(mr)
	}
	p.mirrors = nil
	b.dropped.Add(int64(n))
	return n
}

// forgetAll drops every mirror.
func (b *Bus) forgetAll() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.forgetAllLocked()
}

func (b *Bus) forgetAllLocked() int {
	n := 0
	for _, p := range b.peers {
		n += b.forgetMirrors(p)
	}
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
