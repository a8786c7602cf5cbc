package engine

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Profile describes the speed and size of one kind of replica: a model on
// some hardware. The duration of one engine step (one forward pass of a
// continuous batch) is
//
//	step = StepBaseUS + PrefillUSPerToken·prefill_tokens
//	     + DecodeUSPerSeq·decode_seqs + ContextUSPer1K·context_tokens/1000
//
// in microseconds, where context_tokens is the total context (prompt plus
// generated tokens) of the sequences decoding in the step: attention reads
// their whole KV cache once per step.
type Profile struct {
	// Name identifies the profile on the command line and in topology files.
	Name string `json:"name" yaml:"name"`
	// Description says which model on which hardware, and where the figures come from.
	Description string `json:"description" yaml:"description"`

	StepBaseUS        float64 `json:"step_base_us" yaml:"step_base_us"`
	PrefillUSPerToken float64 `json:"prefill_us_per_token" yaml:"prefill_us_per_token"`
	DecodeUSPerSeq    float64 `json:"decode_us_per_seq" yaml:"decode_us_per_seq"`
	ContextUSPer1K    float64 `json:"context_us_per_1k" yaml:"context_us_per_1k"`

	// KVCapacityTokens is how many tokens the replica's KV cache holds.
	KVCapacityTokens int `json:"kv_capacity_tokens" yaml:"kv_capacity_tokens"`
	// MaxContextTokens is the longest prompt plus output the replica accepts.
	MaxContextTokens int `json:"max_context_tokens" yaml:"max_context_tokens"`
	// MaxRunning caps the requests in the running batch.
	MaxRunning int `json:"max_running" yaml:"max_running"`
	// ChunkTokens is the per-step token budget (SGLang's
	// chunked_prefill_size, vLLM's max_num_batched_tokens).
	ChunkTokens int `json:"chunk_tokens" yaml:"chunk_tokens"`
	// Schedule is how a step mixes prefill and decode: ScheduleMixed
	// (vLLM, the default when empty) or SchedulePrefillFirst (SGLang).
	Schedule string `json:"schedule" yaml:"schedule"`
}

// Schedules.
const (
	// ScheduleMixed: decodes and prefill chunks share each step's budget,
	// decodes first (vLLM's scheduler).
	ScheduleMixed = "mixed"
	// SchedulePrefillFirst: a step with prefill work prefills only; decodes
	// run when there is none (SGLang's default scheduler).
	SchedulePrefillFirst = "prefill-first"
)

// StepTime is the duration of a step that prefills prefillTokens tokens and
// decodes one token for each of decodeSeqs sequences holding contextTokens
// tokens of context in all.
func (p *Profile) StepTime(prefillTokens, decodeSeqs, contextTokens int) time.Duration {
	us := p.StepBaseUS +
		p.PrefillUSPerToken*float64(prefillTokens) +
		p.DecodeUSPerSeq*float64(decodeSeqs) +
		p.ContextUSPer1K*float64(contextTokens)/1000
	return time.Duration(math.Round(us * 1000))
}

// PrefillTime is how long an otherwise idle replica takes to prefill tokens
// uncached prompt tokens, chunk by chunk: the engine's part of a lone
// request's TTFT.
func (p *Profile) PrefillTime(tokens int) time.Duration {
	var d time.Duration
	for tokens > 0 {
		c := min(tokens, p.ChunkTokens)
		d += p.StepTime(c, 0, 0)
		tokens -= c
	}
	return d
}

// PrefillMSPerToken is the profile's prefill cost per uncached prompt
// token in ms, the step overhead of a full chunk included.
func (p *Profile) PrefillMSPerToken() float64 {
	return (p.PrefillUSPerToken + p.StepBaseUS/float64(p.ChunkTokens)) / 1000
}

// QueueMSPerToken is the TTFT each token of prefill backlog ahead of a
// request adds, in ms: the backlog is prefill work, so the prefill rate.
func (p *Profile) QueueMSPerToken() float64 { return p.PrefillMSPerToken() }

// ITLMS is the inter-token latency of a lone request on an otherwise idle
// replica, in ms: the prior of a router's ITL model.
func (p *Profile) ITLMS() float64 { return (p.StepBaseUS + p.DecodeUSPerSeq) / 1000 }

// ITLSlopeMS is what one more request decoding alongside adds to every
// step, in ms, for a request holding 4k tokens of context: the prior of
// the ITL model's slope (the router learns the rest, prefill stalls
// included).
func (p *Profile) ITLSlopeMS() float64 { return (p.DecodeUSPerSeq + 4*p.ContextUSPer1K) / 1000 }

// Scaled returns the profile of a replica speed times faster: every step
// coefficient divided by speed, named NAME@SPEEDx.
func (p Profile) Scaled(speed float64) Profile {
	p.Name = fmt.Sprintf("%s@%gx", p.Name, speed)
	p.StepBaseUS /= speed
	p.PrefillUSPerToken /= speed
	p.DecodeUSPerSeq /= speed
	p.ContextUSPer1K /= speed
	return p
}

