// Package sim is a discrete-event simulator of a router in front of engine
// replicas spread over regions, driven by a workload trace.
//
// Clients replay the trace open loop (arrival times from the trace) with a cap
// on requests in flight, as the paper's client does; the router picks a
// replica with a policy.Policy; each request crosses half its round trip to
// the replica, is served by the replica's engine model, and its tokens cross
// the other half back. Time is virtual and every random draw comes from the
// seed, so a run is exactly repeatable.
package sim

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/prefix"
	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/synth"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// The random streams of a run, each seeded with Config.Seed and one of
// these, so that each draws apart from the others: a draw added to one
// leaves the others' as they were. Each must differ from the others
// (TestStreamsDiffer: the clients' legs once had the decisions' stream).
const (
	streamRoute   = policy.DrawStream  // the policies' draws (ties, random choices), as a live router's
	streamProbes  = 0x5851f42d4c957f2d // each probe's round trip
	streamNetwork = 0x2545f4914f6cdd1d // each request's round trip to its replica
	streamLegs    = 0xd1b54a32d192ed03 // each request's leg from its client to its router
)

// DefaultMaxInflight is the paper client's cap on requests in flight.
const DefaultMaxInflight = 64

// Config is one simulation run.
type Config struct {
	Replicas []Replica
	// Requests is the workload, sorted by Time (already windowed and scaled).
	Requests []trace.Request
	Policy   policy.Policy
	// MaxInflight caps the client's requests in flight; beyond it the
	// client waits and records the wait as slip. Zero means no cap.
	MaxInflight int
	// Seed fixes network jitter and the policy's random draws.
	Seed uint64
	// Signals says how the router observes the fleet.
	Signals Signals
	// Progress, if set, is called about every 1024 requests with the number
	// of requests finished since its previous call. It may be called from
	// several runs at once.
	Progress func(finished int)
	// TieMargin is the router's tie margin (see router.Config).
	TieMargin float64
	// Events change the fleet during the run.
	Events []FleetEvent
	// Admission holds or refuses requests predicted to miss a TTFT SLO
	// (zero SLO: every request goes at once). It must have passed
	// Validate.
	Admission admit.Config
	// Unstreamed is the share of requests whose answers are not streamed
	// (drawn by request, from the seed): the router sees no first token
	// for them, and learns nothing from their TTFT, as live. It is told
	// of them (policy.Request.Unstreamed) unless UnstreamedUntold, which
	// shows what a router that is not told does: it keeps their prefill
	// in the backlog until they end.
	Unstreamed       float64
	UnstreamedUntold bool
	// ScoreFrom, if positive, leaves out of the run's summary (Result.Run)
	// the requests that arrive earlier than this into the run: they are
	// routed and warm the fleet and an online tuner; Result.Records keeps
	// them.
	ScoreFrom time.Duration
	// GoodputSLO, if positive, scores the run's goodput against that TTFT
	// SLO (see report.Run.ScoreSLO), with or without admission; with
	// GoodputTPOT positive, a request must also keep its time per output
	// token within it. A request whose tenant holds it to a TTFT SLO of
	// its own (trace.Request.TTFTSLO) is held to that instead, in
	// admission (when Admission has an SLO: unlike the live router's, a
	// tenant's own SLO does not turn it on) and goodput (when GoodputSLO
	// is set) alike. A learning policy hears of them as each request's
	// SLOs (policy.Outcome): its own, else the admission SLO, else
	// GoodputSLO.
	GoodputSLO, GoodputTPOT time.Duration
	// HideMaxTokens keeps each request's output length from the router.
	// By default the router sees it as max_tokens, as it does live: the
	// replayer asks for exactly the trace's output (max_tokens with
	// ignore_eos), so the cap is tight; real clients' caps are looser.
	HideMaxTokens bool
	// Mesh, if set, runs a router in each of several regions (then Policy
	// is unused); nil runs one router with Policy, its clients beside it.
	Mesh *Mesh
}

// FleetOp is a change of the fleet.
type FleetOp string

// The changes a FleetEvent makes, as router.Router does them.
const (
	OpAdd     FleetOp = "add"
	OpDrain   FleetOp = "drain"
	OpUndrain FleetOp = "undrain"
	OpRemove  FleetOp = "remove"
)

// FleetEvent is a scripted change of the fleet at a time of the run: a
// replica added (it takes requests once the router's first probe of it
// returns), drained, undrained, or removed (drained, then forgotten once
// its requests finish).
type FleetEvent struct {
	At time.Duration
	Op FleetOp
	// ID names the replica to drain, undrain or remove.
	ID string
	// Replica is the replica to add.
	Replica Replica
}

