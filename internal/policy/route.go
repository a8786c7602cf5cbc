// Package policy decides which replica serves a request.
//
// A Policy is a pure function of a request view, immutable views of the
// available replicas and a random source: it holds no *http.Request, reads
// no clock and keeps no state beyond what its own rule needs (a round-robin
// counter). It only scores: the router has already removed the replicas it
// may not pick, and resolves ties itself (Pick). The simulator and the live
// proxy call the same policies through this interface, and every policy is
// found by name in one open registry (Register).
package policy

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Request is what a policy knows about a request.
type Request struct {
	// SessionKey identifies the conversation; empty when unknown.
	SessionKey string
	// Tenant is whose request it is ("" for none): two tenants' sessions
	// of one id are two conversations to the router's estimate of answers'
	// lengths.
	Tenant string
	// PrefixKey is a hash of the first 256 tokens of the prompt's messages
	// (after a chat's tools, its images left out: prompt.OpeningKeys; in
	// the simulator, of the text the replayer would send): what simple
	// session affinity hashes.
	PrefixKey uint64
	// InstructionsKey is a hash of a chat's opening system or developer
	// messages (at most its first 256 tokens, so that instructions that
	// fill them hash as PrefixKey); 0 without them. The router learns
	// answers' lengths by application under it.
	InstructionsKey uint64
	// ToolsKey is a hash of the tools a chat offers the model (which its
	// chat template renders into the prompt); 0 without. They are part of
	// its application: the router's estimate of answers' lengths keys
	// the application by them too.
	ToolsKey uint64
	// PromptTokens is the (estimated) prompt length in tokens.
	PromptTokens int
	// Blocks are the chained hashes of the prompt's blocks: for a batch of
	// prompts (a completion's list, which the engine runs as so many
	// requests), each prompt's chain, end to end.
	Blocks []uint64
	// BlockEnds is, for a batch, where each prompt's chain ends in Blocks
	// (not decreasing: an empty prompt has none; the last len(Blocks));
	// nil for one prompt.
	BlockEnds []int
	// MaxOutputTokens is the request's output limit (or trace hint), per
	// answer; MinOutputTokens the least it asks for (min_tokens), 0 when
	// it does not.
	MaxOutputTokens, MinOutputTokens int
	// Choices is how many answers the engine generates for it (a request's
	// n); 0 means one (see Sequences). Output lengths (MaxOutputTokens,
	// the estimates below) are per answer: the answers decode side by side.
	Choices int
	// ExpectedOutputTokens is the router's estimate of the output length
	// (from the answers before it, within MinOutputTokens and
	// MaxOutputTokens): the router never knows the true length.
	// MeanOutputTokens is the mean length of all answers, what a request
	// the router knows nothing of is expected to need (the others in
	// flight at a replica). The router sets both before a decision.
	ExpectedOutputTokens, MeanOutputTokens int
	// Allowed, if set, restricts the decision to the replicas it accepts
	// (a gateway's subset hint); nil allows every available replica.
	Allowed func(id string) bool
	// Holder is the replica that stores the conversation the request
	// continues (a Responses API follow-up): a candidate for it while it
	// drains, since no other replica holds the conversation.
	Holder string
	// Endpoint is the API path the request is sent to ("/generate"), if
	// it matters: the decision passes over the replicas that answered they
	// have no such endpoint (router.Router.Lacks), unless every one has.
	// "" (the simulator's requests) any replica serves.
	Endpoint string
	// WaitingCap, if positive, keeps the decision off the replicas with
	// that many requests or more waiting for their first token (flow
	// control's saturation for batch work), unless every one has.
	WaitingCap int
	// TPOTSLOMS, if positive, is the time per output token the request
	// asks for: the decision keeps off the replicas whose ITL model
	// predicts more with it among their decodes, unless every one does.
	TPOTSLOMS float64
	// TTFTBudgetMS, if positive, is the time left before the request's
	// first token is due (admission's TTFT SLO less what it waited): the
	// decision keeps off the replicas where the router forecasts a later
	// first token (router.Predict's model), unless every one does.
	TTFTBudgetMS float64
	// Unstreamed says the answer will not be streamed: the router sees no
	// first token, and releases the request from the replica's prefill
	// backlog when its forecast first token is due.
	Unstreamed bool
	// HasSLO says the request is held to a TTFT or TPOT SLO: its outcome
	// will carry them (Outcome.HasSLO).
	HasSLO bool
	// Unjudged says no learner hears the request's outcome: it generates
	// no text (embeddings, tokenizing, scoring), or its answer is a
	// stream the front end will not see (a gateway that shows the picker
	// no body), whose time is not known.
	Unjudged bool
	// Now is the router's time of the decision (the simulator's clock, or
	// the proxy's since it started); the router sets it.
	Now time.Duration
	// Model is the served name the request is for (a base model or a LoRA
	// adapter; an alias already resolved): the router shows a policy only
	// the replicas that serve it. Empty: any replica.
	Model string
}

