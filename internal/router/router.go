// Package router turns requests into routing decisions. It keeps what a
// router knows about each replica (round-trip estimates, its own ledger of
// requests in flight, the last scraped engine gauges, the prefix index,
// per-replica TTFT rates), builds the immutable replica views a
// route.Policy decides on, and folds the outcome of each request back in.
//
// The simulator and the live proxy both drive a Router; it takes time as an
// argument and draws randomness only from the *rand.Rand it is given. A
// Router is safe for concurrent use.
package router

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/gorgo-llm/gorgo/internal/prefix"
	"github.com/gorgo-llm/gorgo/internal/route"
	"github.com/gorgo-llm/gorgo/internal/signal"
)

// ReplicaConfig is what the router is told about a replica.
type ReplicaConfig struct {
	ID, Region string
	// KVCapacityTokens sizes the replica's share of the prefix index.
	KVCapacityTokens int
	// PrefillMSPerToken and QueueMSPerToken are the replica's rates (the
	// priors when rates are estimated online).
	PrefillMSPerToken, QueueMSPerToken float64
}

// Config configures a Router.
type Config struct {
	Replicas []ReplicaConfig
	Policy   route.Policy
	// BlockTokens is the tokens per prefix-index block.
	BlockTokens int
	// RTTAlpha smooths round-trip probes; zero means signal.DefaultAlpha.
	RTTAlpha float64
	// OnlineRates makes the router estimate each replica's prefill and
	// queue rates from the TTFTs it observes instead of keeping the
	// configured ones.
	OnlineRates bool
}

// Ticket is the router's record of one routed request, returned by Route
// and handed back to FirstToken and Finish.
type Ticket struct {
	// Replica is the index of the chosen replica.
	Replica int
	// PromptTokens is the request's prompt length.
	PromptTokens int
	// EstCachedTokens is the router's estimate of the prompt tokens the
	// replica had cached, and Backlog the prefill backlog ahead of it.
	EstCachedTokens int
	Backlog         int
	// Terms is the chosen replica's cost, for scoring policies.
	Terms route.Terms
	// RTT is the round-trip estimate the decision used.
	RTT time.Duration
	// Tag is the policy's label for the decision (see route.Learner).
	Tag int

	first, done bool
}

type replicaState struct {
	cfg      ReplicaConfig
	healthy  bool
	rtt      signal.EWMA
	inflight int
	unfin    int
	backlog  int
	gauges   route.EngineGauges
	gaugesAt time.Duration
	known    bool
	rates    *signal.Rates

	// Evidence of how far the index over-believes this replica's cache,
	// since the last reset: estimated and missing (estimated − reported,
	// when positive) cached tokens over the reports that carried them.
	reports, estSum, missSum int
}

// Index self-correction: after at least resetReports reports, if the
// replica has been missing more than resetMissShare of the cached tokens
// the router believed it held, its cache was evidently flushed or the
// engine restarted, and the router forgets what it believed.
const (
	resetReports   = 16
	resetMissShare = 0.5
)

// Router is the routing core shared by the simulator and the proxy.
type Router struct {
	mu     sync.Mutex
	cfg    Config
	reps   []replicaState
	index  *prefix.Index
	views  []route.Replica
	depth  []int
	dec    route.Decision
	online bool
	resets int
}

// New returns a router with every replica healthy and nothing observed.
func New(cfg Config) (*Router, error) {
	if cfg.Policy == nil {
		return nil, errors.New("router: no policy")
	}
	if len(cfg.Replicas) == 0 {
		return nil, errors.New("router: no replicas")
	}
	if cfg.RTTAlpha == 0 {
		cfg.RTTAlpha = signal.DefaultAlpha
	}
	if !(cfg.RTTAlpha > 0 && cfg.RTTAlpha <= 1) {
		return nil, fmt.Errorf("router: RTT alpha must be in (0, 1], got %v", cfg.RTTAlpha)
	}
	caps := make([]int, len(cfg.Replicas))
	r := &Router{cfg: cfg, reps: make([]replicaState, len(cfg.Replicas)), views: make([]route.Replica, len(cfg.Replicas)),
		depth: make([]int, len(cfg.Replicas)), online: cfg.OnlineRates}
	seen := map[string]bool{}
	for i, rc := range cfg.Replicas {
		if seen[rc.ID] {
			return nil, fmt.Errorf("router: replica id %q used twice", rc.ID)
		}
		seen[rc.ID] = true
		caps[i] = rc.KVCapacityTokens
		r.reps[i] = replicaState{cfg: rc, healthy: true, rtt: signal.EWMA{Alpha: cfg.RTTAlpha}}
		if cfg.OnlineRates {
			r.reps[i].rates = signal.NewRates(rc.PrefillMSPerToken, rc.QueueMSPerToken)
		}
	}
	ix, err := prefix.New(cfg.BlockTokens, caps)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	r.index = ix
	return r, nil
}

