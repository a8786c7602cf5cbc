package router

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorgo-llm/gorgo/internal/estimate"
	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
)

// ReplicaConfig is what the router is told about a replica.
type ReplicaConfig struct {
	ID, Region string
	// KVCapacityTokens sizes the replica's share of the prefix index.
	KVCapacityTokens int
	// PrefillMSPerToken and QueueMSPerToken are the replica's rates (the
	// priors when rates are estimated online).
	PrefillMSPerToken, QueueMSPerToken float64
	// ITLBaseMS and ITLSlopeMS are the priors of the replica's inter-token
	// latency model (see estimate.ITL); zero base means DefaultITLBaseMS.
	ITLBaseMS, ITLSlopeMS float64
	// Models is what the replica serves, if known from the start (the
	// config says); nil until SetModels tells, and a replica whose models
	// are unknown is taken to serve any.
	Models *models.Set
	// MaxLoRAs is the replica's adapter slots, if the config says (else
	// its engine's report, else DefaultMaxLoRAs).
	MaxLoRAs int
}

// DefaultITLBaseMS is the prior ITL of a replica nothing is known of: a
// ~10 ms decode step, typical of the engines the paper measures.
const DefaultITLBaseMS = 10

// State is where a replica is in its membership of the fleet.
type State int32

const (
	// Active replicas take new requests (when up and probed).
	Active State = iota
	// Draining replicas take no new requests, but the follow-ups of the
	// conversations they store (policy.Request.Holder); their requests in
	// flight finish. Undrain makes them active again.
	Draining
	// Removing replicas are draining, and leave the fleet once their last
	// request in flight finishes.
	Removing
)

func (s State) String() string {
	switch s {
	case Active:
		return "active"
	case Draining:
		return "draining"
	case Removing:
		return "removing"
	}
	return "unknown"
}

// member is one replica of the fleet and everything the router observed of
// it. Its identity (id, slot) never changes; its state is read by decisions
// without a lock (atomics) and written by observations (atomics, and mu
// for the estimators behind them).
type member struct {
	id   string
	slot int // prefix index slot, held for the member's life

	region  atomic.Pointer[string]
	state   atomic.Int32 // State
	healthy atomic.Bool
	gone    atomic.Bool // left the fleet
	// asleep: a client put its engine to sleep (vLLM's /sleep, SGLang's
	// /release_memory_occupation): it serves nothing until woken. (Beside
	// state and healthy: in the padding before busyUntil.)
	asleep atomic.Bool
	// busyUntil is when (ns of router time) the replica stops being passed
	// over for having said it is busy (Router.Busy); 0: never said.
	busyUntil atomic.Int64
	// lacking is the endpoints it answered it has no such route for
	// (Router.Lacks); nil: none.
	lacking atomic.Pointer[lacking]

	// Ledger of this router's requests to the replica: their sequences in
	// flight (a request for n answers is n, as the engine counts them),
	// their prompt tokens, their uncached tokens before the first token,
	// and how many sequences are past their first token.
	inflight, unfin, backlog, decoding atomic.Int64
	// waitSent is the sum of the dispatch times (ns of router time) of
	// the sequences awaiting their first token: with their count
	// (inflight − decoding), how long they have waited on average.
	waitSent atomic.Int64
	// due are the prompts that leave the backlog when their forecast
	// first token is due (Ticket.releaseWhenDue): of requests whose first
	// token the router will not see, or will hear of late.
	due dueQueue
	// emptied counts the times its engine emptied its cache (ClearCache):
	// a request sent before one is not credited in the index when the
	// replica takes it after it (Accepted): its prompt was computed
	// before, and dropped, or the request was aborted with the cache.
	emptied atomic.Uint64
	// flows are the other routers' recent dispatches here, whose latest
	// this router has not heard of yet (unheard.go).
	flows flows
	// decisions are the router's (unheard.go).
	decisions *decisions

	// models is what the replica serves; nil: unknown, any model.
	models   atomic.Pointer[models.Set]
	adapters adapterTable

	rttNS  atomic.Int64 // the RTT estimate; 0 until probed
	probed atomic.Bool
	// added: the replica came after the router's initial fleet (Add), so
	// its first probe, with which it joins the decisions, is a change of
	// the fleet.
	added   bool
	kvCap   atomic.Int64
	prefill atomic.Uint64 // float64 bits: ms per uncached token
	queue   atomic.Uint64 // float64 bits: ms per backlog token
	gauges  atomic.Pointer[gaugeObs]
	itlBase atomic.Uint64 // float64 bits: ms
	itlSlp  atomic.Uint64 // float64 bits: ms per request in flight
	// bias is how much later than Predict's model first tokens came back
	// (ms, float64 bits), as of biasTS: queueing the model does not see
	// (a saturated decode batch, a full KV cache).
	bias   atomic.Uint64
	biasTS atomic.Int64
	// margins are how much later than forecast (ms, float64 bits) the
	// replica's first tokens come at the TailQuantile, by the forecast's
	// size (estimate.MarginBin): what a forecast needs added to be met
	// that often (NaN while its bin has too few samples; see marginAt).
	margins [estimate.MarginBins]atomic.Uint64

	mu  sync.Mutex // guards the estimators below
	rtt estimate.EWMA
	// rttRef is the round trip (ns) the fleet was last known at (0 until
	// rttSettle probes came back): a smoothed estimate far from it for
	// rttSettle probes in a row is a change of the fleet. rttProbes counts
	// the probes, rttFar the latest run of far estimates.
	rttRef            float64
	rttProbes, rttFar int
	rates             *estimate.Rates  // nil: the configured rates
	late              *estimate.Margin // first tokens' TTFT against their forecast, ms
	itl               *estimate.ITL
	// Evidence of how far the index over-believes this replica's cache,
	// since the last reset: estimated and missing (estimated − reported,
	// when positive) cached tokens over the reports that carried them.
	reports, estSum, missSum int
	// sleepGen counts the changes of asleep (written under mu): an answer
	// asked before a change is stale (Router.SetAsleepIf).
	sleepGen uint64
}