// MaxSequences is the most sequences a request is counted for: more than
// any replica decodes at once, and few enough that a count times a
// length, or added to a replica's count, cannot overflow.
const MaxSequences = 1 << 16

// Sequences is how many sequences the engine decodes for the request side
// by side: Choices, at least 1 and at most MaxSequences.
func (r *Request) Sequences() int { return min(max(r.Choices, 1), MaxSequences) }

// EngineGauges are the engine-reported figures the router last scraped.
type EngineGauges struct {
	Running      int     `json:"running"`
	Waiting      int     `json:"waiting"`
	KVUsedTokens int     `json:"kv_used_tokens"`
	CacheHitRate float64 `json:"cache_hit_rate"`
}

// Replica is an immutable view of one available replica at decision time:
// the router shows a policy only replicas it may pick (not down, not
// draining, reached by a probe).
type Replica struct {
	ID     string
	Region string
	// RTT is the router's estimate of the round trip to the replica.
	RTT time.Duration
	// InFlight is the number of sequences this router sent to the replica
	// that have not finished: a request for n answers is n, as the engines
	// count them (Request.Sequences).
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
	// Decoding is how many of this router's sequences at the replica are
	// past their first token and not finished.
	Decoding int
	// ITLBaseMS and ITLSlopeMS are the replica's inter-token latency model,
	// ITL ≈ base + slope·(requests in flight), in ms, learned from the
	// token gaps the router observes (from the profile until then).
	ITLBaseMS, ITLSlopeMS float64
	// AdapterMS is what it costs (ms) to make the request's LoRA adapter
	// ready there: 0 for a base model or an adapter believed resident;
	// else its load time, plus a wait for a slot when the replica's
	// adapter slots (max_lora) are all held by requests in flight.
	AdapterMS float64
}

// Terms are the parts of one replica's cost, for policies that score.
// Decode is gorgo-e2e's decode term (zero for the others); Adapter the
// cost of loading the request's LoRA adapter there (Replica.AdapterMS).
type Terms struct {
	RTT, Prefill, Queue, Decode, Adapter, Total float64
}

// MarshalJSON writes the terms under their names, a term that is not
// finite (weights large enough to overflow, a policy's +Inf for a replica
// it rules out) as null: encoding/json refuses such a number, and with it
// the whole answer (2026-12-06, a user's test: /admin/decide answered an
// empty 200 and the live view's stream closed).
func (t Terms) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 128)
	for i, f := range [...]struct {
		name string
		v    float64
	}{{"RTT", t.RTT}, {"Prefill", t.Prefill}, {"Queue", t.Queue}, {"Decode", t.Decode}, {"Adapter", t.Adapter}, {"Total", t.Total}} {
		if i == 0 {
			b = append(b, '{')
		} else {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, f.name...)
		b = append(b, '"', ':')
		switch a := math.Abs(f.v); {
		case math.IsNaN(f.v) || math.IsInf(f.v, 0):
			b = append(b, "null"...)
		case a != 0 && (a < 1e-6 || a >= 1e21): // as encoding/json
			b = strconv.AppendFloat(b, f.v, 'e', -1, 64)
		default:
			b = strconv.AppendFloat(b, f.v, 'f', -1, 64)
		}
	}
	return append(b, '}'), nil
}