// Signals configures what the simulated router measures, and how often,
// as the live proxy would.
type Signals struct {
	// ProbeInterval is the period of round-trip probes (default 30 s, the
	// paper's); each probe suffers the link's jitter.
	ProbeInterval time.Duration
	// ScrapeInterval is the period of engine /metrics scrapes (default
	// 30 s); gauges are stale in between.
	ScrapeInterval time.Duration
	// RTTAlpha smooths the probes (default 0.3).
	RTTAlpha float64
	// OnlineRates makes the router learn per-replica prefill and queue
	// rates from observed TTFT instead of taking them from the profiles.
	OnlineRates bool
	// BlindPrior starts every replica's online rates from the paper
	// engine's, as a router that knows nothing of its fleet's hardware.
	BlindPrior bool
	// GlobalOutput: the router expects every answer to be as long as the
	// mean of all (router.Config.GlobalOutput).
	GlobalOutput bool
}

// DefaultInterval is the paper's probe and scrape period.
const DefaultInterval = 30 * time.Second

// MinInterval is the shortest probe or scrape interval: each scrape is
// kept for the run, and a microsecond's would hang it and take gigabytes.
const MinInterval = 100 * time.Millisecond

// Result is what a run measured.
type Result struct {
	Policy  string
	Records []report.Record
	// Scored are the records Run summarises: those of the requests that
	// arrived at Config.ScoreFrom or later (all of Records without it).
	Scored []report.Record
	Run    report.Run
	// Events is the number of simulation events processed, Steps the
	// number of engine steps taken, both for speed measurements.
	Events, Steps int64
	// OracleSteps counts the engine steps clairvoyant's what-if runs took.
	OracleSteps int64
	// IndexResets counts the router's prefix-index resets (see
	// router.CachedReport); a healthy fleet has none.
	IndexResets int
	// Rates are the router's final prefill and queue rates (ms per token)
	// per replica: the profiles', or what it learned online; zero for a
	// replica removed during the run.
	Rates [][2]float64
	// Engines are the replicas' final gauges, in Config.Replicas order
	// followed by the replicas added during the run.
	Engines []engine.Gauges
}

type eventKind uint8

const (
	evArrive     eventKind = iota // the client wants to send request req
	evAtEngine                    // request req reaches its replica
	evEngine                      // replica rep's engine has something to do
	evFirstBack                   // request req's first token is back at the router
	evBack                        // request req's last token (or error) is back at the router
	evProbe                       // the router probes replica rep's round trip
	evProbeBack                   // that probe returns
	evScrape                      // the router scrapes replica rep's metrics
	evScrapeAt                    // the scrape reaches the replica
	evScrapeBack                  // the gauges reach the router
	evFleet                       // fleet event req happens
	evRelease                     // admission goes through its queue (a tick while it holds requests)
	evAtRouter                    // request req reaches its router (a mesh: after the client's leg)
	evRemote                      // site hears of request req's dispatch, first token or end (gen: which)
	evAtClient                    // request req's end reaches its client (a mesh: after the leg back)
)

// What an evRemote reports.
const (
	remoteDispatch = iota
	remoteFirst
	remoteFinish
)

// admissionTick is how often the router goes through its admission queue
// while it holds requests, besides at every first token and end (as the
// proxy does).
const admissionTick = 100 * time.Millisecond

type event struct {
	t    time.Duration
	seq  uint64
	kind eventKind
	site int16 // the router (probes, scrapes, evRemote)
	rep  int32
	req  int32
	gen  uint32
	rtt  time.Duration // evProbeBack: the probe's round trip
}

// scrape is gauges on their way from a replica to the router.
type scrape struct {
	gauges policy.EngineGauges
	// adapters: what the engine says of its adapters (replicas serving
	// adapters only).
	adapters *router.AdapterGauges
}

// reqState is what the simulator tracks per request.
type reqState struct {
	replica int32
	site    int16 // its router
	ticket  router.Ticket
	rtt     time.Duration
	// leg is the round trip between the client and its router (a mesh).
	leg time.Duration
	// arrived is when the request reached the router, sent when the
	// router dispatched it (later only if admission held it).
	arrived     time.Duration
	sent        time.Duration
	first, done time.Duration
	cached      int
	output      int
	failed      bool
	rejected    bool
	err         string
	// refused: the engine refused it as the client's error (a prompt over
	// the context, an invalid request: a 400 live), which says nothing
	// of the weights that routed it.
	refused bool
}

type replicaState struct {
	cfg       Replica
	eng       *engine.Engine
	lora      bool // serves adapters: its scrapes report them
	scheduled bool
	at        time.Duration
	gen       uint32
	transit   []int32 // requests on their way to the replica, in dispatch order
}

