// Package router turns requests into routing decisions. It keeps the fleet
// (replicas keyed by id, which join, drain and leave while it routes) and
// what a router knows about each replica (round-trip estimate, its own
// ledger of requests in flight, the last scraped engine gauges, the prefix
// index, per-replica TTFT rates), builds the immutable views of the
// available replicas a policy.Policy scores, resolves the policy's ties, and
// folds the outcome of each request back in.
//
// The simulator and the live proxy both drive a Router; it takes time as an
// argument and draws randomness only from the *rand.Rand it is given.
//
// Concurrency: a Router is safe for concurrent use. Decisions are made one
// at a time (the policy and the caller's random source are not shared
// between them); they read the fleet through an atomic snapshot and each
// replica's state through atomics, so membership changes and observations
// (probes, scrapes, first tokens, finishes) never wait for a decision, nor
// a decision for them, except that a decision reads the prefix index under
// a read lock that inserting a prompt takes briefly to write.
package router

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/gorgo-llm/gorgo/internal/estimate"
	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/prefix"
)

// Config configures a Router.
type Config struct {
	// Replicas is the initial fleet; it may be empty.
	Replicas []ReplicaConfig
	Policy   policy.Policy
	// FleetChanged, if set, hears of each change of the fleet after the
	// policy did (see fleetChanged): for the log.
	FleetChanged func(why string)
	// BlockTokens is the tokens per prefix-index block.
	BlockTokens int
	// RTTAlpha smooths round-trip probes; zero means estimate.DefaultAlpha.
	RTTAlpha float64
	// OnlineRates makes the router estimate each replica's prefill and
	// queue rates from the TTFTs it observes instead of keeping the
	// configured ones.
	OnlineRates bool
	// TieMargin is the relative margin within which replicas scored by a
	// ByScore decision tie and one is drawn at random; zero means
	// policy.DefaultTieMargin, negative exact ties only.
	TieMargin float64
	// AdapterLoad is the load time of a LoRA adapter before one was
	// measured (zero: DefaultAdapterLoad); AdapterLoads gives some
	// adapters their own.
	AdapterLoad  time.Duration
	AdapterLoads map[string]time.Duration
	// GlobalOutput makes the router expect every answer to be as long as
	// the running mean of all answers, without the means of its
	// application and conversation (see ExpectedOutput): the yardstick the
	// keyed estimate is measured against.
	GlobalOutput bool
	// MirrorsHeardAtOnce: the news of another router's requests (Enter)
	// comes as it happens, so their prompts leave the backlog when their
	// first token is heard of, as this router's own do, not when it is
	// due: the simulator's omniscient routers, the yardstick of routing as
	// by one router.
	MirrorsHeardAtOnce bool
}

// Ticket is the router's record of one request dispatched to a replica,
// handed back to Accepted, FirstToken, CachedReport and Finish.
type Ticket struct {
	// ID is the chosen replica's.
	ID string
	// PromptTokens is the request's prompt length.
	PromptTokens int
	// EstCachedTokens is the router's estimate of the prompt tokens the
	// replica had cached, and Backlog the prefill backlog ahead of it.
	EstCachedTokens int
	Backlog         int
	// ExpectedOutputTokens is the answer length the router expected when it
	// decided (policy.Request.ExpectedOutputTokens; 0 for another router's
	// request).
	ExpectedOutputTokens int
	// Terms is the replica's cost, for scoring policies.
	Terms policy.Terms
	// RTT is the round-trip estimate the decision used.
	RTT time.Duration
	// Tag is the policy's label for the decision (see policy.Learner).
	Tag int
	// Adapter is the LoRA adapter the request uses there ("" for a base
	// model); AdapterLoadMS and WeightsWaitMS what the decision believed
	// making it ready would cost (its load, the wait for a slot), in ms.
	Adapter                      string
	AdapterLoadMS, WeightsWaitMS float64
	// InFlight is how many of the router's sequences were at the replica
	// once this request's joined them (its own included): a request for n
	// answers is n sequences, decoded side by side.
	InFlight int
	// Sent is the router time of the dispatch and Predicted the TTFT
	// Predict's model gave it there (round trip, prefill, backlog), in ms.
	Sent      time.Duration
	Predicted float64
	// Forecast is the whole of Predict's forecast there (ms): the model,
	// the replica's lateness and its requests' wait; Margin what Predict
	// adds to it for a forecast met at TailQuantile.
	Forecast, Margin float64

	m                     *member
	seqs                  int64 // the request's sequences (policy.Request.Sequences)
	accepted, first, done bool
	// adapterFollowed: the replica's adapter table counts this request.
	adapterFollowed bool
	// due: its prompt leaves the backlog when its first token is due
	// (releaseWhenDue): its answer is not streamed, or it is another
	// router's.
	due *duePrompt
	// remote: another router's request, mirrored here (see Enter); the
	// router learns nothing from its timings.
	remote bool
	// emptied is its replica's count of emptied caches when it was sent
	// (member.emptied).
	emptied uint64
	// outKeys are the keys its answer's length is learned under (see
	// OutputKeys).
	outKeys OutputKeys
}

// OutputKeys are the keys a request's answer length is learned under (see
// Router.OutputKeys): its application's, then its conversation's; zero
// where it has none.
type OutputKeys [2]uint64

// Candidate is a replica a decision ranked, with what the router believed
// of it then.
type Candidate struct {
	ID              string
	EstCachedTokens int
	Terms           policy.Terms
	RTT             time.Duration
	Tag             int
	// Adapter, AdapterLoadMS and WeightsWaitMS: as in Ticket.
	Adapter                      string
	AdapterLoadMS, WeightsWaitMS float64

	m  *member
	at time.Duration // when the decision was made
}