// Route picks a replica for req at time now and records the dispatch: the
// request joins the replica's ledger and its prompt blocks the replica's
// share of the prefix index.
func (r *Router) Route(now time.Duration, req *route.Request, rng *rand.Rand) (Ticket, error) {
	t, err := r.Dispatch(now, req, rng, nil)
	if err == nil {
		r.Accepted(&t, req)
	}
	return t, err
}

// Dispatch is the first half of Route, for a caller that may not get the
// request to the replica (a proxy): it decides, with the replicas marked
// in skip treated as unhealthy, and enters the request in the replica's
// ledger, but not its prompt in the prefix index. Call Accepted once the
// replica took the request, or Finish if it did not.
func (r *Router) Dispatch(now time.Duration, req *route.Request, rng *rand.Rand, skip []bool) (Ticket, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, err := r.decide(now, req, rng, skip)
	if err != nil {
		return t, err
	}
	s := &r.reps[t.Replica]
	s.inflight++
	s.unfin += req.PromptTokens
	s.backlog += t.uncached()
	return t, nil
}

// Accepted records that the ticket's replica took the request: it now
// holds, or is computing, the prompt's blocks.
func (r *Router) Accepted(t *Ticket, req *route.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.index.Insert(t.Replica, req.Blocks)
}

// Decide returns the replica Route would pick now, recording nothing in the
// router (its policy's own state, a round-robin counter, does advance). It
// is Route's decision path alone, for benchmarks.
func (r *Router) Decide(now time.Duration, req *route.Request, rng *rand.Rand) (Ticket, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.decide(now, req, rng, nil)
}

// Explain returns the replica policy would pick now and every replica's
// cost terms, recording nothing in the router. The policy runs as usual, so
// pass one whose state does not matter (a fresh instance of the router's,
// say) and a random source of its own.
func (r *Router) Explain(now time.Duration, req *route.Request, policy route.Policy, rng *rand.Rand) (Ticket, route.Decision, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	saved := r.cfg.Policy
	r.cfg.Policy = policy
	t, err := r.decide(now, req, rng, nil)
	r.cfg.Policy = saved
	d := route.Decision{Replica: r.dec.Replica, Scores: append([]route.Terms(nil), r.dec.Scores...), Tag: r.dec.Tag}
	return t, d, err
}

func (r *Router) decide(now time.Duration, req *route.Request, rng *rand.Rand, skip []bool) (Ticket, error) {
	r.index.Match(req.Blocks, r.depth)
	bt := r.index.BlockTokens()
	for i := range r.reps {
		s := &r.reps[i]
		rtt, _ := s.rtt.Value()
		v := route.Replica{
			ID:                s.cfg.ID,
			Region:            s.cfg.Region,
			Healthy:           s.healthy && (i >= len(skip) || !skip[i]),
			RTT:               time.Duration(rtt),
			InFlight:          s.inflight,
			UnfinishedTokens:  s.unfin,
			BacklogTokens:     s.backlog,
			CachedTokens:      min(r.depth[i]*bt, req.PromptTokens),
			Engine:            s.gauges,
			EngineKnown:       s.known,
			KVCapacityTokens:  s.cfg.KVCapacityTokens,
			PrefillMSPerToken: s.cfg.PrefillMSPerToken,
			QueueMSPerToken:   s.cfg.QueueMSPerToken,
		}
		if s.known {
			v.EngineAge = now - s.gaugesAt
		}
		if s.rates != nil {
			v.PrefillMSPerToken, v.QueueMSPerToken = s.rates.Prefill(), s.rates.Queue()
		}
		r.views[i] = v
	}
	r.dec.Tag = 0
	if err := r.cfg.Policy.Decide(&r.dec, req, r.views, rng); err != nil {
		return Ticket{}, err
	}
	i := r.dec.Replica
	if i < 0 || i >= len(r.views) || !r.views[i].Healthy {
		return Ticket{}, fmt.Errorf("router: policy %s chose replica %d, which is not a healthy replica", r.cfg.Policy.Name(), i)
	}
	v := &r.views[i]
	t := Ticket{Replica: i, PromptTokens: req.PromptTokens, EstCachedTokens: v.CachedTokens, Backlog: v.BacklogTokens, RTT: v.RTT, Tag: r.dec.Tag}
	if len(r.dec.Scores) == len(r.views) {
		t.Terms = r.dec.Scores[i]
	}
	return t, nil
}

func (t *Ticket) uncached() int { return t.PromptTokens - t.EstCachedTokens }