type simulator struct {
	cfg  Config
	rng  *rand.Rand
	jit  []float64 // per-request standard normal draw for the round trip
	reqs []reqState
	// prefixKeys are the requests' prefix keys, as the live router reads
	// them from the prompts the replayer sends (synth.Keys).
	prefixKeys []uint64
	// instrKeys are their instructions' keys (policy.Request's
	// InstructionsKey), nil when no request carries instructions.
	instrKeys []uint64
	reps      []replicaState // every replica that was ever in the fleet
	byID      map[string]int // the replicas' indexes in reps

	events  eventHeap
	seq     uint64
	nextArr int
	backlog []int32
	bHead   int
	inflght int
	done    int
	nEvents int64

	sites    []*site // the routers: one, or a mesh's
	probeRNG *rand.Rand
	sig      Signals
	rreq     policy.Request
	evBuf    []engine.Event
	oracle   *clairvoyant

	scrapes []scrape // gauges in flight to the router, by event

	// blocks are the requests' blocks keyed by their models (see
	// blocksOf): nil for a request naming no model, whose blocks are the
	// trace's as they are.
	blocks [][]uint64
	// adapterNames maps engine adapter keys back to names, for scrapes.
	adapterNames map[uint64]string
	adBuf        []uint64
	// adapters counts the scored requests that ran with an adapter, and
	// the adapter loads they caused.
	adapters [2]int64

	gate *admit.Gate[int32] // nil without admission
	now  time.Duration      // the event being handled, for release
	tick bool               // an evRelease is pending
}