// Decision is a policy's verdict: a score for every replica (lower is
// better), in the order of the replica views, and either the chosen
// replica or ByScore. The router, not the policy, resolves ties: a ByScore
// decision goes to the replica of least total, drawn at random among those
// within the router's tie margin of it (or of exactly equal total, with
// ExactTies). The scores also rank the replicas after the chosen one, for
// failover and for front ends that want a fallback list, and explain a
// choice in logs, metrics and tests.
type Decision struct {
	// Replica is the chosen replica's index in the views, or ByScore.
	Replica int
	// Scores has one Terms per replica view.
	Scores []Terms
	// ExactTies makes a ByScore decision tie only equal totals (for
	// policies that count requests or tokens).
	ExactTies bool
	// Tag is the policy's label for this decision (zero if it has none),
	// handed back to a Learner with the request's outcome.
	Tag int
}

// ByScore as Decision.Replica asks the router to pick by score.
const ByScore = -1

// Outcome is how a routed request went, as the router saw it.
type Outcome struct {
	// TTFT and E2E are its time to first token and to its end; a whole
	// (Unstreamed) answer's first token is not seen, its TTFT zero.
	TTFT, E2E  time.Duration
	Unstreamed bool
	// Tokens is the answer's length in tokens (each answer's, of a
	// request for several; 0: not known).
	Tokens int
	// ITL is the mean inter-token latency; zero with fewer than two tokens.
	ITL    time.Duration
	Failed bool
	// TTFTSLO and TPOTSLO are the service levels the request was held to:
	// its first token within TTFTSLO of its arrival at the router, its
	// time per output token (ITL) within TPOTSLO; zero where it had none.
	TTFTSLO, TPOTSLO time.Duration
	// Queued is how long the request was at the router before its first
	// attempt was sent (held by admission): TTFT and E2E are counted from
	// that send, attempts that failed before the one that answered
	// included (their replicas were the same decision's choice), its SLO
	// from arrival.
	Queued time.Duration
}

// HasSLO reports whether the request was held to an SLO.
func (o Outcome) HasSLO() bool { return o.TTFTSLO > 0 || o.TPOTSLO > 0 }

// MaxSLORatio bounds SLORatio: a request ten times over its SLO has missed
// it, however far. Unbounded, the few requests whose clients ask for a
// TPOT no engine gives (x-gorgo-tpot-slo-ms) would make the p95 of the
// ratios theirs, and steer a tuner minimising it; bounded, they can only
// hold it still.
const MaxSLORatio = 10

// SLORatio is how near the outcome came to missing its SLOs: the larger of
// (Queued+TTFT)/TTFTSLO and ITL/TPOTSLO over the SLOs it has, above 1 when
// it missed one, at most MaxSLORatio; false for a failed request, one
// without SLOs, or a whole answer (its first token not seen).
func (o Outcome) SLORatio() (float64, bool) {
	if o.Failed || !o.HasSLO() || o.Unstreamed { // a whole answer's first token is not seen
		return 0, false
	}
	var r float64
	if o.TTFTSLO > 0 {
		r = float64(o.Queued+o.TTFT) / float64(o.TTFTSLO)
	}
	if o.TPOTSLO > 0 {
		r = max(r, float64(o.ITL)/float64(o.TPOTSLO))
	}
	return min(r, MaxSLORatio), true
}

// A Learner is a policy that learns from outcomes: the caller hands back
// each request's outcome with the Tag its decision carried (a negative tag:
// the replica was not the policy's choice, a stored response's holder,
// and the outcome measures nothing of it), whole answers' too
// (Outcome.Unstreamed). Learn may be called concurrently with Decide.
type Learner interface {
	Policy
	Learn(tag int, o Outcome)
}

// A FleetWatcher is a policy whose learned state belongs to the fleet it
// learned it on: the router tells it when that fleet changed (a replica
// added or gone, a round trip that jumped).
type FleetWatcher interface {
	FleetChanged(FleetChange)
}

// FleetChange is a change of the fleet: why, in a few words, and the
// replica that joined the decisions, if that is the change.
type FleetChange struct {
	Why    string
	Joined string
}

// ErrNoReplica means no replica is available.
var ErrNoReplica = errors.New("no available replica")

// Policy scores the available replicas for a request. The router calls
// Decide with at least one replica, one decision at a time.
type Policy interface {
	// Name is the policy's registered name.
	Name() string
	// Decide fills d: it resets d.Scores (reusing its storage), appends one
	// Terms per replica of reps, and sets d.Replica to its choice or to
	// ByScore.
	Decide(d *Decision, req *Request, reps []Replica, rng *rand.Rand) error
}