// Router is the routing core shared by the simulator and the proxy.
type Router struct {
	cfg   Config
	fleet atomic.Pointer[fleet]
	// fleetMu serialises membership changes.
	fleetMu sync.Mutex
	// ixMu guards the prefix index: decisions read it, inserting a prompt
	// and clearing a replica write it.
	ixMu  sync.RWMutex
	index *prefix.Index

	// deciding: a decision has been made. A replica that joins before
	// (a fleet coming up) is no change to a learner, which has measured
	// nothing yet.
	deciding atomic.Bool
	// newsMu orders the fleet's news (fleetChanged) of a replica's first
	// probe and its leaving.
	newsMu sync.Mutex
	// decMu serialises decisions and guards their scratch.
	decMu sync.Mutex
	// decisions are the times of this router's decisions once it mirrors
	// another's requests (meshed): what the others' dispatches it had not
	// heard of are learned per (unheard.go).
	decisions decisions
	meshed    atomic.Bool
	views     []policy.Replica
	cand      []*member
	adapter   []adapterCost
	depth     []int
	chain     []int        // one prompt's depths, for a batch (match)
	fc        []forecastAt // Predict's
	dec       policy.Decision
	ranked    []bool
	all       int        // rank's candidates, those keep passed over included (past len(views))
	keys      OutputKeys // of the request rank last ranked
	best      []Candidate

	loads   *adapterLoads
	catalog atomic.Pointer[catalog]

	resets atomic.Int64
	// lacked says a replica has answered that it has no route for a path
	// (Lacks): until then decisions do not look (a call per candidate).
	lacked atomic.Bool
	// outputs estimates answers' lengths.
	outputs *estimate.Outputs
	// stored is which replica stored each response (stored.go).
	stored storedResponses
}

// DefaultOutputTokens is the output length the router expects before it
// has seen any request finish.
const DefaultOutputTokens = 256

