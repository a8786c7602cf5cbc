// Package trace reads, writes, generates and describes request workloads.
//
// A workload is a time-ordered list of Requests. Prompts are described by
// prefix-chained block ids (Mooncake's convention): each id covers BlockTokens
// prompt tokens (the last block may be partial), and two requests with the
// same id at position i share every token up to the end of that block.
//
// # Formats
//
// Two JSON Lines formats are read (see Format): Mooncake's four-field records
// (timestamp in ms, input_length, output_length, hash_ids) and gorgo's
// superset, which adds a required session_id and optional turn, user_id,
// model and messages. Two CSV formats without prefix information are read too, the
// Azure LLM inference traces and BurstGPT; their requests get blocks and
// sessions of their own. Write emits the gorgo format.
//
// # Sessions
//
// Mooncake traces carry no session ids; DeriveSessions recovers them from the
// block chains. It builds the trie of all block chains of the trace and marks
// a block shared when at least two different chains continue through it (it
// has two distinct children that have children of their own) or when it is
// an ancestor of a shared block: shared blocks are the ones every conversation
// starts with, such as a system prompt. Then, in time order, a request joins
// the session of the most recent earlier request that contains its deepest
// previously seen block, unless that block is shared or there is none, in
// which case it starts a new session.
//
// # Synthetic workloads
//
// Generate produces workloads from presets (see Presets): artchat, the
// embedded default, is shaped like the ART-Chat-2.5M data of the GORGO paper;
// chat is WildChat-like; agent is BFCL-like multi-turn tool use. Every
// conversation is an append-only token stream, so the full blocks of one turn
// are a prefix of the next turn's blocks.
//
// Nothing in this package reads the clock or the global random source:
// generation is a pure function of its GenConfig.
package trace

import "time"

// BlockTokens is the number of prompt tokens covered by one hash id, as in
// the Mooncake traces. The last block of a prompt may hold fewer.
const BlockTokens = 512

// Request is one request of a workload.
type Request struct {
	// Time is the arrival offset from the start of the trace.
	Time time.Duration
	// Session identifies the conversation (or agent episode) the request
	// belongs to. Empty when the source had none and none was derived.
	Session string
	// Turn is the 1-based position of the request in its session
	// (conversation turn), counted from the start of the conversation even
	// when earlier turns lie outside the trace. 0 means unknown.
	Turn int
	// User identifies the end user who sent the request; one user may hold
	// several sessions over time. Empty when unknown.
	User string
	// InputTokens is the prompt length in tokens.
	InputTokens int
	// OutputTokens is the number of tokens the request generates. 0 is
	// allowed in traces; consumers that need at least one token treat it as 1.
	OutputTokens int
	// HashIDs are the prefix-chained ids of the prompt's blocks:
	// len(HashIDs) == BlockCount(InputTokens).
	HashIDs []uint64
	// Messages is the prompt text as chat messages, when the trace carries it.
	Messages []Message
	// Model is the model the request names (a base model or a LoRA
	// adapter, as a client would put it in its body's "model"). Empty: it
	// names none, and any replica may serve it.
	Model string
	// Tenant is whose request it is, and Priority the priority it asks
	// for (a name or an integer, see admit.ParsePriority). Empty: the
	// default tenant, and the tenant's default priority.
	Tenant, Priority string
	// TTFTSLO is the TTFT SLO its tenant holds it to (zero: the run's).
	// AssignTenants sets it; trace files do not carry it.
	TTFTSLO time.Duration
}

// Message is one chat message of a prompt.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// BlockCount returns the number of hash ids a prompt of the given length
// (tokens) has: ceil(tokens / BlockTokens), and 0 for tokens <= 0.
func BlockCount(tokens int) int {
	if tokens <= 0 {
		return 0
	}
	return (tokens + BlockTokens - 1) / BlockTokens
}

// PrefixTokens returns how many prompt tokens the first n blocks of a
// prompt of inputTokens tokens cover: min(n*BlockTokens, inputTokens).
func PrefixTokens(n, inputTokens int) int {
	if n <= 0 {
		return 0
	}
	if t := n * BlockTokens; t < inputTokens {
		return t
	}
	return inputTokens
}