// FirstToken folds in a request's time to first token as the router saw
// it: the request leaves its replica's prefill backlog.
func (r *Router) FirstToken(t *Ticket, ttft time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.first || t.done {
		return
	}
	t.first = true
	s := &r.reps[t.Replica]
	s.backlog -= t.uncached()
	if s.rates != nil {
		s.rates.Observe(float64(t.uncached()), float64(t.Backlog), float64(ttft-t.RTT)/1e6)
	}
}

// CachedReport folds in the cached prompt tokens the replica reported for a
// request (usage.prompt_tokens_details.cached_tokens), correcting the prefix
// index when the replica keeps holding much less than the router believes.
// It reports whether the replica's share of the index was reset.
func (r *Router) CachedReport(t *Ticket, cached int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.reps[t.Replica]
	s.reports++
	s.estSum += t.EstCachedTokens
	s.missSum += max(t.EstCachedTokens-cached, 0)
	enough := s.reports >= resetReports && s.estSum >= resetReports*r.index.BlockTokens()
	if enough && float64(s.missSum) > resetMissShare*float64(s.estSum) {
		r.resets++
		r.index.Clear(t.Replica)
		s.reports, s.estSum, s.missSum = 0, 0, 0
		return true
	}
	if s.reports >= 4*resetReports { // keep the evidence recent
		s.reports, s.estSum, s.missSum = s.reports/2, s.estSum/2, s.missSum/2
	}
	return false
}

// ReplicaState is a replica's state as the router sees it, for an admin
// API or a log.
type ReplicaState struct {
	ID, Region        string
	Healthy           bool
	RTT               time.Duration
	RTTSamples        int
	InFlight          int
	UnfinishedTokens  int
	BacklogTokens     int
	IndexBlocks       int
	KVCapacityTokens  int
	Engine            route.EngineGauges
	EngineKnown       bool
	EngineAt          time.Duration
	PrefillMSPerToken float64
	QueueMSPerToken   float64
}

// Snapshot returns every replica's state.
func (r *Router) Snapshot() []ReplicaState {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ReplicaState, len(r.reps))
	for i := range r.reps {
		s := &r.reps[i]
		rtt, _ := s.rtt.Value()
		out[i] = ReplicaState{ID: s.cfg.ID, Region: s.cfg.Region, Healthy: s.healthy, RTT: time.Duration(rtt), RTTSamples: s.rtt.Samples(),
			InFlight: s.inflight, UnfinishedTokens: s.unfin, BacklogTokens: s.backlog, IndexBlocks: r.index.Blocks(i), KVCapacityTokens: s.cfg.KVCapacityTokens,
			Engine: s.gauges, EngineKnown: s.known, EngineAt: s.gaugesAt,
			PrefillMSPerToken: s.cfg.PrefillMSPerToken, QueueMSPerToken: s.cfg.QueueMSPerToken}
		if s.rates != nil {
			out[i].PrefillMSPerToken, out[i].QueueMSPerToken = s.rates.Prefill(), s.rates.Queue()
		}
	}
	return out
}

// IndexResets returns how many times CachedReport reset a replica's share
// of the index.
func (r *Router) IndexResets() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resets
}

// Finish removes a request from its replica's ledger, whether it succeeded
// or failed. Calling it twice for a ticket is harmless.
func (r *Router) Finish(t *Ticket) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.done {
		return
	}
	t.done = true
	s := &r.reps[t.Replica]
	s.inflight--
	s.unfin -= t.PromptTokens
	if !t.first {
		s.backlog -= t.uncached()
	}
}

// ObserveRTT adds a round-trip probe of replica i.
func (r *Router) ObserveRTT(i int, rtt time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reps[i].rtt.Observe(float64(rtt))
}

// ObserveEngine records replica i's engine gauges as scraped at time at.
func (r *Router) ObserveEngine(i int, g route.EngineGauges, at time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.reps[i]
	s.gauges, s.gaugesAt, s.known = g, at, true
}

// SetKVCapacity tells the router replica i's KV cache size (tokens, as its
// engine reports it): its share of the prefix index is resized to match.
func (r *Router) SetKVCapacity(i, tokens int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if tokens <= 0 || tokens == r.reps[i].cfg.KVCapacityTokens {
		return
	}
	r.reps[i].cfg.KVCapacityTokens = tokens
	r.index.SetCapacity(i, tokens/r.index.BlockTokens())
}

// SetHealthy marks replica i eligible or not.
func (r *Router) SetHealthy(i int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reps[i].healthy = ok
}

// Rates returns replica i's prefill and queue rates (ms per token) as the
// router currently prices them.
func (r *Router) Rates(i int) (prefillMS, queueMS float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.reps[i]
	if s.rates != nil {
		return s.rates.Prefill(), s.rates.Queue()
	}
	return s.cfg.PrefillMSPerToken, s.cfg.QueueMSPerToken
}
