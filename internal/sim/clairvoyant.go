package sim

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/policy"
)

// ClairvoyantName is the name of the simulator-only yardstick policy, and
// ClairvoyantEnginesName that of its variant blind to the network's jitter.
const (
	ClairvoyantName        = "clairvoyant"
	ClairvoyantEnginesName = "clairvoyant-engines"
)

// NewClairvoyant returns the simulator-only policy that asks each replica's
// true engine state what the request's TTFT would be if sent now (with the
// request's true round trip to it, and the requests already on their way
// to it), and picks the least. It is the yardstick of how close a greedy
// router can get. Each instance serves one Run.
func NewClairvoyant() policy.Policy { return &clairvoyant{} }

// NewClairvoyantEngines returns clairvoyant deciding on each replica's
// mean round trip (which a router's probes estimate), not the request's
// draw of its jitter. It still knows every engine's state exactly. What
// clairvoyant wins over it is what it knows of the network's future.
func NewClairvoyantEngines() policy.Policy { return &clairvoyant{meanRTT: true} }

type clairvoyant struct {
	// meanRTT: decide on the replicas' mean round trips.
	meanRTT bool
	s       *simulator
	now     time.Duration
	req     int
	scratch *engine.Engine
	evs     []engine.Event
	order   []int32
	steps   int64
}

func (c *clairvoyant) Name() string {
	if c.meanRTT {
		return ClairvoyantEnginesName
	}
	return ClairvoyantName
}

func (c *clairvoyant) Decide(d *policy.Decision, _ *policy.Request, reps []policy.Replica, _ *rand.Rand) error {
	d.Scores = d.Scores[:0]
	best, bestT := 0, math.Inf(1)
	for i := range reps {
		t := float64(c.ttft(c.s.byID[reps[i].ID])) / 1e6
		d.Scores = append(d.Scores, policy.Terms{Total: t})
		if t < bestT {
			best, bestT = i, t
		}
	}
	d.Replica = best
	return nil
}

// ttft simulates, on a copy of replica r's engine, the current request sent
// now, and returns its TTFT at the router (as it would arrive with the mean
// round trip, for clairvoyant-engines).
func (c *clairvoyant) ttft(r int) time.Duration {
	s := c.s
	rs := &s.reps[r]
	rtt := s.requestRTT(c.req, r)
	if c.meanRTT {
		rtt = s.sites[s.reqs[c.req].site].rtt[r]
	}
	arrive := c.now + rtt/2
	e := rs.eng.Clone(c.scratch)
	c.scratch = e
	// Requests already on their way arrive first if they get there first.
	c.order = append(c.order[:0], rs.transit...)
	at := func(j int32) time.Duration { return s.reqs[j].sent + s.reqs[j].rtt/2 }
	slices.SortStableFunc(c.order, func(a, b int32) int {
		switch ta, tb := at(a), at(b); {
		case ta < tb:
			return -1
		case ta > tb:
			return 1
		}
		return 0
	})
	for _, j := range c.order {
		if at(j) > arrive {
			break
		}
		c.submit(e, r, at(j), int(j))
	}
	e.Advance(arrive, nil)
	c.submit(e, r, arrive, c.req)
	for {
		next, ok := e.Next()
		if !ok {
			return time.Duration(math.MaxInt64) // rejected: never a first token
		}
		c.evs = e.Advance(next, c.evs[:0])
		c.steps++
		for _, ev := range c.evs {
			if ev.ID == uint64(c.req) && ev.Kind == engine.EventFirstToken {
				return ev.Time + rtt/2 - c.now
			}
		}
	}
}

// submit has engine e, a copy of replica r's, take request i at at, as r
// would (its model's blocks, its adapter there).
func (c *clairvoyant) submit(e *engine.Engine, r int, at time.Duration, i int) {
	e.Advance(at, nil)
	_ = e.Submit(at, c.s.engineRequest(i, r))
}

func init() {
	policy.Register(policy.Info{Name: ClairvoyantName, SimOnly: true, Rank: 11,
		New: func(policy.Options) (policy.Policy, error) { return NewClairvoyant(), nil }})
	// Not in the default comparison: a yardstick for where clairvoyant's
	// lead comes from.
	policy.Register(policy.Info{Name: ClairvoyantEnginesName, SimOnly: true,
		New: func(policy.Options) (policy.Policy, error) { return NewClairvoyantEngines(), nil }})
}
