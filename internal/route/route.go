// Package route decides which replica serves a request.
//
// A Policy is a pure function of a request view, immutable per-replica views
// and a random source: it holds no *http.Request, reads no clock and keeps no
// state beyond what its own rule needs (a round-robin counter). The simulator
// and the live proxy call the same policies through this interface.
package route

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Request is what a policy knows about a request.
type Request struct {
	// SessionKey identifies the conversation; empty when unknown.
	SessionKey string
	// PrefixKey is a hash of the prompt's first 256 tokens (in the
	// simulator, of its first block): what simple session affinity hashes.
	PrefixKey uint64
	// PromptTokens is the (estimated) prompt length in tokens.
	PromptTokens int
	// Blocks are the chained hashes of the prompt's blocks.
	Blocks []uint64
	// MaxOutputTokens is the request's output limit (or trace hint).
	MaxOutputTokens int
}

// EngineGauges are the engine-reported figures the router last scraped.
type EngineGauges struct {
	Running, Waiting int
	KVUsedTokens     int
	CacheHitRate     float64
}

// Replica is an immutable view of one replica at decision time.
type Replica struct {
	ID     string
	Region string
	// Healthy replicas are eligible; policies never pick an unhealthy one.
	Healthy bool
	// RTT is the router's estimate of the round trip to the replica.
	RTT time.Duration
	// InFlight is the number of requests this router sent to the replica
	// that have not finished.
	InFlight int
	// UnfinishedTokens is the prompt tokens of those requests (the paper's
	// queued tokens: raw prompt lengths, released when a request finishes).
	UnfinishedTokens int
	// BacklogTokens is the prefill work this router has sent the replica
	// that has not produced its first token yet: those requests' prompt
	// tokens less the router's estimate of their cached prefixes.
	BacklogTokens int
	// CachedTokens is the router's estimate of how many of this request's
	// prompt tokens the replica holds in its prefix cache.
	CachedTokens int
	// Engine holds the last scraped engine gauges, EngineAge their age;
	// EngineKnown is false until the first scrape.
	Engine      EngineGauges
	EngineAge   time.Duration
	EngineKnown bool
	// KVCapacityTokens is the replica's KV cache size (0 if unknown).
	KVCapacityTokens int
	// PrefillMSPerToken is the replica's prefill time per uncached prompt
	// token and QueueMSPerToken the TTFT each backlog token ahead adds, both
	// in ms (configured, from the profile, or estimated online).
	PrefillMSPerToken, QueueMSPerToken float64
}

// Terms are the parts of one replica's cost, for policies that score.
type Terms struct {
	RTT, Prefill, Queue, Total float64
}

// Decision is a policy's choice and, for scoring policies, the cost of every
// replica (in the order of the replica views) so that a choice can be
// explained in logs, metrics and tests.
type Decision struct {
	Replica int
	Scores  []Terms
	// Tag is the policy's label for this decision (zero if it has none),
	// handed back to a Learner with the request's outcome.
	Tag int
}

// Outcome is how a routed request went, as the router saw it.
type Outcome struct {
	TTFT, E2E time.Duration
	// ITL is the mean inter-token latency; zero with fewer than two tokens.
	ITL    time.Duration
	Failed bool
}

// A Learner is a policy that learns from outcomes: the caller hands back
// each request's outcome with the Tag its decision carried. Learn may be
// called concurrently with Decide.
type Learner interface {
	Policy
	Learn(tag int, o Outcome)
}

// ErrNoReplica means no replica is eligible.
var ErrNoReplica = errors.New("no healthy replica")

// Policy picks a replica for a request.
type Policy interface {
	// Name is the policy's registered name.
	Name() string
	// Decide fills d (reusing d.Scores' storage) with the chosen replica's
	// index in reps. It returns ErrNoReplica if none is healthy.
	Decide(d *Decision, req *Request, reps []Replica, rng *rand.Rand) error
}

// Options configure the policies that take parameters. The zero value
// gives every policy its defaults.
type Options struct {
	// Weights are gorgo's; zero means the paper's learned weights.
	Weights Weights
	// MSWeights are gorgo-ms's; zero means {RTT: 1, Queue: 1}.
	MSWeights Weights
	// TieMargin is the relative cost margin within which scoring policies
	// treat replicas as tied and pick among them at random; zero means
	// DefaultTieMargin, negative means exact ties only.
	TieMargin float64
}

// DefaultTieMargin is the default relative tie margin of scoring policies.
const DefaultTieMargin = 0.01

// validate reports options no policy can use.
func (o Options) validate() error {
	if math.IsNaN(o.TieMargin) || math.IsInf(o.TieMargin, 0) {
		return fmt.Errorf("tie margin must be a finite number, got %v", o.TieMargin)
	}
	return nil
}

func (o Options) tieMargin() float64 {
	switch {
	case o.TieMargin == 0:
		return DefaultTieMargin
	case o.TieMargin < 0:
		return 0
	}
	return o.TieMargin
}

type factory func(Options) (Policy, error)

var registry = map[string]factory{
	"round-robin":             func(Options) (Policy, error) { return &roundRobin{}, nil },
	"random":                  func(Options) (Policy, error) { return random{}, nil },
	"least-request":           func(Options) (Policy, error) { return leastRequest{}, nil },
	"power-of-two":            func(Options) (Policy, error) { return powerOfTwo{}, nil },
	"simple-session-affinity": func(Options) (Policy, error) { return simpleAffinity{}, nil },
	"session-affinity":        func(Options) (Policy, error) { return rendezvous{}, nil },
	"least-load":              func(Options) (Policy, error) { return leastLoad{}, nil },
	"prefix-cache":            func(Options) (Policy, error) { return prefixCache{}, nil },
	"gorgo":                   newGorgo,
	"gorgo-ms":                newGorgoMS,
}

// New returns a new instance of the named policy. The error lists the valid
// names.
func New(name string, opts Options) (Policy, error) {
	f, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (valid: %s)", name, strings.Join(Names(), ", "))
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return f(opts)
}

// Names lists the registered policies, sorted.
func Names() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