// New returns a router over the configured replicas, every one of them
// active and healthy but not yet probed.
func New(cfg Config) (*Router, error) {
	if cfg.Policy == nil {
		return nil, errors.New("router: no policy")
	}
	if cfg.RTTAlpha == 0 {
		cfg.RTTAlpha = estimate.DefaultAlpha
	}
	if !(cfg.RTTAlpha > 0 && cfg.RTTAlpha <= 1) {
		return nil, fmt.Errorf("router: RTT alpha must be in (0, 1], got %v", cfg.RTTAlpha)
	}
	switch {
	case math.IsNaN(cfg.TieMargin) || math.IsInf(cfg.TieMargin, 0):
		return nil, fmt.Errorf("router: tie margin must be a finite number, got %v", cfg.TieMargin)
	case cfg.TieMargin == 0:
		cfg.TieMargin = policy.DefaultTieMargin
	case cfg.TieMargin < 0:
		cfg.TieMargin = 0
	}
	ix, err := prefix.New(cfg.BlockTokens)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	r := &Router{cfg: cfg, index: ix, loads: newAdapterLoads(cfg.AdapterLoad, cfg.AdapterLoads)}
	r.outputs = estimate.NewOutputs(DefaultOutputTokens, 0)
	r.fleet.Store(&fleet{byID: map[string]*member{}})
	r.catalog.Store(&catalog{served: models.Union()})
	for _, rc := range cfg.Replicas {
		if err := r.add(rc, false); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Policy returns the router's policy.
func (r *Router) Policy() policy.Policy { return r.cfg.Policy }

// BlockTokens returns the tokens per prefix-index block.
func (r *Router) BlockTokens() int { return r.cfg.BlockTokens }

// Route picks a replica for req at time now and records the dispatch: the
// request joins the replica's ledger and its prompt blocks the replica's
// share of the prefix index. It is what a caller that always reaches the
// replica does (the simulator).
func (r *Router) Route(now time.Duration, req *policy.Request, rng *rand.Rand) (Ticket, error) {
	t, _, err := r.Dispatch(now, req, rng, nil)
	if err == nil {
		r.Accepted(&t, req)
	}
	return t, err
}

// maxBatchChains is how many prompts of a batch match writes depths for;
// the later ones count as held nowhere.
const maxBatchChains = 64

// match writes into r.depth how many of req's prompt blocks each slot's
// replica is believed to hold. For a batch of prompts it sums, over the
// first maxBatchChains, the full blocks of each prompt (all but its last,
// which may be partly filled: engines cache full blocks only) that the
// replica holds or that an earlier prompt of the batch shares, which the
// replica computes once, for the earlier one (vLLM caches a block once it
// is full; SGLang holds a prompt that shares with an earlier one back
// until the earlier is computed). Ends that are not a batch's are read as
// one prompt's. Call with decMu and ixMu (read).
func (r *Router) match(req *policy.Request) {
	k := r.index.Slots()
	if len(r.depth) < k {
		r.depth, r.chain = make([]int, k), make([]int, k)
	}
	if len(req.BlockEnds) == 0 || !prefix.ValidEnds(req.BlockEnds, len(req.Blocks)) {
		r.index.Match(req.Blocks, r.depth)
		return
	}
	clear(r.depth)
	ends := req.BlockEnds[:min(len(req.BlockEnds), maxBatchChains)]
	start := 0
	for i, end := range ends {
		chain := req.Blocks[start:end]
		full := max(len(chain)-1, 0)
		shared, prev := 0, 0
		for _, e := range ends[:i] {
			shared = max(shared, prefix.CommonPrefix(chain, req.Blocks[prev:e]))
			prev = e
		}
		r.index.Match(chain, r.chain)
		for slot, d := range r.chain[:k] {
			r.depth[slot] += min(max(d, shared), full)
		}
		start = end
	}
}

// Dispatch decides for req at time now and enters the request in the chosen
// replica's ledger, but not its prompt in the prefix index: call Accepted
// once the replica took the request, or Finish if it did not. The
// decision's fallbacks, best first, are appended to fallbacks[:0] (up to
// its capacity; pass nil for none) for Redispatch.
func (r *Router) Dispatch(now time.Duration, req *policy.Request, rng *rand.Rand, fallbacks []Candidate) (Ticket, []Candidate, error) {
	r.decMu.Lock()
	defer r.decMu.Unlock()
	if !r.deciding.Load() { // once: a store each decision would dirty the line for the probes
		r.deciding.Store(true)
	}
	if r.meshed.Load() {
		r.decisions.add(now)
	}
	var err error
	r.best, err = r.rank(now, req, r.cfg.Policy, rng, r.best[:0], cap(fallbacks)+1)
	if err != nil {
		return Ticket{}, fallbacks[:0], err
	}
	for k := range r.best {
		if t, ok := r.enter(&r.best[k], req, r.keys); ok {
			if r.meshed.Load() {
				r.best[k].m.pickedAt(now)
			}
			return t, append(fallbacks[:0], r.best[k+1:]...), nil
		}
	}
	return Ticket{}, fallbacks[:0], policy.ErrNoReplica
}

// Rank returns, without a ticket, the candidates the policy ranks for req
// (its choice, then the others by score), as many as dst has room for:
// the fallbacks of a request whose first attempt goes to a replica chosen
// otherwise (a stored response's holder), each taken with Redispatch.
func (r *Router) Rank(now time.Duration, req *policy.Request, rng *rand.Rand, dst []Candidate) ([]Candidate, error) {
	r.decMu.Lock()
	defer r.decMu.Unlock()
	if cap(dst) == 0 {
		return dst[:0], nil
	}
	var err error
	r.best, err = r.rank(now, req, r.cfg.Policy, rng, r.best[:0], cap(dst))
	if err != nil {
		return dst[:0], err
	}
	return append(dst[:0], r.best...), nil
}

// Enter mirrors another router's request in this router's state: it joins
// replica id's ledger as if this router had sent it there, with the cached
// prefix this router believes the replica holds, and (with Accepted) its
// prompt joins the replica's share of the prefix index; FirstToken and
// Finish then follow it as the other router reports them, but for its
// prompt, which leaves the replica's prefill backlog when its first token
// is due if the news of it has not come by then (it comes a leg between
// routers late). Routers that
// share their ledgers and prefix inserts (a mesh) do this with each
// other's requests. keys are the request's OutputKeys, as the other
// router computed them from what it alone was sent (the session, the
// prompt's text): the answer, once Decoded, feeds this router's estimate
// of answers' lengths too. It reports false for a replica this router
// does not have or that is not active. from is the other router: its
// recent dispatches to the replica, which this router hears of a leg
// late, are counted in the backlog a request of its own would find there
// (Origin).
func (r *Router) Enter(now time.Duration, id string, req *policy.Request, keys OutputKeys, from Origin) (Ticket, bool) {
	m, err := r.member(id)
	if err != nil {
		return Ticket{}, false
	}
	r.decMu.Lock() // guards the depth scratch
	r.ixMu.RLock()
	r.match(req)
	cached := 0
	if !m.gone.Load() {
		cached = r.depth[m.slot] * r.cfg.BlockTokens
	}
	r.ixMu.RUnlock()
	r.decMu.Unlock()
	c := Candidate{ID: id, EstCachedTokens: min(cached, req.PromptTokens), RTT: time.Duration(m.rttNS.Load()), m: m, at: now}
	c.Adapter, _ = m.serves(req.Model)
	if r.cfg.GlobalOutput {
		keys = OutputKeys{}
	}
	t, ok := r.enter(&c, req, keys)
	t.remote = true
	if ok && from.Name != "" {
		if !r.meshed.Load() { // once: a store each time would dirty the line for the decisions
			r.meshed.Store(true)
		}
		m.mirrored(now, from, t.uncached())
	}
	if ok && t.due == nil && !r.cfg.MirrorsHeardAtOnce {
		// The news of its first token comes late (from the replica to its
		// router, then on to this one): its prompt leaves the backlog when
		// its first token is due, or when that news comes, if sooner
		// (FirstToken).
		t.releaseWhenDue()
	}
	return t, ok
}

// Redispatch enters the request in a fallback's ledger at time now, if
// that replica is still available; it reports false otherwise.
func (r *Router) Redispatch(now time.Duration, c *Candidate, req *policy.Request) (Ticket, bool) {
	if !c.m.available() {
		return Ticket{}, false
	}
	if _, ok := c.m.serves(req.Model); !ok {
		return Ticket{}, false // lost the model since the decision
	}
	fb := *c
	fb.at = now
	return r.enter(&fb, req, r.OutputKeys(req))
}

// shelter drops from the candidates the replicas with waiting requests
// or more waiting for their first token (0: any number), then those whose
// ITL model predicts more than tpotMS with the request among their decodes
// (0: any); each filter is skipped when it would leave none (flow control
// let the request go on a forecast the fleet has changed since; no
// replica meets the TPOT), so that an impossible TPOT does not lift the
// waiting cap.
func (r *Router) shelter(now time.Duration, req *policy.Request) {
	if waiting := req.WaitingCap; waiting > 0 {
		r.keep(func(i int) bool { return r.cand[i].underWaitingCap(waiting) })
	}
	if tpot := req.TPOTSLOMS; tpot > 0 {
		r.keep(func(i int) bool { return r.cand[i].withinTPOT(tpot, req.Sequences()) })
	}
	if budget := req.TTFTBudgetMS; budget > 0 {
		r.keep(func(i int) bool {
			v := &r.views[i]
			_, mean, margin := r.cand[i].forecast(now, v.RTT, req.PromptTokens-v.CachedTokens, v.AdapterMS)
			return mean+margin <= budget
		})
	}
}

// keep keeps the candidates ok accepts, unless it accepts none. Those it
// passes over stay past the slices' ends (the last passed over first),
// where rank finds them: a request's last fallbacks.
func (r *Router) keep(ok func(i int) bool) {
	k := 0
	for i := range r.cand {
		if ok(i) {
			if k != i {
				r.views[k], r.views[i] = r.views[i], r.views[k]
				r.cand[k], r.cand[i] = r.cand[i], r.cand[k]
				r.adapter[k], r.adapter[i] = r.adapter[i], r.adapter[k]
			}
			k++
		}
	}
	if k > 0 {
		r.views, r.cand, r.adapter = r.views[:k], r.cand[:k], r.adapter[:k]
	}
}

// enter adds the request to the candidate's ledger unless the replica
// stopped being active meanwhile (drained or being removed).
func (r *Router) enter(c *Candidate, req *policy.Request, keys OutputKeys) (Ticket, bool) {
	m := c.m
	t := Ticket{ID: c.ID, PromptTokens: req.PromptTokens, EstCachedTokens: c.EstCachedTokens, ExpectedOutputTokens: req.ExpectedOutputTokens, Terms: c.Terms, RTT: c.RTT, Tag: c.Tag, m: m,
		Adapter: c.Adapter, AdapterLoadMS: c.AdapterLoadMS, WeightsWaitMS: c.WeightsWaitMS, outKeys: keys}
	_, t.Forecast, t.Margin = m.forecast(c.at, t.RTT, t.uncached(), t.AdapterLoadMS+t.WeightsWaitMS)
	t.seqs = int64(req.Sequences()) // bounded: a client's or a peer's count cannot overflow the ledger
	t.emptied = m.emptied.Load()
	t.InFlight = int(m.inflight.Add(t.seqs))
	if st := State(m.state.Load()); st == Removing || st == Draining && req.Holder != m.id {
		// Remove saw no request in flight, or is about to: back out (a
		// draining replica takes only a follow-up of a conversation it
		// holds). If that leaves a removing replica idle, it leaves
		// apart from this decision, which must not wait for its index
		// to be cleared.
		if m.inflight.Add(-t.seqs) == 0 && State(m.state.Load()) == Removing {
			go r.leave(m)
		}
		return Ticket{}, false
	}
	m.unfin.Add(int64(req.PromptTokens))
	t.Backlog = int(m.backlog.Add(int64(t.uncached()))) - t.uncached()
	if t.Adapter != "" {
		t.adapterFollowed = m.adapters.start(t.Adapter, c.at)
	}
	prefill, queue := m.ratesNow()
	t.Predicted = float64(t.RTT)/1e6 + float64(t.uncached())*prefill + float64(t.Backlog)*queue + t.AdapterLoadMS + t.WeightsWaitMS
	t.Sent = c.at
	m.waitSent.Add(int64(t.Sent) * t.seqs)
	if req.Unstreamed {
		t.releaseWhenDue() // no first token will be seen
	}
	return t, true
}

// finished drops a request's seqs sequences from a replica's count; a
// removing replica leaves once nothing is left in flight.
func (r *Router) finished(m *member, seqs int64) {
	if m.inflight.Add(-seqs) == 0 && State(m.state.Load()) == Removing {
		r.leave(m)
	}
}

// Accepted records that the ticket's replica took the request: it now
// holds, or is computing, the prompt's blocks.
func (r *Router) Accepted(t *Ticket, req *policy.Request) {
	if t.accepted || t.done {
		return
	}
	t.accepted = true
	r.ixMu.Lock()
	defer r.ixMu.Unlock()
	// Not if its engine emptied its cache since it was sent (a trainer's
	// pause aborts it and clears the cache; its answer comes after).
	if !t.m.gone.Load() && t.m.emptied.Load() == t.emptied {
		r.index.Insert(t.m.slot, req.Blocks)
	}
}

// Decide returns the replica Route would pick now, recording nothing in the
// router (its policy's own state, a round-robin counter, does advance). It
// is Route's decision path alone, for benchmarks.
func (r *Router) Decide(now time.Duration, req *policy.Request, rng *rand.Rand) (Candidate, error) {
	r.decMu.Lock()
	defer r.decMu.Unlock()
	var one [1]Candidate
	ranked, err := r.rank(now, req, r.cfg.Policy, rng, one[:0], 1)
	if err != nil {
		return Candidate{}, err
	}
	return ranked[0], nil
}

// Scored is one available replica's cost in an explained decision.
type Scored struct {
	ID    string
	Terms policy.Terms
}

// Explain returns the replica policy would pick now and every available
// replica's cost terms, recording nothing in the router. The policy runs as
// usual, so pass one whose state does not matter (a fresh instance of the
// router's, say) and a random source of its own.
func (r *Router) Explain(now time.Duration, req *policy.Request, policy policy.Policy, rng *rand.Rand) (Candidate, []Scored, error) {
	r.decMu.Lock()
	defer r.decMu.Unlock()
	var one [1]Candidate
	ranked, err := r.rank(now, req, policy, rng, one[:0], 1)
	if err != nil {
		return Candidate{}, nil, err
	}
	scores := make([]Scored, len(r.views))
	for i := range r.views {
		scores[i] = Scored{ID: r.views[i].ID}
		if len(r.dec.Scores) == len(r.views) {
			scores[i].Terms = r.dec.Scores[i]
		}
	}
	return ranked[0], scores, nil
}

// rank runs the policy over the available replicas and appends up to n
// candidates to dst: its choice, then the others by score. Call with decMu.
func (r *Router) rank(now time.Duration, req *policy.Request, pol policy.Policy, rng *rand.Rand, dst []Candidate, n int) ([]Candidate, error) {
	f := r.fleet.Load()
	r.ixMu.RLock()
	r.match(req)
	r.ixMu.RUnlock()
	bt := r.cfg.BlockTokens
	r.keys = r.OutputKeys(req)
	req.ExpectedOutputTokens, req.MeanOutputTokens = r.expect(req, r.keys)
	req.Now = now
	r.views, r.cand, r.adapter = r.views[:0], r.cand[:0], r.adapter[:0]
	for _, m := range f.members {
		if !m.availableFor(req) || req.Allowed != nil && !req.Allowed(m.id) {
			continue
		}
		m.releaseDue(now) // whatever the model: its ledger shows in metrics too
		adapter, ok := m.serves(req.Model)
		if !ok {
			continue
		}
		v := m.view(now, min(r.depth[m.slot]*bt, req.PromptTokens))
		var cost adapterCost
		if adapter != "" {
			cost = r.adapterCost(m, adapter, &v, req.ExpectedOutputTokens)
			v.AdapterMS = cost.load + cost.wait
		}
		r.views = append(r.views, v)
		r.cand = append(r.cand, m)
		r.adapter = append(r.adapter, cost)
	}
	if len(r.views) == 0 {
		return dst, policy.ErrNoReplica
	}
	r.all = len(r.views) // the candidates keep passes over are past len
	if req.WaitingCap > 0 || req.TPOTSLOMS > 0 || req.TTFTBudgetMS > 0 {
		r.shelter(now, req)
	}
	if req.Endpoint != "" && r.lacked.Load() {
		r.keep(func(i int) bool {
			return r.cand[i].busyUntil.Load() <= int64(now) && !r.cand[i].lacks(req.Endpoint, now)
		})
	} else {
		r.keep(func(i int) bool { return r.cand[i].busyUntil.Load() <= int64(now) })
	}
	r.dec.Tag, r.dec.ExactTies = 0, false
	if err := pol.Decide(&r.dec, req, r.views, rng); err != nil {
		return dst, err
	}
	if len(r.dec.Scores) != len(r.views) {
		return dst, fmt.Errorf("router: policy %s scored %d of %d replicas", pol.Name(), len(r.dec.Scores), len(r.views))
	}
	i := policy.Pick(&r.dec, r.cfg.TieMargin, rng)
	if i < 0 || i >= len(r.views) {
		return dst, fmt.Errorf("router: policy %s chose replica %d of %d", pol.Name(), i, len(r.views))
	}
	dst = append(dst, r.candidate(i, now))
	if n <= 1 {
		return dst, nil
	}
	// The fallbacks: the least scores after the choice, by partial
	// selection (n is small; the fleet may not be).
	r.ranked = append(r.ranked[:0], make([]bool, len(r.views))...)
	r.ranked[i] = true
	for len(dst) < n && len(dst) < len(r.views) {
		best := -1
		for j := range r.views {
			if !r.ranked[j] && (best < 0 || ranksBefore(r.dec.Scores[j].Total, r.dec.Scores[best].Total)) {
				best = j
			}
		}
		r.ranked[best] = true
		dst = append(dst, r.candidate(best, now))
	}
	// Then those passed over (busy for their Retry-After, without the
	// request's endpoint, or sheltered from), unscored: a request whose
	// other replicas all failed is tried there rather than lost.
	if r.all > len(r.views) && len(dst) < n {
		dst = r.passedOver(dst, n, now)
	}
	return dst, nil
}

// passedOver appends to dst, up to n candidates in all, those keep passed
// over, unscored.
func (r *Router) passedOver(dst []Candidate, n int, now time.Duration) []Candidate {
	kept, all := len(r.views), r.all
	r.views, r.cand, r.adapter = r.views[:all], r.cand[:all], r.adapter[:all]
	for j := kept; j < all && len(dst) < n; j++ {
		dst = append(dst, r.candidate(j, now))
	}
	return dst
}

func (r *Router) candidate(i int, now time.Duration) Candidate {
	v := &r.views[i]
	a := &r.adapter[i]
	c := Candidate{ID: v.ID, EstCachedTokens: v.CachedTokens, RTT: v.RTT, Tag: r.dec.Tag, m: r.cand[i], at: now,
		Adapter: a.name, AdapterLoadMS: a.load, WeightsWaitMS: a.wait}
	if len(r.dec.Scores) == len(r.views) { // else one passed over, unscored
		c.Terms = r.dec.Scores[i]
	}
	return c
}

func (t *Ticket) uncached() int { return t.PromptTokens - t.EstCachedTokens }

// FirstToken folds in a request's time to first token as the router saw
// it: the request leaves its replica's prefill backlog (another router's,
// Enter, unless it left when its first token was due).
func (r *Router) FirstToken(t *Ticket, ttft time.Duration) {
	if t.first || t.done {
		return
	}
	if u := t.due; u != nil {
		if t.remote && u.state.CompareAndSwap(pending, released) {
			t.first = true
			t.m.backlog.Add(-u.tokens)
			t.m.waitSent.Add(-int64(u.sent) * u.seqs)
			t.m.decoding.Add(u.seqs)
		}
		return
	}
	t.first = true
	t.m.backlog.Add(-int64(t.uncached()))
	t.m.waitSent.Add(-int64(t.Sent) * t.seqs)
	t.m.decoding.Add(t.seqs)
	if t.remote {
		return
	}
	t.m.observeBias(t.Sent+ttft, float64(ttft)/1e6-t.Predicted, float64(ttft)/1e6, t.Forecast)
	if t.AdapterLoadMS == 0 && t.WeightsWaitMS == 0 {
		// The prefill and queue rates learn from requests that paid no
		// adapter cost: what one costs is a guess, which would skew them.
		t.m.observeTTFT(t.uncached(), t.Backlog, float64(ttft-t.RTT)/1e6)
	}
	if t.AdapterLoadMS > 0 && t.WeightsWaitMS == 0 {
		// A load alone: what the first token took past the model without it.
		r.loads.observe(t.Adapter, float64(ttft)/1e6-(t.Predicted-t.AdapterLoadMS))
	}
}

// CachedReport folds in the cached prompt tokens the replica reported for a
// request (usage.prompt_tokens_details.cached_tokens), correcting the prefix
// index when the replica keeps holding much less than the router believes.
// It reports whether the replica's share of the index was reset.
func (r *Router) CachedReport(t *Ticket, cached int) bool {
	if !t.m.report(t.EstCachedTokens, cached, r.cfg.BlockTokens) {
		return false
	}
	r.resets.Add(1)
	r.clearIndex(t.m)
	return true
}

// Finish removes a request from its replica's ledger, whether it succeeded
// or failed. Calling it twice for a ticket is harmless.
func (r *Router) Finish(t *Ticket) {
	if t.done || t.m == nil {
		return
	}
	t.done = true
	m := t.m
	if t.adapterFollowed {
		m.adapters.end(t.Adapter)
	}
	m.unfin.Add(-int64(t.PromptTokens))
	first := t.first
	if u := t.due; u != nil && !u.state.CompareAndSwap(pending, finished) {
		first = true // released from the backlog when its first token was due
	}
	if !first {
		m.backlog.Add(-int64(t.uncached()))
		m.waitSent.Add(-int64(t.Sent) * t.seqs)
	} else {
		m.decoding.Add(-t.seqs)
	}
	r.finished(m, t.seqs)
}

// Decoded folds in how a request's answer went after its first token: it
// produced outputTokens tokens (as counted or reported) over decode, the
// time from its first token to its last. The token gap feeds the replica's
// ITL model, the length the router's output estimate. Call it before
// Finish, for requests that completed. Another router's requests (Enter)
// feed both: in a mesh each router then learns every replica's ITL from
// all the requests it hears of, not only from its own (a router near a
// replica sends far more there than the others do), and answers' lengths
// from every router's answers (behind a load balancer, a conversation's
// turns reach different routers).
func (r *Router) Decoded(t *Ticket, outputTokens int, decode time.Duration) {
	if t.done || t.m == nil || outputTokens < 1 {
		return
	}
	r.outputs.Observe(outputTokens, t.outKeys[0], t.outKeys[1])
	if outputTokens >= minITLTokens && decode > 0 {
		t.m.observeITL(t.InFlight, float64(decode)/1e6/float64(outputTokens-1))
	}
}

// minITLTokens is the shortest answer whose token gaps feed the ITL model:
// a mean over one or two gaps is mostly noise (one stall).
const minITLTokens = 4

// ExpectedOutput is the output length the router expects of req: the mean
// length of the answers it has seen, moved toward the mean of those to
// requests of the same application and then of those in the same
// conversation (OutputKeys), each as far as it has seen enough of them,
// and only as deep as those keys have lately told answers' lengths better
// (estimate.Outputs); at least req's min_tokens and at most its
// max_tokens. The router never knows the true length.
func (r *Router) ExpectedOutput(req *policy.Request) int {
	e, _ := r.expect(req, r.OutputKeys(req))
	return e
}

// expect returns ExpectedOutput, given req's keys k, and the mean length
// of all answers (for the requests in flight the router knows nothing of),
// in one reading.
func (r *Router) expect(req *policy.Request, k OutputKeys) (expected, mean int) {
	e, m := r.outputs.Estimate(k[0], k[1])
	expected = max(int(math.Round(e)), req.MinOutputTokens)
	if req.MaxOutputTokens > 0 {
		expected = min(expected, req.MaxOutputTokens)
	}
	return max(expected, 1), max(int(math.Round(m)), 1)
}

// OutputEstimate returns the state of the router's estimate of answers'
// lengths: the running mean of all answers, how many keys it uses now (0,
// the mean alone; 1, moved toward the request's application; 2, and
// toward its conversation), and how many it remembers.
func (r *Router) OutputEstimate() estimate.OutputState { return r.outputs.State() }

// OutputKeys are the keys of req's answer length, broadest first: its
// application, then its conversation; none with GlobalOutput. The
// application is the chat's opening instructions (InstructionsKey: its
// system or developer messages) where it has any, else its prompt's
// opening (PrefixKey: its first prompt.PrefixKeyTokens tokens, an
// application's where its system prompt fills them), mixed with its model
// (one system prompt may be answered at other lengths by another model).
// A chat's tools (ToolsKey) are part of its application. The
// conversation is SessionKey (a session header, or the user field);
// where there is none but the instructions are shorter than the opening,
// the opening stands for it: the instructions and the conversation's
// start, the same for each turn once the conversation fills it. A
// conversation is its tenant's (policy.Request.Tenant); an application may
// serve several. Each depth is mixed with a seed of its own, so that no two
// share a key.
func (r *Router) OutputKeys(req *policy.Request) OutputKeys {
	if r.cfg.GlobalOutput {
		return OutputKeys{}
	}
	return KeysOf(req)
}

// KeysOf are req's OutputKeys for a router that keys its estimate.
func KeysOf(req *policy.Request) OutputKeys {
	model := prefix.ModelKey(req.Model)
	app, opening := req.PrefixKey, uint64(0)
	if req.InstructionsKey != 0 && req.InstructionsKey != req.PrefixKey {
		app, opening = req.InstructionsKey, req.PrefixKey
	}
	var k OutputKeys
	if app != 0 || req.ToolsKey != 0 {
		k[0] = prefix.Fmix64(app ^ model ^ 0x9e3779b97f4a7c15 ^ prefix.Fmix64(req.ToolsKey))
	}
	var tenant uint64 // a conversation is its tenant's
	if req.Tenant != "" {
		tenant = prefix.Fmix64(xxhash.Sum64String(req.Tenant) ^ 0x165667b19e3779f9)
	}
	switch {
	case req.SessionKey != "":
		k[1] = prefix.Fmix64(xxhash.Sum64String(req.SessionKey) ^ tenant)
	case opening != 0:
		k[1] = prefix.Fmix64(opening ^ model ^ 0xc2b2ae3d27d4eb4f ^ tenant)
	}
	return k
}

// Replicas returns every replica's state, in the order they joined.
func (r *Router) Replicas() []ReplicaState {
	f := r.fleet.Load()
	out := make([]ReplicaState, len(f.members))
	for i, m := range f.members {
		r.ixMu.RLock()
		blocks := 0
		if !m.gone.Load() {
			blocks = r.index.Blocks(m.slot)
		}
		r.ixMu.RUnlock()
		out[i] = m.snapshot(blocks)
	}
	return out
}

// Replica returns one replica's state.
func (r *Router) Replica(id string) (ReplicaState, error) {
	m, err := r.member(id)
	if err != nil {
		return ReplicaState{}, err
	}
	r.ixMu.RLock()
	blocks := 0
	if !m.gone.Load() {
		blocks = r.index.Blocks(m.slot)
	}
	r.ixMu.RUnlock()
	return m.snapshot(blocks), nil
}

// IndexResets returns how many times CachedReport reset a replica's share
// of the index.
func (r *Router) IndexResets() int { return int(r.resets.Load()) }

// ObserveRTT adds a round-trip probe of a replica; its first makes the
// replica available, and is a change of the fleet for a replica added
// (Add: until then decisions did not see it) once decisions began: one
// that joins a fleet coming up, before any decision, changes nothing a
// learner measured.
func (r *Router) ObserveRTT(id string, rtt time.Duration) error {
	m, err := r.member(id)
	if err == nil {
		r.newsMu.Lock() // the news in the order it happened (see detach)
		defer r.newsMu.Unlock()
		switch first, jumped, from, to := m.observeRTT(rtt); {
		case first && m.added && r.deciding.Load():
			r.fleetChanged(policy.FleetChange{Why: "replica " + id + " added", Joined: id})
		case jumped:
			r.fleetChanged(policy.FleetChange{Why: fmt.Sprintf("round trip to %s went from %v to %v", id, from.Round(time.Millisecond), to.Round(time.Millisecond))})
		}
	}
	return err
}

// fleetChanged tells a policy that learns from the fleet (a
// policy.FleetWatcher: the online tuner) that the fleet changed.
func (r *Router) fleetChanged(c policy.FleetChange) {
	if w, ok := r.cfg.Policy.(policy.FleetWatcher); ok {
		w.FleetChanged(c)
	}
	if r.cfg.FleetChanged != nil {
		r.cfg.FleetChanged(c.Why)
	}
}

// ObserveEngine records a replica's engine gauges as scraped at time at.
func (r *Router) ObserveEngine(id string, g policy.EngineGauges, at time.Duration) error {
	m, err := r.member(id)
	if err == nil {
		m.gauges.Store(&gaugeObs{g: g, at: at})
	}
	return err
}

// maxIndexKVTokens bounds the KV capacity a replica's share of the prefix
// index is sized for, whatever the replica reports: about ten times the
// largest cache one engine holds today (a few million tokens), so that a
// scrape gone wrong (a gauge of 2^53 tokens) cannot make the share never
// evict and the index grow with every request sent there.
const maxIndexKVTokens = 1 << 25

// SetKVCapacity tells the router a replica's KV cache size (tokens, as its
// engine reports it): its share of the prefix index is resized to match,
// up to maxIndexKVTokens. The capacity itself is kept as reported, for
// the policy and the operator.
func (r *Router) SetKVCapacity(id string, tokens int) error {
	m, err := r.member(id)
	if err != nil || tokens <= 0 {
		return err
	}
	// The capacity and the index's share change together.
	r.ixMu.Lock()
	defer r.ixMu.Unlock()
	if int64(tokens) == m.kvCap.Load() || m.gone.Load() {
		return nil
	}
	m.kvCap.Store(int64(tokens))
	r.index.SetCapacity(m.slot, min(tokens, maxIndexKVTokens)/r.cfg.BlockTokens)
	return nil
}

// MaxBusy bounds how long a replica that said it is busy is passed over.
const MaxBusy = 30 * time.Second

// Busy records that a replica answered that it is busy (503 or 429) at
// now, and for how long it asked to be left alone (its Retry-After; 0 if
// it did not say: a second). Until then decisions pass it over while any
// other replica can take the request (it stays a candidate when none can,
// and a stored response's holder is still tried first): each request sent
// to it meanwhile would come back, a round trip lost. The wait is at most
// MaxBusy; a later answer's says more than an earlier's.
func (r *Router) Busy(id string, now, retryAfter time.Duration) error {
	m, err := r.member(id)
	if err == nil {
		if retryAfter <= 0 {
			retryAfter = time.Second
		}
		m.busyUntil.Store(int64(now + min(retryAfter, MaxBusy)))
	}
	return err
}

// SetHealthy marks a replica up or down.
func (r *Router) SetHealthy(id string, ok bool) error {
	m, err := r.member(id)
	if err == nil {
		m.healthy.Store(ok)
	}
	return err
}

// SetAsleep records that a client put the replica's engine to sleep (it
// serves nothing, and decisions pass it over) or woke it.
func (r *Router) SetAsleep(id string, asleep bool) error {
	m, err := r.member(id)
	if err == nil {
		m.mu.Lock()
		m.sleepGen++
		m.asleep.Store(asleep)
		m.mu.Unlock()
	}
	return err
}

// SleepMark returns whether the replica is marked asleep and the mark's
// generation, which every SetAsleep changes.
func (r *Router) SleepMark(id string) (asleep bool, gen uint64, err error) {
	m, err := r.member(id)
	if err != nil {
		return false, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.asleep.Load(), m.sleepGen, nil
}

// SetAsleepIf marks the replica asleep or awake, as SetAsleep does, only if
// its mark is still of generation gen (SleepMark) and says otherwise: an
// engine's answer to a question asked before a client's sleep or wake
// (a probe's) is stale, and must not undo it. It reports whether it
// changed the mark.
func (r *Router) SetAsleepIf(id string, asleep bool, gen uint64) (bool, error) {
	m, err := r.member(id)
	if err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sleepGen != gen || m.asleep.Load() == asleep {
		return false, nil
	}
	m.sleepGen++
	m.asleep.Store(asleep)
	return true, nil
}

// Rates returns a replica's prefill and queue rates (ms per token) as the
// router currently prices them.
func (r *Router) Rates(id string) (prefillMS, queueMS float64, err error) {
	m, err := r.member(id)
	if err != nil {
		return 0, 0, err
	}
	p, q := m.ratesNow()
	return p, q, nil
}

// Forecast is what Predict expects of a request.
type Forecast struct {
	// Best is its least predicted TTFT over the replicas that can serve
	// it, with the margin it needs to be met at TailQuantile (Margin, at
	// the replica where Best is); Floor the least without queue (what an
	// idle replica would give).
	Best, Floor, Margin time.Duration
	// Waiting is the fewest sequences a replica that can serve it has in
	// flight without a first token yet: in its engine's queue or prefill.
	Waiting int
}

// Predict forecasts req's TTFT now, as gorgo-ms prices it with unit
// weights: on each available replica its round trip, the prefill of its
// uncached tokens and the prefill backlog ahead of it, corrected by how
// much later than that model the replica's recent first tokens came (the
// queueing it does not see: a saturated batch, a full KV cache; the
// correction fades with a half-life of biasHalfLife), no less than its
// waiting requests have waited, plus the margin by which the replica's
// first tokens overran such forecasts, at TailQuantile, for forecasts of
// that size. Best is over the replicas the decision would keep for the
// request (its waiting cap and TPOT SLO, each applied only when some
// replica meets it, as shelter does), where it will go. It records
// nothing.
func (r *Router) Predict(now time.Duration, req *policy.Request) (Forecast, error) {
	r.decMu.Lock()
	defer r.decMu.Unlock()
	f := r.fleet.Load()
	r.ixMu.RLock()
	r.match(req)
	r.ixMu.RUnlock()
	floorMS := math.Inf(1)
	waiting := math.MaxInt
	r.fc = r.fc[:0]
	e := r.ExpectedOutput(req)
	for _, m := range f.members {
		if !m.availableFor(req) || req.Allowed != nil && !req.Allowed(m.id) {
			continue
		}
		m.releaseDue(now)
		adapter, ok := m.serves(req.Model)
		if !ok {
			continue
		}
		cached := min(r.depth[m.slot]*r.cfg.BlockTokens, req.PromptTokens)
		var adapterMS, slotWaitMS float64
		if adapter != "" {
			v := policy.Replica{InFlight: int(m.inflight.Load())}
			v.ITLBaseMS, v.ITLSlopeMS = m.itlNow()
			c := r.adapterCost(m, adapter, &v, e)
			adapterMS, slotWaitMS = c.load+c.wait, c.wait
		}
		floor, mean, margin := m.forecast(now, time.Duration(m.rttNS.Load()), req.PromptTokens-cached, adapterMS)
		// The wait for an adapter's slot is the others' load, not the
		// floor (what the replica would give idle): an adapter's load is.
		floorMS = min(floorMS, floor-slotWaitMS)
		waiting = min(waiting, int(m.inflight.Load()-m.decoding.Load()))
		r.fc = append(r.fc, forecastAt{ms: mean + margin, margin: margin,
			waitOK: req.WaitingCap <= 0 || m.underWaitingCap(req.WaitingCap),
			tpotOK: req.TPOTSLOMS <= 0 || m.withinTPOT(req.TPOTSLOMS, req.Sequences())})
	}
	if len(r.fc) == 0 {
		return Forecast{}, policy.ErrNoReplica
	}
	bestMS, marginMS := bestForecast(r.fc)
	return Forecast{Best: time.Duration(bestMS * 1e6), Floor: time.Duration(floorMS * 1e6), Margin: time.Duration(marginMS * 1e6), Waiting: waiting}, nil
}

// forecastAt is Predict's forecast at one replica, with shelter's tests.
type forecastAt struct {
	ms, margin     float64 // the forecast with its margin, and the margin
	waitOK, tpotOK bool
}

// bestForecast is the least forecast, and its margin, over the replicas
// shelter would keep: those within the waiting cap if any is, then of
// those, those within the TPOT SLO if any is.
func bestForecast(fc []forecastAt) (ms, margin float64) {
	useWait := slices.ContainsFunc(fc, func(f forecastAt) bool { return f.waitOK })
	useTPOT := slices.ContainsFunc(fc, func(f forecastAt) bool { return f.tpotOK && (f.waitOK || !useWait) })
	ms = math.Inf(1)
	for _, f := range fc {
		if (f.waitOK || !useWait) && (f.tpotOK || !useTPOT) && f.ms < ms {
			ms, margin = f.ms, f.margin
		}
	}
	return ms, margin
}

// ranksBefore orders fallbacks by score, a NaN score last.
func ranksBefore(a, b float64) bool { return a < b || math.IsNaN(b) && !math.IsNaN(a) }