// gaugeObs is a scrape of the replica's engine gauges and when it was made.
type gaugeObs struct {
	g  policy.EngineGauges
	at time.Duration
}

func newMember(rc ReplicaConfig, slot int, alpha float64, online bool) *member {
	m := &member{id: rc.ID, slot: slot, rtt: estimate.EWMA{Alpha: alpha}}
	m.due.init()
	m.region.Store(&rc.Region)
	m.models.Store(rc.Models)
	m.adapters.configured = max(rc.MaxLoRAs, 0)
	m.healthy.Store(true)
	m.kvCap.Store(int64(rc.KVCapacityTokens))
	m.setRates(rc.PrefillMSPerToken, rc.QueueMSPerToken)
	if online {
		m.rates = estimate.NewRates(rc.PrefillMSPerToken, rc.QueueMSPerToken)
	}
	base := rc.ITLBaseMS
	if base <= 0 {
		base = DefaultITLBaseMS
	}
	m.itl = estimate.NewITL(base, max(rc.ITLSlopeMS, 0))
	m.setITL(m.itl.Base(), m.itl.Slope())
	m.late = estimate.NewMargin(TailQuantile, tailWindow)
	for k := range m.margins {
		m.margins[k].Store(math.Float64bits(math.NaN()))
	}
	return m
}

func (m *member) setITL(base, slope float64) {
	m.itlBase.Store(math.Float64bits(base))
	m.itlSlp.Store(math.Float64bits(slope))
}

func (m *member) itlNow() (base, slope float64) {
	return math.Float64frombits(m.itlBase.Load()), math.Float64frombits(m.itlSlp.Load())
}

// observeITL feeds a finished request's mean token gap to the ITL model.
func (m *member) observeITL(inFlight int, ms float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.itl.Observe(float64(inFlight), ms)
	m.setITL(m.itl.Base(), m.itl.Slope())
}

func (m *member) setRates(prefill, queue float64) {
	m.prefill.Store(math.Float64bits(prefill))
	m.queue.Store(math.Float64bits(queue))
}

func (m *member) ratesNow() (prefill, queue float64) {
	return math.Float64frombits(m.prefill.Load()), math.Float64frombits(m.queue.Load())
}

// available reports whether a decision may pick the replica: active, up,
// reached by a probe (until then its round trip is unknown), and not
// asleep.
func (m *member) available() bool {
	return State(m.state.Load()) == Active && m.up()
}

// up reports whether the replica answers: healthy, probed and awake.
func (m *member) up() bool {
	return m.healthy.Load() && m.probed.Load() && !m.asleep.Load()
}

