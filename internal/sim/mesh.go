package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// Mesh runs a router in each of several regions instead of the paper's one:
// clients arrive in ingress regions, each served by one router (site), and
// TTFT and E2E run from the client, the client-to-router leg included.
type Mesh struct {
	// Label names the run (default: the first site's policy).
	Label string
	// Sites are the routers.
	Sites []Site
	// Ingress are the regions clients arrive in; each session stays in
	// one, drawn by the regions' shares at its first request, unless
	// SpreadSessions: then each request is drawn.
	Ingress        []Ingress
	SpreadSessions bool
	// IngressSeed, when set, seeds the draw of the ingress regions in
	// place of the run's Seed: runs at other seeds (other draws of the
	// network and the policies) then place every request alike, as a live
	// mesh placed by AssignIngress with that seed does.
	IngressSeed *uint64
	// RTT gives the mean round trip and its standard deviation between two
	// regions (in either order; a region to itself too).
	RTT func(a, b string) (mean, jitter time.Duration, err error)
	// Sharing is what the routers tell each other of their requests.
	Sharing Sharing
	// Day is the period of the ingress regions' daily curves and Amplitude
	// (in [0, 1]) their swing: a region's share at time t is its Share ×
	// (1 + Amplitude·sin(2π(t/Day − Phase))), so regions of different
	// phases peak at different times. Zero Day: constant shares.
	Day       time.Duration
	Amplitude float64
}

// Site is one router of a mesh.
type Site struct {
	Region string
	Policy policy.Policy
	// Replicas are the ids it routes to; nil means every replica.
	Replicas []string
}

// Ingress is a region clients arrive in.
type Ingress struct {
	Region string
	Share  float64
	// Phase shifts the region's daily curve, as a fraction of a day.
	Phase float64
	// Site is the index of the router its clients send to.
	Site int
}

// Sharing is what the routers of a mesh tell each other.
type Sharing int

const (
	// ShareNone: each router knows its own requests, and the engine gauges
	// it scrapes.
	ShareNone Sharing = iota
	// ShareDelayed: each router also learns of the others' requests (their
	// dispatches with the prompt's blocks, first tokens and ends), after
	// the one-way delay between their regions.
	ShareDelayed
	// ShareInstant: as ShareDelayed, with no delay: the omniscient
	// yardstick. Each router hears of a dispatch as it is made, so requests
	// reaching different routers at the same instant are routed one after
	// the other, each seeing the ones before, as by one router.
	ShareInstant
)

func (s Sharing) String() string {
	switch s {
	case ShareDelayed:
		return "shared"
	case ShareInstant:
		return "omniscient"
	}
	return "local"
}

// ParseSharing reads local, shared or omniscient.
func ParseSharing(s string) (Sharing, error) {
	for _, v := range []Sharing{ShareNone, ShareDelayed, ShareInstant} {
		if s == v.String() {
			return v, nil
		}
	}
	return 0, fmt.Errorf("unknown sharing %q (valid: local, shared, omniscient)", s)
}

// site is a router of the run, and what it knows of its network.
type site struct {
	rt      *router.Router
	region  string
	name    string // its router.Origin name: its index
	learner policy.Learner
	// rtt and jitter to each replica, by index in simulator.reps.
	rtt, jitter []time.Duration
	// allowed: the replica ids it routes to (nil: all).
	allowed map[string]bool
	// remote are the other routers' requests as this router mirrors them,
	// by request index (ShareDelayed, ShareInstant).
	remote []router.Ticket
}

func (st *site) routes(id string) bool { return st.allowed == nil || st.allowed[id] }