// Validate reports the first field that makes the profile unusable.
func (p *Profile) Validate() error {
	switch {
	case p.Name == "":
		return fmt.Errorf("profile has no name")
	case p.StepBaseUS < 0 || p.PrefillUSPerToken <= 0 || p.DecodeUSPerSeq < 0 || p.ContextUSPer1K < 0:
		return fmt.Errorf("profile %s: step coefficients must be non-negative and prefill_us_per_token positive", p.Name)
	case p.StepBaseUS+p.DecodeUSPerSeq <= 0:
		return fmt.Errorf("profile %s: a decode step must take time (step_base_us + decode_us_per_seq > 0)", p.Name)
	case p.KVCapacityTokens <= 0:
		return fmt.Errorf("profile %s: kv_capacity_tokens must be positive", p.Name)
	case p.MaxContextTokens <= 0:
		return fmt.Errorf("profile %s: max_context_tokens must be positive", p.Name)
	case p.MaxRunning <= 0:
		return fmt.Errorf("profile %s: max_running must be positive", p.Name)
	case p.ChunkTokens <= 0:
		return fmt.Errorf("profile %s: chunk_tokens must be positive", p.Name)
	case p.Schedule != "" && p.Schedule != ScheduleMixed && p.Schedule != SchedulePrefillFirst:
		return fmt.Errorf("profile %s: schedule must be %s or %s, got %q", p.Name, ScheduleMixed, SchedulePrefillFirst, p.Schedule)
	}
	return nil
}

// profiles are the built-in profiles. Figures are the paper's measurements unless
// the description says they are estimates.
var profiles = []Profile{
	{
		Name: "qwen3.5-35b-l40sx2",
		Description: "the paper's engine: SGLang (prefill-first scheduling), Qwen3.5-35B-A3B-FP8, 2x L40S (TP2). " +
			"Prefill 60 us/token (measured 57-63), ITL 9-10 ms unsaturated rising to 15+ ms near a full KV cache, " +
			"KV capacity 983,549 tokens (measured); context 262,144 (the model's native length; the paper capped it at 32,768)",
		StepBaseUS: 9000, PrefillUSPerToken: 60, DecodeUSPerSeq: 20, ContextUSPer1K: 10,
		KVCapacityTokens: 983549, MaxContextTokens: 262144, MaxRunning: 256, ChunkTokens: 4096,
		Schedule: SchedulePrefillFirst,
	},
	{
		Name: "qwen3.5-35b-h100",
		Description: "SGLang (prefill-first), Qwen3.5-35B-A3B-FP8 on one H100 80GB. Prefill 76 us/token (measured 69-83); " +
			"decode terms and KV capacity (600,000 tokens, free memory scaled from the L40S pair) are estimates",
		StepBaseUS: 7000, PrefillUSPerToken: 76, DecodeUSPerSeq: 15, ContextUSPer1K: 6,
		KVCapacityTokens: 600000, MaxContextTokens: 262144, MaxRunning: 256, ChunkTokens: 8192,
		Schedule: SchedulePrefillFirst,
	},
	{
		Name: "qwen3-14b-h100",
		Description: "Qwen3-14B on one H100 (published step model b0 13,578 us, b1 39.45, b2 27.32 per decode token); " +
			"KV capacity 280,000 tokens is an estimate (163 KB/token in BF16)",
		StepBaseUS: 13578, PrefillUSPerToken: 39.45, DecodeUSPerSeq: 27.32, ContextUSPer1K: 0,
		KVCapacityTokens: 280000, MaxContextTokens: 40960, MaxRunning: 256, ChunkTokens: 8192,
	},
	{
		Name: "llama3.1-8b-h100",
		Description: "Llama-3.1-8B on one H100, TP1 (published step model b0 6,472 us, b1 19.80); " +
			"the decode term and KV capacity (430,000 tokens, 128 KB/token) are estimates",
		StepBaseUS: 6472, PrefillUSPerToken: 19.80, DecodeUSPerSeq: 10, ContextUSPer1K: 0,
		KVCapacityTokens: 430000, MaxContextTokens: 131072, MaxRunning: 256, ChunkTokens: 8192,
	},
	{
		Name: "llama3.3-70b-h100x4",
		Description: "Llama-3.3-70B on 4x H100, TP4 (published step model b0 12,601 us, b1 76.42, b2 66.84 per decode token); " +
			"KV capacity 460,000 tokens is an estimate (320 KB/token)",
		StepBaseUS: 12601, PrefillUSPerToken: 76.42, DecodeUSPerSeq: 66.84, ContextUSPer1K: 0,
		KVCapacityTokens: 460000, MaxContextTokens: 131072, MaxRunning: 256, ChunkTokens: 8192,
	},
}

// profileAliases are short names for built-in profiles.
var profileAliases = map[string]string{
	"paper": "qwen3.5-35b-l40sx2",
	"l40s":  "qwen3.5-35b-l40sx2",
	"h100":  "qwen3.5-35b-h100",
}

// LookupProfile returns a copy of the built-in profile with the given name or
// alias. The error lists the valid names.
func LookupProfile(name string) (Profile, error) {
	if full, ok := profileAliases[name]; ok {
		name = full
	}
	for _, p := range profiles {
		if p.Name == name {
			return p, nil
		}
	}
	return Profile{}, fmt.Errorf("unknown engine profile %q (valid: %s)", name, strings.Join(ProfileNames(), ", "))
}

// ProfileNames lists the built-in profile names and aliases, sorted.
func ProfileNames() []string {
	var names []string
	for _, p := range profiles {
		names = append(names, p.Name)
	}
	for a := range profileAliases {
		names = append(names, a)
	}
	slices.Sort(names)
	return names
}

// Profiles returns copies of the built-in profiles.
func Profiles() []Profile { return slices.Clone(profiles) }