// availableFor reports whether the replica may take req: it is available,
// or it drains and holds the conversation req continues (req.Holder).
func (m *member) availableFor(req *policy.Request) bool {
	return m.available() || req.Holder == m.id && m.holds()
}

// holds reports whether the replica may take a follow-up of a conversation
// it stores: it is available, or drains (and is up, probed and awake).
func (m *member) holds() bool {
	st := State(m.state.Load())
	return (st == Active || st == Draining) && m.up()
}

// serves reports whether the replica serves model ("": any model; a
// replica whose models are unknown serves any), and the adapter's name if
// the model is a LoRA adapter there. It allocates nothing.
func (m *member) serves(model string) (adapter string, ok bool) {
	if model == "" {
		return "", true
	}
	set := m.models.Load()
	if set == nil {
		return "", true
	}
	mod, ok := set.Lookup(model)
	if !ok || !mod.IsAdapter() {
		return "", ok
	}
	return mod.ID, true
}

// adapterCost is what making an adapter ready at the replica costs, in
// ms: its load (loadMS, if not resident) and the wait for a slot (waitMS,
// if they are all held by requests in flight).
func (m *member) adapterCost(adapter string, loadMS, waitMS float64) (load, wait float64) {
	t := &m.adapters
	t.mu.Lock()
	resident, full := t.state(adapter)
	t.mu.Unlock()
	switch {
	case resident:
		return 0, 0
	case full:
		return loadMS, waitMS
	}
	return loadMS, 0
}

// view is the replica as a policy sees it now, for a prompt of which it is
// believed to hold cached tokens.
func (m *member) view(now time.Duration, cached int) policy.Replica {
	v := policy.Replica{
		ID:               m.id,
		Region:           *m.region.Load(),
		RTT:              time.Duration(m.rttNS.Load()),
		InFlight:         int(m.inflight.Load()),
		UnfinishedTokens: int(m.unfin.Load()),
		BacklogTokens:    m.backlogAhead(now),
		Decoding:         int(m.decoding.Load()),
		CachedTokens:     cached,
		KVCapacityTokens: int(m.kvCap.Load()),
	}
	v.PrefillMSPerToken, v.QueueMSPerToken = m.ratesNow()
	v.ITLBaseMS, v.ITLSlopeMS = m.itlNow()
	if g := m.gauges.Load(); g != nil {
		v.Engine, v.EngineAge, v.EngineKnown = g.g, now-g.at, true
	}
	return v
}

// observeRTT feeds a probe to the estimate. It reports whether the probe
// was the first (the replica joins the decisions with it), and the
// reference and the new estimate when the estimate has stayed away from
// the reference, by more than rttJump of it and more than rttJumpMin, for
// rttSettle probes in a row; the estimate is then the reference.
func (m *member) observeRTT(rtt time.Duration) (first, jumped bool, from, to time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rtt.Observe(float64(rtt))
	v, _ := m.rtt.Value()
	m.rttNS.Store(int64(v))
	// A replica that left before its first probe is not news at it (nor
	// at its leaving: Router.detach).
	first = !m.probed.Swap(true) && !m.gone.Load()
	ref := m.rttRef
	switch m.rttProbes++; {
	case m.rttProbes < rttSettle:
		return first, false, 0, 0
	case ref == 0:
		m.rttRef = v
		return first, false, 0, 0
	}
	if d := math.Abs(v - ref); d <= rttJump*ref || d <= float64(rttJumpMin) {
		m.rttFar = 0
		return first, false, 0, 0
	}
	if m.rttFar++; m.rttFar < rttSettle {
		return first, false, 0, 0
	}
	m.rttRef, m.rttFar = v, 0
	return first, true, time.Duration(ref), time.Duration(v)
}

// A smoothed round trip that stays more than half away from what it was,
// and more than 25 ms, for three probes in a row is a change of the fleet
// (a region rerouted, a replica moved): the jitter of a probe moves the
// smoothed estimate (α 0.3) by a fraction of that, and not three times
// running; queueing on the path to a near replica moves it by less than
// 25 ms.
const (
	rttJump    = 0.5
	rttJumpMin = 25 * time.Millisecond
	rttSettle  = 3
)

// observeTTFT feeds a first token to the online rates.
func (m *member) observeTTFT(uncached, backlog int, ms float64) {
	if m.rates == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rates.Observe(float64(uncached), float64(backlog), ms)
	m.setRates(m.rates.Prefill(), m.rates.Queue())
}