// checkMesh validates a mesh against the run's config.
func checkMesh(cfg *Config) error {
	m := cfg.Mesh
	switch {
	case len(m.Sites) == 0 || len(m.Ingress) == 0:
		return errors.New("sim: a mesh needs sites and ingress regions")
	case m.RTT == nil:
		return errors.New("sim: a mesh needs round trips between regions")
	case cfg.Admission.SLO > 0:
		return errors.New("sim: admission runs with one router only")
	case len(cfg.Events) > 0:
		return errors.New("sim: fleet events run with one router only")
	case m.Amplitude < 0 || m.Amplitude > 1 || m.Day < 0:
		return errors.New("sim: mesh amplitude must be in [0, 1] and day non-negative")
	}
	total := 0.0
	for _, in := range m.Ingress {
		if in.Site < 0 || in.Site >= len(m.Sites) || !(in.Share >= 0) || math.IsInf(in.Share, 0) {
			return fmt.Errorf("sim: ingress %s: bad site or share", in.Region)
		}
		total += in.Share
	}
	if total <= 0 {
		return errors.New("sim: the ingress shares are all zero")
	}
	for _, s := range m.Sites {
		if s.Policy == nil {
			return fmt.Errorf("sim: site %s has no policy", s.Region)
		}
		if _, ok := s.Policy.(*clairvoyant); ok {
			return errors.New("sim: clairvoyant runs with one router only")
		}
	}
	return nil
}

// AssignIngress draws each request's ingress region (an index in
// m.Ingress): a session's at its first request, by the regions' shares
// then (their daily curves), with a draw that depends only on the session
// and the seed (with m.SpreadSessions, each request's, on its index). A
// run of the mesh with that seed places requests so.
func AssignIngress(m *Mesh, reqs []trace.Request, seed uint64) []int16 {
	return assignIngress(m, reqs, seed)
}

func assignIngress(m *Mesh, reqs []trace.Request, seed uint64) []int16 {
	out := make([]int16, len(reqs))
	bySession := map[string]int16{}
	w := make([]float64, len(m.Ingress))
	for i := range reqs {
		r := &reqs[i]
		sticky := r.Session != "" && !m.SpreadSessions
		if k, ok := bySession[r.Session]; ok && sticky {
			out[i] = k
			continue
		}
		total := 0.0
		for c, in := range m.Ingress {
			w[c] = in.Share
			if m.Day > 0 {
				day := float64(r.Time) / float64(m.Day)
				w[c] *= max(0, 1+m.Amplitude*math.Sin(2*math.Pi*(day-in.Phase)))
			}
			total += w[c]
		}
		key := r.Session
		if !sticky {
			key = fmt.Sprint("#", i)
		}
		u := float64(xxhash.Sum64String(fmt.Sprint(seed, "/", key))>>11) / (1 << 53) * total
		k := int16(len(w) - 1)
		for c := range w {
			if u < w[c] {
				k = int16(c)
				break
			}
			u -= w[c]
		}
		out[i] = k
		if sticky {
			bySession[r.Session] = k
		}
	}
	return out
}

// buildSites makes the run's routers: one with Config.Policy, or a mesh's,
// and places each request with its ingress region's router.
func (s *simulator) buildSites() error {
	cfg := &s.cfg
	mk := func(region string, p policy.Policy, allowed []string) error {
		rt, err := router.New(router.Config{Policy: p, BlockTokens: trace.BlockTokens,
			RTTAlpha: s.sig.RTTAlpha, OnlineRates: s.sig.OnlineRates, TieMargin: cfg.TieMargin, GlobalOutput: s.sig.GlobalOutput,
			MirrorsHeardAtOnce: cfg.Mesh != nil && cfg.Mesh.Sharing == ShareInstant})
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		st := &site{rt: rt, region: region, name: strconv.Itoa(len(s.sites))}
		st.learner, _ = p.(policy.Learner)
		if allowed != nil {
			st.allowed = map[string]bool{}
			for _, id := range allowed {
				st.allowed[id] = true
			}
		}
		s.sites = append(s.sites, st)
		return nil
	}
	m := cfg.Mesh
	if m == nil {
		return mk("", cfg.Policy, nil)
	}
	for _, st := range m.Sites {
		if err := mk(st.Region, st.Policy, st.Replicas); err != nil {
			return err
		}
	}
	for _, a := range m.Sites {
		for _, b := range m.Sites {
			if _, _, err := m.RTT(a.Region, b.Region); err != nil {
				return fmt.Errorf("sim: between routers: %w", err)
			}
		}
	}
	if m.Sharing != ShareNone {
		for _, st := range s.sites {
			st.remote = make([]router.Ticket, len(s.reqs))
		}
	}
	seed := cfg.Seed
	if m.IngressSeed != nil {
		seed = *m.IngressSeed
	}
	ingress := assignIngress(m, cfg.Requests, seed)
	// A client's leg is a path between regions as a router's to a
	// replica is, and jitters as much: each request's is a draw, from a
	// stream of its own (streamLegs), so that the other draws stay as
	// they were. (Its mean alone, as it was, left the clients far from
	// their router steadier than live: the live demo's central router
	// ran more than 10% above the simulator at p95 TTFT in most runs.)
	legs := rand.New(rand.NewPCG(cfg.Seed, streamLegs))
	for i := range s.reqs {
		in := &m.Ingress[ingress[i]]
		leg, jitter, err := m.RTT(in.Region, m.Sites[in.Site].Region)
		if err != nil {
			return fmt.Errorf("sim: ingress %s: %w", in.Region, err)
		}
		leg = sampleRTT(leg, jitter, legs.NormFloat64())
		s.reqs[i].site, s.reqs[i].leg = int16(in.Site), leg/2*2 // two equal ways, to the nanosecond
	}
	return nil
}

