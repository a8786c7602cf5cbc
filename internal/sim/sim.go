// Package sim is a discrete-event simulator of a router in front of engine
// replicas spread over regions, driven by a workload trace.
//
// Clients replay the trace open loop (arrival times from the trace) with a cap
// on requests in flight, as the paper's client does; the router picks a
// replica with a route.Policy; each request crosses half its round trip to
// the replica, is served by the replica's engine model, and its tokens cross
// the other half back. Time is virtual and every random draw comes from the
// seed, so a run is exactly repeatable.
package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/route"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// DefaultMaxInflight is the paper client's cap on requests in flight.
const DefaultMaxInflight = 64

// Config is one simulation run.
type Config struct {
	Replicas []Replica
	// Requests is the workload, sorted by Time (already windowed and scaled).
	Requests []trace.Request
	Policy   route.Policy
	// MaxInflight caps the client's requests in flight; beyond it the
	// client waits and records the wait as slip. Zero means no cap.
	MaxInflight int
	// Seed fixes network jitter and the policy's random draws.
	Seed uint64
	// Progress, if set, is called about every 1024 requests with the number
	// of requests finished since its previous call. It may be called from
	// several runs at once.
	Progress func(finished int)
}

// Result is what a run measured.
type Result struct {
	Policy  string
	Records []report.Record
	Run     report.Run
	// Events is the number of simulation events processed, Steps the
	// number of engine steps taken, both for speed measurements.
	Events, Steps int64
	// Engines are the replicas' final gauges, in Config.Replicas order.
	Engines []engine.Gauges
}

type eventKind uint8

const (
	evArrive   eventKind = iota // the client wants to send request req
	evAtEngine                  // request req reaches its replica
	evEngine                    // replica rep's engine has something to do
	evBack                      // request req's last token (or error) is back at the router
)

type event struct {
	t    time.Duration
	seq  uint64
	kind eventKind
	rep  int32
	req  int32
	gen  uint32
}

// reqState is what the simulator tracks per request.
type reqState struct {
	replica     int32
	rtt         time.Duration
	sent        time.Duration
	first, done time.Duration
	cached      int
	output      int
	failed      bool
	err         string
}

type replicaState struct {
	eng       *engine.Engine
	scheduled bool
	at        time.Duration
	gen       uint32
	inflight  int
	unfinTok  int
}

type simulator struct {
	cfg  Config
	rng  *rand.Rand
	jit  []float64 // per-request standard normal draw for the round trip
	reqs []reqState
	reps []replicaState

	events  eventHeap
	seq     uint64
	nextArr int
	backlog []int32
	bHead   int
	inflght int
	done    int
	nEvents int64

	views    []route.Replica
	decision route.Decision
	rreq     route.Request
	evBuf    []engine.Event
}

// Run simulates the workload under cfg.Policy.
func Run(cfg Config) (*Result, error) {
	if len(cfg.Replicas) == 0 {
		return nil, errors.New("sim: no replicas")
	}
	if cfg.Policy == nil {
		return nil, errors.New("sim: no policy")
	}
	if cfg.MaxInflight < 0 {
		return nil, errors.New("sim: max in flight must not be negative")
	}
	s := &simulator{
		cfg:   cfg,
		rng:   rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15)),
		reqs:  make([]reqState, len(cfg.Requests)),
		reps:  make([]replicaState, len(cfg.Replicas)),
		views: make([]route.Replica, len(cfg.Replicas)),
	}
	// Network jitter draws come from their own stream, indexed by request,
	// so every policy sees the same network.
	net := rand.New(rand.NewPCG(cfg.Seed, 0x2545f4914f6cdd1d))
	s.jit = make([]float64, len(cfg.Requests))
	for i := range s.jit {
		s.jit[i] = net.NormFloat64()
	}
	for i, r := range cfg.Replicas {
		eng, err := engine.New(engine.Config{Profile: r.Profile, PageTokens: trace.BlockTokens})
		if err != nil {
			return nil, fmt.Errorf("sim: replica %s: %w", r.ID, err)
		}
		s.reps[i].eng = eng
		s.views[i] = route.Replica{ID: r.ID, Region: r.Region, Healthy: true, RTT: r.RTT,
			KVCapacityTokens: eng.Gauges().KVCapacityTokens}
	}
	for i := 1; i < len(cfg.Requests); i++ {
		if cfg.Requests[i].Time < cfg.Requests[i-1].Time {
			return nil, fmt.Errorf("sim: requests not sorted by time at %d", i)
		}
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
				s.dispatch(ev.t, int(ev.req))
			}
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
		case evBack:
			s.back(ev.t, int(ev.req))
		}
	}
	return s.result(), nil
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