// Options configure a new instance of a policy.
type Options struct {
	// Params are the policy's parameters (see Info.Params): New fills in
	// the defaults of those not given, so the factory sees every one.
	Params Values
	// Region is the router's own region, for policies that prefer it
	// (skywalker).
	Region string
	// Config configures policies that take more than numbers (the online
	// tuner takes a tune.OnlineConfig); nil means their defaults.
	Config any
}

// DefaultTieMargin is the default relative tie margin of ByScore
// decisions: replicas whose totals are within 1% of the least are tied.
const DefaultTieMargin = 0.01

// DrawStream is the PCG stream of the policies' draws (ties, a random
// choice) under a run's seed. The simulator and a live router draw from it
// alike, so that, given the same seed and the same requests in the same
// order, a policy that draws chooses the same replicas in both.
const DrawStream = 0x9e3779b97f4a7c15

// Pick resolves a decision over n replica views: its choice, or for a
// ByScore decision the least total, drawn uniformly among the replicas
// whose totals are within margin (relative, ≤ 0 for exact) of it, or equal
// to it with d.ExactTies.
func Pick(d *Decision, margin float64, rng *rand.Rand) int {
	switch {
	case d.Replica != ByScore:
		return d.Replica
	case d.ExactTies:
		return argmin(d.Scores, rng)
	}
	return within(d.Scores, max(margin, 0), rng)
}

// within draws uniformly among the scores within margin of the least. A
// score that is not a number never wins; if none is a finite number, any
// replica may.
func within(scores []Terms, margin float64, rng *rand.Rand) int {
	best := math.Inf(1)
	for i := range scores {
		if t := scores[i].Total; !math.IsNaN(t) {
			best = min(best, t)
		}
	}
	if math.IsInf(best, 1) {
		return rng.IntN(len(scores))
	}
	limit := best // -Inf: only the -Inf scores tie (margin·Inf would make it NaN)
	if !math.IsInf(best, -1) {
		limit = best + margin*math.Abs(best)
	}
	chosen, n := -1, 0
	for i := range scores {
		if scores[i].Total <= limit {
			n++
			if rng.IntN(n) == 0 {
				chosen = i
			}
		}
	}
	return chosen
}

