package trace

import (
	"math"
	"math/rand/v2"
	"slices"
)

// DefaultPreset is the preset Generate uses when GenConfig.Preset is empty:
// the embedded default workload.
const DefaultPreset = "artchat"

// preset is the generative model of one workload shape. Users arrive as a
// Poisson process; a user belongs to one tenant and holds conversations one
// after another; a conversation is an append-only token stream (the tenant's
// system prompt, then user message, output, user message, …) whose turn k
// sends everything up to user message k as its prompt.
type preset struct {
	name    string
	summary string
	// rate is the mean request rate (requests/s) the preset produces with
	// userRate; GenConfig.Rate scales userRate by Rate/rate.
	rate float64
	// userRate is the arrival rate of users (users/s).
	userRate float64
	// userLife is the mean time (s, exponential) a user stays and starts new
	// conversations; 0 means a user holds exactly one conversation.
	userLife float64
	// warmup is how long (s) the process runs before time 0, so that the
	// window starts in steady state.
	warmup float64
	// tenants share system prompts among their users.
	tenants []tenantSpec
	// singleTurn is the probability that a conversation has one turn.
	singleTurn float64
	// turns is the planned length of a multi-turn conversation (rounded,
	// at least 2); it ends earlier if its context would pass maxContext.
	turns dist
	// singleMsg is the tokens of the user message of a one-turn
	// conversation; firstMsg and nextMsg are those of the first user message
	// of a multi-turn conversation and of what is appended before each later
	// turn (user message or tool result).
	singleMsg, firstMsg, nextMsg dist
	// output is the output tokens of a request (rounded, at least 1),
	// unless its tenant has its own.
	output dist
	// verbosity is the sigma of a per-conversation lognormal factor, of
	// median 1, that multiplies its outputs (a user who asked for short
	// answers gets short answers all along); 0: none.
	verbosity float64
	// think is the time (s) from the end of a response to the next turn;
	// convGap the time from the end of a conversation to the user's next
	// (unused when userLife is 0).
	think, convGap dist
	// pace is the sigma of a per-user lognormal factor, of mean 1, that
	// multiplies the user's think and conversation gaps.
	pace float64
	// tokenTime is the time (s) a response takes per output token, used to
	// estimate when it ends.
	tokenTime float64
	// maxContext bounds a conversation's prompt (tokens).
	maxContext int
}

// tenantSpec is a group of users sharing one system prompt.
type tenantSpec struct {
	systemTokens int
	weight       float64
	// output, if set, is the tenant's own output length (an application
	// whose answers are tool calls, or reports), instead of the preset's.
	output *dist
}

// dist is a clamped lognormal (median, sigma) or, when uniform, a uniform
// distribution on [lo, hi].
type dist struct {
	median, sigma float64
	lo, hi        float64
	uniform       bool
}

func logn(median, sigma, lo, hi float64) dist {
	return dist{median: median, sigma: sigma, lo: lo, hi: hi}
}

func unif(lo, hi float64) dist { return dist{lo: lo, hi: hi, uniform: true} }

func (d dist) sample(r *rand.Rand) float64 {
	var v float64
	if d.uniform {
		v = d.lo + (d.hi-d.lo)*r.Float64()
	} else {
		v = d.median * math.Exp(d.sigma*r.NormFloat64())
	}
	return min(max(v, d.lo), d.hi)
}

// intn samples a rounded value.
func (d dist) intn(r *rand.Rand) int { return int(math.Round(d.sample(r))) }