// dispatch sends request i from the router at now.
func (s *simulator) dispatch(now time.Duration, i int) {
	tr := &s.cfg.Requests[i]
	st := &s.reqs[i]
	st.sent = now
	s.inflght++
	for k := range s.views {
		s.views[k].InFlight = s.reps[k].inflight
		s.views[k].UnfinishedTokens = s.reps[k].unfinTok
	}
	s.rreq = route.Request{SessionKey: tr.Session, PromptTokens: tr.InputTokens, Blocks: tr.HashIDs, MaxOutputTokens: tr.OutputTokens}
	if err := s.cfg.Policy.Decide(&s.decision, &s.rreq, s.views, s.rng); err != nil {
		st.replica = -1
		st.failed, st.err = true, err.Error()
		s.push(event{t: now, kind: evBack, req: int32(i)})
		return
	}
	r := s.decision.Replica
	rep := &s.cfg.Replicas[r]
	st.replica = int32(r)
	st.rtt = sampleRTT(rep.RTT, rep.Jitter, s.jit[i])
	s.reps[r].inflight++
	s.reps[r].unfinTok += tr.InputTokens + tr.OutputTokens
	s.push(event{t: now + st.rtt/2, kind: evAtEngine, req: int32(i)})
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
	s.advance(now, r)
	tr := &s.cfg.Requests[i]
	err := s.reps[r].eng.Submit(now, engine.Request{ID: uint64(i), PromptTokens: tr.InputTokens, OutputTokens: tr.OutputTokens, Blocks: tr.HashIDs})
	if err != nil {
		st.failed, st.err = true, err.Error()
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
	if r := st.replica; r >= 0 {
		tr := &s.cfg.Requests[i]
		s.reps[r].inflight--
		s.reps[r].unfinTok -= tr.InputTokens + tr.OutputTokens
	}
	s.inflght--
	s.done++
	if s.cfg.Progress != nil && s.done%1024 == 0 {
		s.cfg.Progress(1024)
	}
	if s.bHead < len(s.backlog) {
		next := s.backlog[s.bHead]
		s.bHead++
		s.dispatch(now, int(next))
	}
}

func (s *simulator) result() *Result {
	res := &Result{Policy: s.cfg.Policy.Name(), Events: s.nEvents, Records: make([]report.Record, len(s.reqs))}
	ids := make([]string, len(s.cfg.Replicas))
	for k, r := range s.cfg.Replicas {
		ids[k] = r.ID
		g := s.reps[k].eng.Gauges()
		res.Engines = append(res.Engines, g)
		res.Steps += g.Steps
	}
	for i := range s.reqs {
		st, tr := &s.reqs[i], &s.cfg.Requests[i]
		rec := report.Record{
			Index:        i,
			Session:      tr.Session,
			Arrival:      toMS(tr.Time),
			Slip:         toMS(st.sent - tr.Time),
			PromptTokens: tr.InputTokens,
			Failed:       st.failed,
			Error:        st.err,
		}
		if st.replica >= 0 {
			rec.Replica = ids[st.replica]
			rec.RTT = toMS(st.rtt)
		}
		if !st.failed {
			rec.TTFT = toMS(st.first - st.sent)
			rec.E2E = toMS(st.done - st.sent)
			rec.CachedTokens = st.cached
			rec.OutputTokens = st.output
			if st.output > 1 {
				rec.ITL = toMS(st.done-st.first) / float64(st.output-1)
			}
		}
		res.Records[i] = rec
	}
	res.Run = report.NewRun(res.Policy, res.Records, ids)
	return res
}

func toMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