// argmin draws uniformly among the least scores (reservoir sampling: a
// draw only from the second tie on).
func argmin(scores []Terms, rng *rand.Rand) int {
	best, ties := -1, 0
	for i := range scores {
		switch {
		case math.IsNaN(scores[i].Total):
			continue // never wins
		case best < 0 || scores[i].Total < scores[best].Total:
			best, ties = i, 1
		case scores[i].Total == scores[best].Total:
			ties++
			if rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if best < 0 { // every score NaN
		return rng.IntN(len(scores))
	}
	return best
}

// Factory makes a new instance of a policy.
type Factory func(Options) (Policy, error)

// Info is a registered policy.
type Info struct {
	Name string
	New  Factory
	// SimOnly marks a policy that needs the simulator's true engine state
	// (clairvoyant): a live router refuses it.
	SimOnly bool
	// Params are the policy's parameters, in the order they are shown
	// (nil: it has none). A policy with parameters implements Tunable.
	Params []Param
	// ConfigKey is the config file's key for the policy's parameters
	// beside params.<name> ("weights" for gorgo's); empty for none.
	ConfigKey string
	// Tuner marks a policy that tunes another's parameters online
	// (gorgo-online): tune: true is what it does.
	Tuner bool
	// Rank places the policy in the comparison gorgo sim and gorgo eval run
	// when no policy is named, lowest first; 0 leaves it out.
	Rank int
}

var (
	regMu    sync.RWMutex
	registry = map[string]Info{}
)

// Register adds a policy to the registry, from an init function; it
// panics if the name is taken or the entry is incomplete. A new policy is
// one file that registers it (with its parameters, if it has any).
func Register(i Info) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[i.Name]; dup || i.Name == "" || i.New == nil {
		panic(fmt.Sprintf("policy: %q registered twice or incomplete", i.Name))
	}
	seen := map[string]bool{}
	for _, p := range i.Params {
		if p.Name == "" || seen[p.Name] || p.Default < 0 || math.IsNaN(p.Default) || math.IsInf(p.Default, 0) ||
			!(p.Min > 0 && p.Min <= p.Init && p.Init <= p.Max) || math.IsInf(p.Max, 0) {
			panic(fmt.Sprintf("policy: %s's parameter %q is unnamed, listed twice, or out of its bounds", i.Name, p.Name))
		}
		seen[p.Name] = true
	}
	for _, o := range registry {
		if i.ConfigKey != "" && o.ConfigKey == i.ConfigKey {
			panic(fmt.Sprintf("policy: %s and %s share the config key %q", o.Name, i.Name, i.ConfigKey))
		}
	}
	registry[i.Name] = i
}

func init() {
	for _, i := range []Info{
		{Name: "round-robin", New: func(Options) (Policy, error) { return &roundRobin{}, nil }, Rank: 9},
		{Name: "random", New: func(Options) (Policy, error) { return random{}, nil }},
		{Name: "least-request", New: func(Options) (Policy, error) { return leastRequest{}, nil }, Rank: 6},
		{Name: "power-of-two", New: func(Options) (Policy, error) { return powerOfTwo{}, nil }, Rank: 10},
		{Name: "simple-session-affinity", New: func(Options) (Policy, error) { return simpleAffinity{}, nil }, Rank: 4},
		{Name: "session-affinity", New: func(Options) (Policy, error) { return rendezvous{}, nil }, Rank: 5},
		{Name: "least-load", New: func(Options) (Policy, error) { return leastLoad{}, nil }, Rank: 7},
		{Name: "prefix-cache", New: func(Options) (Policy, error) { return prefixCache{}, nil }, Rank: 8},
		{Name: "skywalker", New: newSkyWalker},
	} {
		Register(i)
	}
}

// DefaultName is the policy `default` stands for: the one that prices both
// a request's TTFT and its decode, gorgo serve's default.
const DefaultName = "gorgo-e2e"

// Canonical returns the policy name that name stands for: DefaultName for
// "default", name otherwise.
func Canonical(name string) string {
	if name == "default" {
		return DefaultName
	}
	return name
}

// Lookup returns the registered policy of that name (or alias: "default").
func Lookup(name string) (Info, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	i, ok := registry[Canonical(name)]
	return i, ok
}

// New returns a new instance of the named policy, its parameters those of
// opts (the defaults for those not given). The error lists the valid names.
func New(name string, opts Options) (Policy, error) {
	i, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (valid: %s, or default for %s)", name, strings.Join(Names(), ", "), DefaultName)
	}
	if len(i.Params) > 0 || len(opts.Params) > 0 {
		v, err := i.Resolve(opts.Params)
		if err != nil {
			return nil, err
		}
		opts.Params = v
	}
	return i.New(opts)
}

// Compared lists the policies of the default comparison (Info.Rank), in
// rank order.
func Compared() []string {
	regMu.RLock()
	var ranked []Info
	for _, i := range registry {
		if i.Rank > 0 {
			ranked = append(ranked, i)
		}
	}
	regMu.RUnlock()
	slices.SortFunc(ranked, func(a, b Info) int { return a.Rank - b.Rank })
	out := make([]string, len(ranked))
	for k, i := range ranked {
		out[k] = i.Name
	}
	return out
}

// ByConfigKey returns the policy whose parameters the config file gives
// under key.
func ByConfigKey(key string) (Info, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	for _, i := range registry {
		if i.ConfigKey == key {
			return i, true
		}
	}
	return Info{}, false
}

// ConfigKeys lists the config keys of policies' parameters, sorted.
func ConfigKeys() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	var out []string
	for _, i := range registry {
		if i.ConfigKey != "" {
			out = append(out, i.ConfigKey)
		}
	}
	slices.Sort(out)
	return out
}

// Names lists the registered policies, sorted.
func Names() []string { return names(true) }

// LiveNames lists the policies a live router runs (not the simulator's
// yardsticks), sorted.
func LiveNames() []string { return names(false) }

func names(simOnly bool) []string {
	regMu.RLock()
	defer regMu.RUnlock()
	out := make([]string, 0, len(registry))
	for n, i := range registry {
		if simOnly || !i.SimOnly {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