// presets are the built-in workload shapes, by name.
var presets = map[string]*preset{
	// artchat: shaped like the GORGO paper's ART-Chat-2.5M windows: long,
	// many-turn conversations mixed with many one-shot requests, short
	// outputs, users who stay for hours, tenant system prompts that are short
	// next to the contexts (little cross-user reuse).
	"artchat": {
		name:     "artchat",
		summary:  "ART-Chat-like: long multi-turn contexts, outputs <= 128 tokens, high intra-user prefix reuse",
		rate:     5.7,
		userRate: 0.0465,
		userLife: 3 * 3600,
		warmup:   2 * 3600,
		tenants: []tenantSpec{
			{1100, 0.75, nil}, {700, 1, nil}, {620, 1, nil}, {540, 1, nil}, {400, 1, nil}, {300, 1, nil}, {950, 1, nil}, {200, 1, nil},
		},
		singleTurn: 0.91,
		turns:      logn(31, 0.4, 2, 400),
		singleMsg:  logn(800, 1.2, 16, 60000),
		firstMsg:   logn(1350, 1.4, 16, 60000),
		nextMsg:    logn(78, 1.3, 4, 30000),
		output:     logn(70, 0.7, 1, 128),
		think:      logn(55.5, 1.0, 2, 3600),
		convGap:    logn(89.5, 1.0, 2, 7200),
		pace:       0.3,
		tokenTime:  0.010,
		maxContext: 131072,
	},
	// chat: WildChat-like: short prompts, few turns, long outputs, one
	// conversation per user, mostly no system prompt.
	"chat": {
		name:     "chat",
		summary:  "WildChat-like: short prompts, 2-3 turns, outputs up to 1024 tokens, little cross-session prefix reuse",
		rate:     5.7,
		userRate: 2.3,
		warmup:   3600,
		tenants: []tenantSpec{
			{0, 8, nil}, {600, 0.7, nil}, {900, 0.7, nil}, {1300, 0.6, nil},
		},
		singleTurn: 0.45,
		turns:      logn(3, 0.6, 2, 40),
		singleMsg:  logn(230, 1.2, 4, 32000),
		firstMsg:   logn(230, 1.2, 4, 32000),
		nextMsg:    logn(90, 1.2, 2, 16000),
		output:     logn(250, 0.8, 1, 1024),
		think:      logn(40, 1.0, 2, 1800),
		tokenTime:  0.010,
		maxContext: 131072,
	},
	// agent: BFCL-like multi-turn tool use: episodes of 4-12 turns under a
	// tool-definition system prompt shared per tool category; each turn
	// appends a tool result or user message; outputs are mostly short tool
	// calls; the gap between turns is the tool's execution time.
	"agent": {
		name:     "agent",
		summary:  "BFCL-like tool use: 4-12 turn episodes, 1.5-4k-token tool prompts per category, outputs <= 256 tokens",
		rate:     90,
		userRate: 11.25,
		warmup:   600,
		tenants: []tenantSpec{
			{1600, 1, nil}, {2100, 1, nil}, {2500, 1, nil}, {2900, 1, nil}, {3400, 1, nil}, {3900, 1, nil},
		},
		singleTurn: 0,
		turns:      unif(3.5, 12.5),
		firstMsg:   logn(150, 0.6, 20, 1500),
		nextMsg:    logn(300, 0.6, 100, 800),
		output:     logn(40, 0.8, 1, 256),
		think:      logn(0.8, 0.7, 0.2, 3),
		tokenTime:  0.010,
		maxContext: 131072,
	},
	// apps: several applications on one fleet, each with its system prompt
	// and its own answer lengths: a tool-calling agent (short calls), two
	// chat assistants, a report writer (long answers), and users with no
	// system prompt; a conversation's answers share a verbosity. Prompts
	// and turns are chat's. How long an answer will be is then told in
	// part by the application and the conversation it belongs to.
	"apps": {
		name:     "apps",
		summary:  "several applications on one fleet: tool calls (~40 tokens), chat (~250), reports (~700), each under its own system prompt; 2-3 turns",
		rate:     5.7,
		userRate: 2.3,
		warmup:   3600,
		tenants: []tenantSpec{
			{1800, 1, &toolCalls}, {600, 1, &chatting}, {900, 1, &chatting}, {1300, 0.7, &reports}, {0, 2, nil},
		},
		singleTurn: 0.45,
		turns:      logn(3, 0.6, 2, 40),
		singleMsg:  logn(230, 1.2, 4, 32000),
		firstMsg:   logn(230, 1.2, 4, 32000),
		nextMsg:    logn(90, 1.2, 2, 16000),
		output:     logn(250, 0.8, 1, 1024),
		verbosity:  0.5,
		think:      logn(40, 1.0, 2, 1800),
		tokenTime:  0.010,
		maxContext: 131072,
	},
}

// The apps preset's answer lengths, by application.
var (
	toolCalls = logn(40, 0.8, 1, 256)
	chatting  = logn(250, 0.8, 1, 1024)
	reports   = logn(700, 0.5, 64, 2048)
)

// Presets returns the names of the built-in workload presets, sorted.
func Presets() []string {
	names := make([]string, 0, len(presets))
	for name := range presets {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// PresetSummary returns a one-line description of the named preset, or ""
// if there is none.
func PresetSummary(name string) string {
	if p, ok := presets[name]; ok {
		return p.summary
	}
	return ""
}