// name is the run's label: its policy's, or a mesh's first site's.
func (s *simulator) name() string {
	if m := s.cfg.Mesh; m != nil {
		if m.Label != "" {
			return m.Label
		}
		return m.Sites[0].Policy.Name()
	}
	return s.cfg.Policy.Name()
}

// send has the client send request i at now: it is in flight for the
// client until its end comes back, and reaches its router after half the
// client's leg (at once without a mesh).
func (s *simulator) send(now time.Duration, i int) {
	s.inflght++ // in flight from the client's point of view
	if leg := s.reqs[i].leg; leg > 0 {
		s.push(event{t: now + leg/2, kind: evAtRouter, req: int32(i)})
		return
	}
	s.arrive(now, i)
}

// share tells the other routers of a mesh what happened to request i at
// its router at now, after the one-way delay between them.
func (s *simulator) share(now time.Duration, i, what int) {
	m := s.cfg.Mesh
	if m == nil || m.Sharing == ShareNone {
		return
	}
	from := s.reqs[i].site
	for k := range s.sites {
		if k == int(from) {
			continue
		}
		if m.Sharing == ShareInstant {
			// At once, not as an event of this instant: the requests
			// reaching other routers at the same instant (a trace's
			// burst) are then routed seeing this one, as one router
			// would route them. (dispatch's scratch request, which
			// remote overwrites, is not used after it shares.)
			s.remote(now, k, i, what)
			continue
		}
		rtt, _, _ := m.RTT(s.sites[from].region, s.sites[k].region) // checked at the start
		s.push(event{t: now + rtt/2, kind: evRemote, site: int16(k), req: int32(i), gen: uint32(what)})
	}
}

// remote mirrors, in site k's router, what request i's router reported.
func (s *simulator) remote(now time.Duration, k, i, what int) {
	st, rs := s.sites[k], &s.reqs[i]
	t := &st.remote[i]
	switch what {
	case remoteDispatch:
		if rs.replica < 0 {
			return
		}
		s.request(i)
		id, from := s.reps[rs.replica].cfg.ID, s.sites[rs.site]
		var origin router.Origin
		if m := s.cfg.Mesh; m.Sharing == ShareDelayed {
			// The origin's leg to this router is the delay of its news
			// (share); its round trip to the replica is its estimate.
			leg, _, _ := m.RTT(from.region, st.region) // checked at the start
			origin = router.Origin{Name: from.name, Leg: leg / 2, RTT: rs.ticket.RTT}
		}
		if tk, ok := st.rt.Enter(now, id, &s.rreq, from.rt.OutputKeys(&s.rreq), origin); ok {
			*t = tk
			st.rt.Accepted(t, &s.rreq)
		}
	case remoteFirst:
		if t.ID != "" {
			st.rt.FirstToken(t, 0)
		}
	case remoteFinish:
		if t.ID != "" {
			if !rs.failed {
				st.rt.Decoded(t, rs.output, rs.done-rs.first)
			}
			st.rt.Finish(t)
		}
	}
}