// Run simulates the workload under cfg.Policy.
func Run(cfg Config) (*Result, error) {
	if len(cfg.Replicas) == 0 {
		return nil, errors.New("sim: no replicas")
	}
	if cfg.Policy == nil && cfg.Mesh == nil {
		return nil, errors.New("sim: no policy")
	}
	if cfg.Mesh != nil {
		if err := checkMesh(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.MaxInflight < 0 {
		return nil, errors.New("sim: max in flight must not be negative")
	}
	if n := len(cfg.Requests); n > 0 && cfg.ScoreFrom > cfg.Requests[n-1].Time {
		// Nothing would be scored: a summary of zeros reads as a perfect run.
		return nil, fmt.Errorf("sim: scoring from %v, after the last request's arrival at %v: nothing would be scored", cfg.ScoreFrom, cfg.Requests[n-1].Time)
	}
	for i := range cfg.Requests {
		if p := cfg.Requests[i].Priority; p != "" {
			if _, err := admit.ParsePriority(p); err != nil {
				return nil, fmt.Errorf("sim: request %d: %w", i, err)
			}
		}
	}
	sig := cfg.Signals
	if sig.ProbeInterval == 0 {
		sig.ProbeInterval = DefaultInterval
	}
	if sig.ScrapeInterval == 0 {
		sig.ScrapeInterval = DefaultInterval
	}
	if sig.ProbeInterval < MinInterval || sig.ScrapeInterval < MinInterval {
		return nil, fmt.Errorf("sim: probe and scrape intervals must be at least %v", MinInterval)
	}
	s := &simulator{
		cfg:        cfg,
		sig:        sig,
		rng:        rand.New(rand.NewPCG(cfg.Seed, streamRoute)),
		probeRNG:   rand.New(rand.NewPCG(cfg.Seed, streamProbes)),
		reqs:       make([]reqState, len(cfg.Requests)),
		prefixKeys: make([]uint64, len(cfg.Requests)),
		byID:       map[string]int{},
	}
	keys := synth.NewKeys(prompt.Estimator{})
	for i := range cfg.Requests {
		r := &cfg.Requests[i]
		s.prefixKeys[i] = keys.Of(r)
		if k := keys.Instructions(r); k != 0 {
			if s.instrKeys == nil {
				s.instrKeys = make([]uint64, len(cfg.Requests))
			}
			s.instrKeys[i] = k
		}
	}
	if c, ok := cfg.Policy.(*clairvoyant); ok {
		c.s = s
		s.oracle = c
	}
	if cfg.Admission.SLO > 0 {
		if err := cfg.Admission.Validate(); err != nil { // fills the defaults of a config that skipped it
			return nil, fmt.Errorf("sim: %w", err)
		}
		s.cfg.Admission = cfg.Admission
		s.gate = admit.New[int32](cfg.Admission)
	}
	// Network jitter draws come from their own stream, indexed by request,
	// so every policy sees the same network.
	net := rand.New(rand.NewPCG(cfg.Seed, streamNetwork))
	s.jit = make([]float64, len(cfg.Requests))
	for i := range s.jit {
		s.jit[i] = net.NormFloat64()
	}
	s.keyBlocks()
	if err := s.buildSites(); err != nil {
		return nil, err
	}
	// Each router probes every replica once before serving, then
	// periodically; it scrapes metrics from the start.
	for _, r := range cfg.Replicas {
		i, err := s.addReplica(r)
		if err != nil {
			return nil, err
		}
		for k, st := range s.sites {
			if st.routes(r.ID) {
				st.rt.ObserveRTT(r.ID, s.probeRTT(k, i))
				s.push(event{t: sig.ProbeInterval, kind: evProbe, site: int16(k), rep: int32(i)})
				s.push(event{t: 0, kind: evScrape, site: int16(k), rep: int32(i)})
			}
		}
	}
	for i := 1; i < len(cfg.Requests); i++ {
		if cfg.Requests[i].Time < cfg.Requests[i-1].Time {
			return nil, fmt.Errorf("sim: requests not sorted by time at %d", i)
		}
	}
	for k, ev := range cfg.Events {
		if err := s.checkEvent(ev); err != nil {
			return nil, fmt.Errorf("sim: fleet event %d: %w", k+1, err)
		}
		s.push(event{t: ev.At, kind: evFleet, req: int32(k)})
	}
	s.pushArrival()
	for len(s.events) > 0 {
		ev := s.events.pop()
		s.nEvents++
		switch ev.kind {
		case evArrive:
			s.pushArrival()
			if cfg.MaxInflight > 0 && s.inflght >= cfg.MaxInflight {
				s.backlog = append(s.backlog, ev.req)
			} else {
				s.send(ev.t, int(ev.req))
			}
		case evAtRouter:
			s.arrive(ev.t, int(ev.req))
		case evAtClient:
			s.atClient(ev.t)
		case evRemote:
			s.remote(ev.t, int(ev.site), int(ev.req), int(ev.gen))
		case evAtEngine:
			s.atEngine(ev.t, int(ev.req))
		case evEngine:
			rs := &s.reps[ev.rep]
			if ev.gen != rs.gen {
				continue // superseded
			}
			rs.scheduled = false
			s.advance(ev.t, int(ev.rep))
			s.reschedule(int(ev.rep))
		case evFirstBack:
			st := &s.reqs[ev.req]
			rt := s.sites[st.site].rt
			if !s.unstreamed(int(ev.req)) { // else it comes back with the answer
				rt.FirstToken(&st.ticket, ev.t-st.sent)
				rt.CachedReport(&st.ticket, st.cached)
				s.share(ev.t, int(ev.req), remoteFirst)
				s.release(ev.t)
			}
		case evBack:
			s.back(ev.t, int(ev.req))
			s.release(ev.t)
		case evFleet:
			if err := s.fleetEvent(ev.t, cfg.Events[ev.req]); err != nil {
				return nil, fmt.Errorf("sim: fleet event at %v: %w", ev.t, err)
			}
			s.release(ev.t)
		case evRelease:
			s.tick = false
			s.release(ev.t)
		case evProbe:
			st := s.sites[ev.site]
			if s.done < len(s.reqs) && st.rt.Has(s.reps[ev.rep].cfg.ID) {
				rtt := s.probeRTT(int(ev.site), int(ev.rep))
				s.push(event{t: ev.t + rtt, kind: evProbeBack, site: ev.site, rep: ev.rep, rtt: rtt})
				s.push(event{t: ev.t + sig.ProbeInterval, kind: evProbe, site: ev.site, rep: ev.rep})
			}
		case evProbeBack:
			s.sites[ev.site].rt.ObserveRTT(s.reps[ev.rep].cfg.ID, ev.rtt)
		case evScrape:
			st := s.sites[ev.site]
			if s.done < len(s.reqs) && st.rt.Has(s.reps[ev.rep].cfg.ID) {
				s.push(event{t: ev.t + st.rtt[ev.rep]/2, kind: evScrapeAt, site: ev.site, rep: ev.rep})
				s.push(event{t: ev.t + sig.ScrapeInterval, kind: evScrape, site: ev.site, rep: ev.rep})
			}
		case evScrapeAt:
			r := int(ev.rep)
			s.advance(ev.t, r)
			s.reschedule(r)
			g := s.reps[r].eng.Gauges()
			s.scrapes = append(s.scrapes, scrape{gauges: policy.EngineGauges{Running: g.Running, Waiting: g.Waiting, KVUsedTokens: g.KVUsedTokens, CacheHitRate: g.CacheHitRate},
				adapters: s.adapterGauges(r)})
			s.push(event{t: ev.t + s.sites[ev.site].rtt[r]/2, kind: evScrapeBack, site: ev.site, rep: ev.rep, req: int32(len(s.scrapes) - 1)})
		case evScrapeBack:
			id := s.reps[ev.rep].cfg.ID
			sc := &s.scrapes[ev.req]
			s.sites[ev.site].rt.ObserveEngine(id, sc.gauges, ev.t)
			if sc.adapters != nil {
				_ = s.sites[ev.site].rt.ObserveAdapters(id, *sc.adapters) // a replica removed meanwhile: nothing to tell
			}
		}
	}
	return s.result(), nil
}

// addReplica starts a replica's engine and adds it to the router's fleet.
func (s *simulator) addReplica(r Replica) (int, error) {
	eng, err := engine.New(engine.Config{Profile: r.Profile, PageTokens: trace.BlockTokens, MaxLoRAs: r.MaxLoRAs, LoRALoadTime: r.LoRALoadTime})
	if err != nil {
		return 0, fmt.Errorf("sim: replica %s: %w", r.ID, err)
	}
	prior := r.Profile
	if s.sig.BlindPrior {
		if prior, err = engine.LookupProfile("paper"); err != nil {
			return 0, err
		}
	}
	rc := router.ReplicaConfig{ID: r.ID, Region: r.Region, KVCapacityTokens: eng.Gauges().KVCapacityTokens,
		PrefillMSPerToken: prior.PrefillMSPerToken(), QueueMSPerToken: prior.QueueMSPerToken(),
		ITLBaseMS: prior.ITLMS(), ITLSlopeMS: prior.ITLSlopeMS(), Models: r.Models, MaxLoRAs: r.MaxLoRAs}
	for _, st := range s.sites {
		rtt, jitter := r.RTT, r.Jitter
		if m := s.cfg.Mesh; m != nil {
			if rtt, jitter, err = m.RTT(st.region, r.Region); err != nil {
				return 0, fmt.Errorf("sim: replica %s: %w", r.ID, err)
			}
		}
		st.rtt, st.jitter = append(st.rtt, rtt), append(st.jitter, jitter)
		if !st.routes(r.ID) {
			continue
		}
		if err := st.rt.Add(rc); err != nil {
			return 0, fmt.Errorf("sim: %w", err)
		}
	}
	s.reps = append(s.reps, replicaState{cfg: r, eng: eng, lora: len(r.Models.Adapters()) > 0})
	s.byID[r.ID] = len(s.reps) - 1
	return len(s.reps) - 1, nil
}

// checkEvent reports a fleet event that cannot be carried out.
func (s *simulator) checkEvent(ev FleetEvent) error {
	switch ev.Op {
	case OpAdd:
		if ev.Replica.ID == "" {
			return errors.New("add: the replica has no id")
		}
	case OpDrain, OpUndrain, OpRemove:
		if ev.ID == "" {
			return fmt.Errorf("%s: no replica id", ev.Op)
		}
	default:
		return fmt.Errorf("unknown operation %q (valid: add, drain, undrain, remove)", ev.Op)
	}
	if ev.At < 0 {
		return errors.New("negative time")
	}
	return nil
}

// fleetEvent changes the fleet at now.
func (s *simulator) fleetEvent(now time.Duration, ev FleetEvent) error {
	switch ev.Op {
	case OpAdd:
		if _, ok := s.byID[ev.Replica.ID]; ok {
			return fmt.Errorf("add: replica id %q was already used in this run", ev.Replica.ID)
		}
		i, err := s.addReplica(ev.Replica)
		if err != nil {
			return err
		}
		// Routed to once the first probe is back.
		s.push(event{t: now, kind: evProbe, rep: int32(i)})
		s.push(event{t: now, kind: evScrape, rep: int32(i)})
		return nil
	case OpDrain:
		return s.sites[0].rt.Drain(ev.ID)
	case OpUndrain:
		return s.sites[0].rt.Undrain(ev.ID)
	case OpRemove:
		return s.sites[0].rt.Remove(ev.ID)
	}
	return fmt.Errorf("unknown operation %q", ev.Op)
}

// probeRTT draws a probe's round trip from site k to replica i.
func (s *simulator) probeRTT(k, i int) time.Duration {
	st := s.sites[k]
	return sampleRTT(st.rtt[i], st.jitter[i], s.probeRNG.NormFloat64())
}

func (s *simulator) push(ev event) {
	s.seq++
	ev.seq = s.seq
	s.events.push(ev)
}

func (s *simulator) pushArrival() {
	if s.nextArr < len(s.cfg.Requests) {
		s.push(event{t: s.cfg.Requests[s.nextArr].Time, kind: evArrive, req: int32(s.nextArr)})
		s.nextArr++
	}
}

// arrive takes request i at the router at now: it goes at once, or
// admission holds or refuses it.
func (s *simulator) arrive(now time.Duration, i int) {
	s.now = now
	s.reqs[i].arrived = now
	if s.gate == nil {
		s.dispatch(now, i)
		return
	}
	p, ok := s.predict(int32(i))
	if !ok {
		s.dispatch(now, i) // no replica: dispatch fails it
		return
	}
	switch v, why := s.gate.Arrive(int32(i), s.class(i), now, p, s.refuse); v {
	case admit.Go:
		s.dispatch(now, i)
	case admit.Reject:
		s.refuse(int32(i), why)
	case admit.Hold:
		// Requests of its priority or above wait: it goes in their order.
		s.release(now)
	}
}

// schedule makes sure the queue is gone through again within a tick while
// it holds requests: nothing else may happen in the fleet meanwhile.
func (s *simulator) schedule(now time.Duration) {
	if !s.tick && s.gate.Len() > 0 {
		s.tick = true
		s.push(event{t: now + admissionTick, kind: evRelease})
	}
}

// predict is the router's TTFT forecast for request i now.
func (s *simulator) predict(i int32) (admit.Prediction, bool) {
	s.request(int(i))
	f, err := s.sites[0].rt.Predict(s.now, &s.rreq)
	return admit.Prediction{Best: f.Best, Floor: f.Floor, Waiting: f.Waiting}, err == nil
}

// class is what flow control knows of request i: its tenant and priority
// (standard when the trace gives none), and its prompt and expected output
// tokens, as the live router expects them (from max_tokens, unless
// hidden, and the answers so far).
func (s *simulator) class(i int) admit.Class {
	tr := &s.cfg.Requests[i]
	p := admit.Standard
	if tr.Priority != "" {
		p, _ = admit.ParsePriority(tr.Priority) // checked in Run
	}
	req := s.keyed(i)
	return admit.Class{Tenant: tr.Tenant, Priority: p, SLO: tr.TTFTSLO, Tokens: tr.InputTokens + s.sites[0].rt.ExpectedOutput(&req)}
}

// refuse fails request i as admission's 429.
func (s *simulator) refuse(i int32, why admit.Reason) {
	st := &s.reqs[i]
	st.replica, st.failed, st.rejected, st.err = -1, true, true, "rejected by flow control: "+string(why)
	s.push(event{t: s.now, kind: evBack, req: i})
}

// release lets admission dispatch what it held, now that the fleet
// changed.
func (s *simulator) release(now time.Duration) {
	if s.gate == nil || s.gate.Len() == 0 {
		return
	}
	s.now = now
	s.gate.Release(now, s.predict, func(i int32) { s.dispatch(now, int(i)) }, s.refuse)
	s.schedule(now)
}

// keyed is what the router reads of request i before its prompt's
// blocks: its conversation, tenant, keys, model and max_tokens (unless
// hidden).
func (s *simulator) keyed(i int) policy.Request {
	tr := &s.cfg.Requests[i]
	req := policy.Request{SessionKey: tr.Session, Tenant: tr.Tenant, PrefixKey: s.prefixKeys[i], MaxOutputTokens: tr.OutputTokens, Model: tr.Model}
	if s.instrKeys != nil {
		req.InstructionsKey = s.instrKeys[i]
	}
	if s.cfg.HideMaxTokens {
		req.MaxOutputTokens = 0
	}
	return req
}

// request fills s.rreq with request i's view.
func (s *simulator) request(i int) {
	s.rreq = s.keyed(i)
	s.rreq.PromptTokens, s.rreq.Blocks = s.cfg.Requests[i].InputTokens, s.blocksOf(i)
	if s.gate != nil {
		cl := s.class(i)
		s.rreq.WaitingCap = s.cfg.Admission.WaitingCap(cl)
		s.rreq.TTFTBudgetMS = s.cfg.Admission.TTFTBudget(cl, s.reqs[i].arrived, s.now)
	}
	s.rreq.Unstreamed = s.unstreamed(i) && !s.cfg.UnstreamedUntold
	s.rreq.HasSLO = s.slos(i).HasSLO()
}

// slos is an outcome with the SLOs request i is held to, as live: its
// tenant's TTFT SLO, else admission's (admit.Config.SLOOf), else the
// goodput's; the goodput's TPOT SLO.
func (s *simulator) slos(i int) policy.Outcome {
	return policy.Outcome{TPOTSLO: s.cfg.GoodputTPOT,
		TTFTSLO: cmp.Or(s.cfg.Admission.SLOOf(admit.Class{SLO: s.cfg.Requests[i].TTFTSLO}), s.cfg.GoodputSLO)}
}

// unstreamed reports whether request i's answer is not streamed
// (Config.Unstreamed): a draw by its index and the seed.
func (s *simulator) unstreamed(i int) bool {
	return trace.Unstreamed(i, s.cfg.Seed, s.cfg.Unstreamed)
}

// dispatch sends request i from the router at now.
func (s *simulator) dispatch(now time.Duration, i int) {
	st := &s.reqs[i]
	st.sent = now
	s.request(i)
	if s.oracle != nil {
		s.oracle.now, s.oracle.req = now, i
	}
	t, err := s.sites[st.site].rt.Route(now, &s.rreq, s.rng)
	if err != nil {
		st.replica = -1
		st.failed, st.err = true, err.Error()
		s.push(event{t: now, kind: evBack, req: int32(i)})
		return
	}
	r := s.byID[t.ID]
	st.ticket = t
	st.replica = int32(r)
	st.rtt = s.requestRTT(i, r)
	rs := &s.reps[r]
	rs.transit = append(rs.transit, int32(i))
	s.push(event{t: now + st.rtt/2, kind: evAtEngine, req: int32(i)})
	s.share(now, i, remoteDispatch)
}

// requestRTT is request i's round trip if sent to replica r.
func (s *simulator) requestRTT(i, r int) time.Duration {
	st := s.sites[s.reqs[i].site]
	return sampleRTT(st.rtt[r], st.jitter[r], s.jit[i])
}

// sampleRTT draws a round trip of mean and standard deviation sd from a
// standard normal z, floored at a fifth of the mean.
func sampleRTT(mean, sd time.Duration, z float64) time.Duration {
	rtt := float64(mean) + float64(sd)*z
	return time.Duration(math.Max(rtt, float64(mean)/5))
}

func (s *simulator) atEngine(now time.Duration, i int) {
	st := &s.reqs[i]
	r := int(st.replica)
	rs := &s.reps[r]
	for k, j := range rs.transit {
		if int(j) == i {
			rs.transit = append(rs.transit[:k], rs.transit[k+1:]...)
			break
		}
	}
	s.advance(now, r)
	err := s.reps[r].eng.Submit(now, s.engineRequest(i, r))
	if err != nil {
		st.failed, st.err = true, err.Error()
		st.refused = errors.Is(err, engine.ErrTooLarge) || errors.Is(err, engine.ErrInvalid)
		s.push(event{t: now + st.rtt/2, kind: evBack, req: int32(i)})
	}
	s.reschedule(r)
}

// advance runs replica r's engine to now and handles what it emitted.
func (s *simulator) advance(now time.Duration, r int) {
	s.evBuf = s.reps[r].eng.Advance(now, s.evBuf[:0])
	for _, ev := range s.evBuf {
		st := &s.reqs[ev.ID]
		back := ev.Time + st.rtt/2
		switch ev.Kind {
		case engine.EventFirstToken:
			st.first = back
			st.cached = ev.CachedTokens
			if ev.OnAdapter && s.cfg.Requests[ev.ID].Time >= s.cfg.ScoreFrom {
				s.adapters[0]++
				if ev.AdapterLoaded {
					s.adapters[1]++
				}
			}
			s.push(event{t: back, kind: evFirstBack, req: int32(ev.ID)})
		case engine.EventFinish:
			st.done = back
			st.output = ev.Generated
			s.push(event{t: back, kind: evBack, req: int32(ev.ID)})
		}
	}
}

func (s *simulator) reschedule(r int) {
	rs := &s.reps[r]
	t, ok := rs.eng.Next()
	if !ok || (rs.scheduled && rs.at == t) {
		return
	}
	rs.gen++
	rs.scheduled, rs.at = true, t
	s.push(event{t: t, kind: evEngine, rep: int32(r), gen: rs.gen})
}

// back handles request i's completion (or failure) at the router.
func (s *simulator) back(now time.Duration, i int) {
	st := &s.reqs[i]
	if st.replica >= 0 {
		site := s.sites[st.site]
		unstreamed := s.unstreamed(i)
		if !st.failed {
			decode := st.done - st.first
			if unstreamed {
				decode = 0 // no token gaps seen: only the length
				site.rt.CachedReport(&st.ticket, st.cached)
			}
			site.rt.Decoded(&st.ticket, st.output, decode)
		}
		site.rt.Finish(&st.ticket)
		s.share(now, i, remoteFinish)
		if site.learner != nil && !st.refused { // as live (lifecycle's learn)
			o := s.slos(i)
			o.Failed, o.Unstreamed = st.failed, unstreamed
			if !st.failed {
				o.Tokens = st.output
			}
			switch {
			case !st.failed && unstreamed: // its end alone is seen
				o.E2E, o.Queued = st.done-st.sent, st.sent-st.arrived
			case !st.failed:
				o.TTFT, o.E2E, o.Queued = st.first-st.sent, st.done-st.sent, st.sent-st.arrived
				if st.output > 1 {
					o.ITL = (st.done - st.first) / time.Duration(st.output-1)
				}
			}
			site.learner.Learn(st.ticket.Tag, o)
		}
	}
	s.done++
	if s.cfg.Progress != nil && s.done%1024 == 0 {
		s.cfg.Progress(1024)
	}
	if leg := st.leg; leg > 0 {
		s.push(event{t: now + leg/2, kind: evAtClient, req: int32(i)})
		return
	}
	s.atClient(now)
}

// atClient takes a request's end at its client: one fewer in flight, and
// the next request the client held back goes.
func (s *simulator) atClient(now time.Duration) {
	s.inflght--
	if s.bHead < len(s.backlog) {
		next := s.backlog[s.bHead]
		s.bHead++
		s.send(now, int(next))
	}
}

func (s *simulator) result() *Result {
	res := &Result{Policy: s.name(), Events: s.nEvents, Records: make([]report.Record, len(s.reqs))}
	if s.oracle != nil {
		res.OracleSteps = s.oracle.steps
	}
	for _, st := range s.sites {
		res.IndexResets += st.rt.IndexResets()
	}
	ids := make([]string, len(s.reps))
	for k, r := range s.reps {
		p, q, _ := s.sites[0].rt.Rates(r.cfg.ID) // 0, 0 for a replica removed (or not routed to)
		res.Rates = append(res.Rates, [2]float64{p, q})
		ids[k] = r.cfg.ID
		g := r.eng.Gauges()
		res.Engines = append(res.Engines, g)
		res.Steps += g.Steps
	}
	for i := range s.reqs {
		st, tr := &s.reqs[i], &s.cfg.Requests[i]
		rec := report.Record{
			Index:        i,
			Session:      tr.Session,
			Arrival:      toMS(tr.Time),
			Slip:         toMS(st.arrived - st.leg/2 - tr.Time),
			PromptTokens: tr.InputTokens,
			Failed:       st.failed,
			Rejected:     st.rejected,
			Error:        st.err,
			Model:        tr.Model,
			Tenant:       tr.Tenant,
			Priority:     tr.Priority,
			TTFTSLO:      toMS(tr.TTFTSLO),
			Whole:        s.unstreamed(i),
		}
		if st.replica >= 0 {
			rec.Replica = ids[st.replica]
			rec.RTT = toMS(st.rtt)
			rec.EstCachedTokens, rec.ExpectedOutputTokens = st.ticket.EstCachedTokens, st.ticket.ExpectedOutputTokens
			rec.Estimated = true
		}
		if !st.failed {
			rec.TTFT = toMS(st.first - st.arrived + st.leg)
			rec.E2E = toMS(st.done - st.arrived + st.leg)
			rec.CachedTokens = st.cached
			rec.OutputTokens = st.output
			if st.output > 1 {
				rec.ITL = toMS(st.done-st.first) / float64(st.output-1)
			}
		}
		res.Records[i] = rec
	}
	scored := res.Records
	if from := s.cfg.ScoreFrom; from > 0 {
		scored = nil
		for i := range res.Records {
			if rec := &res.Records[i]; rec.Arrival >= toMS(from) {
				scored = append(scored, *rec)
			} else {
				rec.WarmUp = true // what --records writes says so
			}
		}
	}
	res.Scored = scored
	res.Run = report.NewRun(res.Policy, scored, ids)
	res.Run.ScoreAdapters(s.adapters[0], s.adapters[1])
	if slo := s.cfg.GoodputSLO; slo > 0 && len(s.cfg.Requests) > 0 {
		reqs := s.cfg.Requests
		first := max(reqs[0].Time, s.cfg.ScoreFrom)
		span := max(reqs[len(reqs)-1].Time-first, time.Second)
		res.Run.ScoreSLO(scored, toMS(slo), toMS(s.cfg.GoodputTPOT), span.Seconds())
	}
	return res
}

func toMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// keyBlocks keys the blocks of every request naming a model by it, as
// engines key their caches and the router its index (prefix.Keyed): a
// prefix cached for one model is no hit for another. The trace's HashIDs
// are shared between runs and never modified: keyed blocks are copies. A
// request naming no model keeps the trace's blocks as they are.
func (s *simulator) keyBlocks() {
	reqs := s.cfg.Requests
	n := 0
	for i := range reqs {
		if reqs[i].Model != "" {
			n += len(reqs[i].HashIDs)
		}
	}
	if n == 0 {
		return
	}
	s.blocks = make([][]uint64, len(reqs))
	arena := make([]uint64, 0, n)
	keys := map[string]uint64{}
	for i := range reqs {
		tr := &reqs[i]
		if tr.Model == "" {
			continue
		}
		key, ok := keys[tr.Model]
		if !ok {
			key = prefix.ModelKey(tr.Model)
			keys[tr.Model] = key
		}
		start := len(arena)
		arena = append(arena, tr.HashIDs...)
		s.blocks[i] = prefix.Keyed(arena[start:len(arena):len(arena)], key)
	}
}

// blocksOf is request i's blocks: the trace's, keyed by its model.
func (s *simulator) blocksOf(i int) []uint64 {
	if s.blocks != nil && s.blocks[i] != nil {
		return s.blocks[i]
	}
	return s.cfg.Requests[i].HashIDs
}

// engineRequest is request i as replica r's engine runs it: with its
// model's blocks, and its adapter when the model is one of the adapters
// the replica serves.
func (s *simulator) engineRequest(i, r int) engine.Request {
	tr := &s.cfg.Requests[i]
	er := engine.Request{ID: uint64(i), PromptTokens: tr.InputTokens, OutputTokens: tr.OutputTokens, Blocks: s.blocksOf(i)}
	if tr.Model == "" || !s.reps[r].lora {
		return er
	}
	if m, ok := s.reps[r].cfg.Models.Lookup(tr.Model); ok && m.IsAdapter() {
		er.Adapter = prefix.ModelKey(m.ID)
		if s.adapterNames == nil {
			s.adapterNames = map[uint64]string{}
		}
		s.adapterNames[er.Adapter] = m.ID
	}
	return er
}

// adapterGauges is what replica r's /metrics say of its adapters now, as
// vLLM reports them (its slots, and the adapters its running requests
// use); nil for a replica serving none.
func (s *simulator) adapterGauges(r int) *router.AdapterGauges {
	rs := &s.reps[r]
	if !rs.lora {
		return nil
	}
	g := &router.AdapterGauges{MaxLoRAs: rs.eng.MaxLoRAs()}
	s.adBuf, _ = rs.eng.Adapters(s.adBuf[:0], nil)
	for _, k := range s.adBuf {
		g.Running = append(g.Running, s.adapterNames[k])
	}
	g.RunningCount = len(g.Running)
	return g
}