// Index self-correction: after at least resetReports reports, if the
// replica has been missing more than resetMissShare of the cached tokens
// the router believed it held, its cache was evidently flushed or the
// engine restarted, and the router clears what it believed.
const (
	resetReports   = 16
	resetMissShare = 0.5
)

// report weighs a cached-token report; it says whether the replica's share
// of the index should be cleared.
func (m *member) report(est, cached, blockTokens int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reports++
	m.estSum += est
	m.missSum += max(est-cached, 0)
	enough := m.reports >= resetReports && m.estSum >= resetReports*blockTokens
	if enough && float64(m.missSum) > resetMissShare*float64(m.estSum) {
		m.reports, m.estSum, m.missSum = 0, 0, 0
		return true
	}
	if m.reports >= 4*resetReports { // keep the evidence recent
		m.reports, m.estSum, m.missSum = m.reports/2, m.estSum/2, m.missSum/2
	}
	return false
}

// ReplicaState is a replica's state as the router sees it, for an admin
// API or a log.
type ReplicaState struct {
	ID, Region string
	State      State
	// Healthy is the replica's health (false: marked down); Probed says
	// whether a probe has reached it yet; Asleep that a client put its
	// engine to sleep (SetAsleep).
	Healthy, Probed, Asleep bool
	// BusyUntil is when (router time) the replica stops being passed over
	// for having answered that it is busy (Router.Busy); 0: never.
	BusyUntil time.Duration
	// Lacking is the endpoints it answered it has no such route for,
	// each with when (router time) it stops being passed over for it
	// (Router.Lacks); past entries may remain.
	Lacking           map[string]time.Duration
	RTT               time.Duration
	RTTSamples        int
	InFlight          int
	UnfinishedTokens  int
	BacklogTokens     int
	IndexBlocks       int
	KVCapacityTokens  int
	Engine            policy.EngineGauges
	EngineKnown       bool
	EngineAt          time.Duration
	PrefillMSPerToken float64
	QueueMSPerToken   float64
	// Decoding is the requests past their first token; ITLBaseMS and
	// ITLSlopeMS the replica's inter-token latency model (ms, ms per
	// request in flight) and ITLSamples the requests it learned from.
	Decoding              int
	ITLBaseMS, ITLSlopeMS float64
	ITLSamples            int
	// Models is what it serves (nil: unknown, taken to serve any model);
	// Adapters its adapter slots as the router sees them.
	Models   *models.Set
	Adapters AdapterState
}

// Available reports whether a decision may pick the replica.
func (s ReplicaState) Available() bool {
	return s.State == Active && s.Healthy && s.Probed && !s.Asleep
}

func (m *member) snapshot(indexBlocks int) ReplicaState {
	st := ReplicaState{ID: m.id, Region: *m.region.Load(), State: State(m.state.Load()), Healthy: m.healthy.Load(), Probed: m.probed.Load(),
		Asleep: m.asleep.Load(), BusyUntil: time.Duration(m.busyUntil.Load()), RTT: time.Duration(m.rttNS.Load()), InFlight: int(m.inflight.Load()), UnfinishedTokens: int(m.unfin.Load()),
		BacklogTokens: int(m.backlog.Load()), IndexBlocks: indexBlocks, KVCapacityTokens: int(m.kvCap.Load())}
	st.PrefillMSPerToken, st.QueueMSPerToken = m.ratesNow()
	st.Decoding = int(m.decoding.Load())
	st.ITLBaseMS, st.ITLSlopeMS = m.itlNow()
	st.Models = m.models.Load()
	st.Adapters = m.adapters.snapshot()
	if l := m.lacking.Load(); l != nil {
		st.Lacking = make(map[string]time.Duration, len(*l))
		for e, until := range *l {
			st.Lacking[e] = time.Duration(until)
		}
	}
	if g := m.gauges.Load(); g != nil {
		st.Engine, st.EngineKnown, st.EngineAt = g.g, true, g.at
	}
	m.mu.Lock()
	st.RTTSamples = m.rtt.Samples()
	st.ITLSamples = m.itl.Samples()
	m.mu.Unlock()
	return st
}

// biasHalfLife is how fast the correction of Predict's model fades: a
// replica that stops being late is believed within seconds, and one that
// gets no requests (so no first tokens) is not shunned for ever.
const biasHalfLife = 5 * time.Second

// TailQuantile is how often a forecast with its margin should be met: the
// share of first tokens that come no later than it (see member.forecast).
// Flow control, holding requests to a TTFT SLO, keeps its word to as many.
const TailQuantile = 0.95

// tailWindow is how many recent first tokens a replica's margin is drawn
// from.
const tailWindow = 128

// biasAlpha is the weight of a first token's lateness in the correction.
const biasAlpha = 0.2

// lateness is the correction at now, faded since it was last observed.
func (m *member) lateness(now time.Duration) float64 {
	b := math.Float64frombits(m.bias.Load())
	if b == 0 {
		return 0
	}
	age := max(now-time.Duration(m.biasTS.Load()), 0)
	return b * math.Exp2(-float64(age)/float64(biasHalfLife))
}

// forecast is Predict's model of a request's TTFT at the replica, in ms:
// floor on an idle replica (the round trip, the uncached prompt's prefill,
// making its adapter ready), mean with the prefill backlog ahead of it,
// the lateness of recent first tokens, and no less than the requests
// waiting there for their first token have waited on average; and the
// margin to add to mean for a forecast met at the TailQuantile.
func (m *member) forecast(now, rtt time.Duration, uncached int, adapterMS float64) (floor, mean, margin float64) {
	prefill, queue := m.ratesNow()
	floor = float64(rtt)/1e6 + float64(max(uncached, 0))*prefill + adapterMS
	wait := max(float64(m.backlogAhead(now))*queue+m.lateness(now), m.waited(now), 0)
	mean = floor + wait
	return floor, mean, m.marginAt(estimate.MarginBin(mean))
}

// backlogAhead is the prefill backlog a request sent now would find at
// the replica: the ledger's, and the other routers' dispatches this router
// has not heard of yet.
func (m *member) backlogAhead(now time.Duration) int {
	return int(m.backlog.Load()) + m.unheard(now)
}

// marginAt is the margin of forecasts in bin k: its own once it has
// enough samples, else that of the nearest smaller bin that has (errors
// grow with the forecast, so that errs low, but less than none), else 0.
func (m *member) marginAt(k int) float64 {
	for ; k >= 0; k-- {
		if v := math.Float64frombits(m.margins[k].Load()); !math.IsNaN(v) {
			return v
		}
	}
	return 0
}

// underWaitingCap and withinTPOT are shelter's tests of the replica for a
// request, shared with Predict: fewer than limit sequences waiting there
// for their first token; an ITL, with the request's seqs sequences
// (policy.Request.Sequences) among its decodes, within tpotMS.
func (m *member) underWaitingCap(limit int) bool {
	return m.inflight.Load()-m.decoding.Load() < int64(limit)
}

func (m *member) withinTPOT(tpotMS float64, seqs int) bool {
	base, slope := m.itlNow()
	return base+slope*float64(m.inflight.Load()+int64(seqs)) <= tpotMS
}

// waited is how long, on average, the requests at the replica that await
// their first token have waited so far at now (ms; 0 with none).
func (m *member) waited(now time.Duration) float64 {
	n := m.inflight.Load() - m.decoding.Load()
	if n <= 0 {
		return 0
	}
	// Σ(now − sent) in wrapping int64 arithmetic: exact even when the sum
	// of the dispatch times itself has wrapped (long uptimes, long queues).
	total := n*int64(now) - m.waitSent.Load()
	return max(float64(total)/float64(n), 0) / 1e6
}

// observeBias folds in a first token at `at` after ttftMS that came lateMS
// later than Predict's model said (negative: earlier), against the whole
// forecastMS (with the lateness and the wait) made at its dispatch.
func (m *member) observeBias(at time.Duration, lateMS, ttftMS, forecastMS float64) {
	if math.IsNaN(lateMS) || math.IsInf(lateMS, 0) || math.IsNaN(forecastMS) || math.IsInf(forecastMS, 0) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.lateness(at)
	b += biasAlpha * (lateMS - b)
	m.bias.Store(math.Float64bits(b))
	m.biasTS.Store(int64(at))
	m.late.Observe(forecastMS, ttftMS)
	k := estimate.MarginBin(forecastMS)
	if v, ok := m.late.Of(k); ok {
		m.margins[k].Store(math.Float64bits(v))
	}
}
