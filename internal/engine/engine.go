// Package engine models one LLM engine replica (SGLang or vLLM): a prefix KV
// cache of fixed-size blocks with LRU eviction, continuous batching with
// chunked prefill, timed by a step-latency Profile, and LoRA adapter slots
// (see Config.MaxLoRAs and Request.Adapter).
//
// The model is advanced by explicit time: it never sleeps, never reads the
// wall clock and draws no random numbers, so the simulator (virtual time) and
// the emulator (wall-clock time) share it and a run is exactly repeatable.
// An Engine is not safe for concurrent use.
package engine

import (
	"errors"
	"fmt"
	"time"
)

// Config configures an Engine. Zero fields take the profile's value.
type Config struct {
	Profile Profile
	// PageTokens is the number of prompt tokens per cache block; each of a
	// request's Blocks covers this many tokens. Default 512 (Mooncake's).
	PageTokens int
	// KVCapacityTokens overrides the profile's KV cache capacity.
	KVCapacityTokens int
	// MaxRunning overrides the profile's cap on running requests.
	MaxRunning int
	// ChunkTokens overrides the profile's per-step token budget.
	ChunkTokens int
	// MaxWaiting caps the waiting queue; Submit fails with ErrQueueFull
	// beyond it. Zero means unbounded.
	MaxWaiting int
	// TokenEvents makes Advance emit an EventToken for every decoded token,
	// not only the first token and the finish.
	TokenEvents bool
	// MaxLoRAs is the LoRA adapter slots (vLLM's --max-loras, SGLang's
	// --max-loras-per-batch): at most this many adapters are resident,
	// the least recently used unpinned one evicted for a new one, and the
	// running batch uses at most this many. Default DefaultMaxLoRAs.
	MaxLoRAs int
	// LoRALoadTime is what loading an adapter that is not resident adds
	// to the step that admits its request, once per adapter loaded (the
	// whole batch waits, as the engines load adapters synchronously).
	// Default 0.
	LoRALoadTime time.Duration
}

// Request is a request submitted to an engine.
type Request struct {
	// ID is the caller's identifier, echoed in events.
	ID uint64
	// PromptTokens is the prompt length, at least 1.
	PromptTokens int
	// OutputTokens is how many tokens to generate; values below 1 mean 1.
	OutputTokens int
	// Blocks are the chained ids of the prompt's blocks, one per
	// PageTokens tokens (the last may be partial). The engine keeps the
	// slice until the request finishes; do not modify it meanwhile.
	Blocks []uint64
	// Adapter is the LoRA adapter the request runs with (0: the base
	// model), any nonzero id (the emulator's is prefix.ModelKey of its
	// name). Its prompt's Blocks should be keyed by it (prefix.Keyed), as
	// engines key their prefix caches by adapter.
	Adapter uint64
}

// EventKind says what happened to a request.
type EventKind uint8

const (
	// EventFirstToken: the prefill finished and the first token is out.
	EventFirstToken EventKind = iota + 1
	// EventToken: one more token was decoded (only with Config.TokenEvents).
	EventToken
	// EventFinish: the last token is out and the request left the engine.
	EventFinish
)

// Event is something that happened to a request at a model time.
type Event struct {
	Kind EventKind
	ID   uint64
	Time time.Duration
	// Generated is the number of output tokens produced so far.
	Generated int
	// CachedTokens is the number of prompt tokens served from the prefix cache.
	CachedTokens int
	// OnAdapter and AdapterLoaded, on a first token: the request runs with
	// a LoRA adapter, and the adapter was loaded for it (it was not
	// resident when the request was admitted).
	OnAdapter, AdapterLoaded bool
}

// Errors returned by Submit.
var (
	ErrInvalid   = errors.New("invalid request")
	ErrTooLarge  = errors.New("request exceeds the context length or the KV cache")
	ErrQueueFull = errors.New("waiting queue is full")
)

// Gauges is a snapshot of an engine's state; the counters are cumulative.
type Gauges struct {
	Running, Waiting int
	// WaitingTokens is the prompt tokens of the waiting requests.
	WaitingTokens int
	// PrefillTokens is the prompt tokens of running requests not yet prefilled.
	PrefillTokens    int
	KVUsedTokens     int
	KVCapacityTokens int
	// CacheHitRate is CachedTokens / PromptTokens over admitted requests.
	CacheHitRate float64

	PromptTokens, CachedTokens, GeneratedTokens int64
	Admitted, Finished, Rejected, Steps         int64
	// AdapterRequests counts the admitted requests that ran with an
	// adapter, AdapterLoads the adapters loaded for them (a request whose
	// adapter was resident loads none).
	AdapterRequests, AdapterLoads int64
}

type seq struct {
	Request
	arrived   time.Duration
	cached    int // prompt tokens found in the cache at admission
	prefilled int // prompt tokens in KV (cached + computed)
	generated int
	chunk     int  // prompt tokens prefilled in the current step
	decoding  bool // decodes a token in the current step
	slots     []int32
	private   int  // private blocks held
	loaded    bool // its adapter was loaded for it
}

// Engine is one replica's model.
type Engine struct {
	prof       Profile
	page       int
	chunk      int
	maxRunning int
	maxWaiting int
	tokenEvts  bool
	kv         *cache

	maxLoRAs int
	loraLoad time.Duration
	loras    []lora // resident adapters, least recently used first
	loads    int    // adapters loaded by the step being formed

	waiting []*seq // FCFS; waiting[wHead:] are queued
	wHead   int
	running []*seq // in admission order

	stepping bool
	stepEnd  time.Duration
	wake     time.Duration // when an idle engine with work starts its next step
	hasWake  bool

	g Gauges

	pool []*seq // seqs owned by a clone, reused by the next Clone into it
}

// New returns an idle engine with an empty cache.
func New(cfg Config) (*Engine, error) {
	p := cfg.Profile
	if cfg.KVCapacityTokens > 0 {
		p.KVCapacityTokens = cfg.KVCapacityTokens
	}
	if cfg.MaxRunning > 0 {
		p.MaxRunning = cfg.MaxRunning
	}
	if cfg.ChunkTokens > 0 {
		p.ChunkTokens = cfg.ChunkTokens
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	page := cfg.PageTokens
	if page == 0 {
		page = 512
	}
	if page < 0 || cfg.MaxWaiting < 0 || cfg.MaxLoRAs < 0 || cfg.LoRALoadTime < 0 {
		return nil, fmt.Errorf("engine config: page tokens, max waiting, max LoRAs and the LoRA load time must not be negative")
	}
	maxLoRAs := cfg.MaxLoRAs
	if maxLoRAs == 0 {
		maxLoRAs = DefaultMaxLoRAs
	}
	blocks := p.KVCapacityTokens / page
	if blocks < 1 {
		return nil, fmt.Errorf("engine config: KV capacity %d tokens is less than one %d-token page", p.KVCapacityTokens, page)
	}
	e := &Engine{
		prof:       p,
		page:       page,
		chunk:      p.ChunkTokens,
		maxRunning: p.MaxRunning,
		maxWaiting: cfg.MaxWaiting,
		tokenEvts:  cfg.TokenEvents,
		kv:         newCache(blocks),
		maxLoRAs:   maxLoRAs,
		loraLoad:   cfg.LoRALoadTime,
	}
	e.g.KVCapacityTokens = blocks * page
	return e, nil
}

// Profile returns the engine's effective profile (with Config overrides).
func (e *Engine) Profile() Profile { return e.prof }

// PageTokens returns the tokens per cache block.
func (e *Engine) PageTokens() int { return e.page }

// Submit queues a request arriving at now. now must not be earlier than the
// time of the last Advance.
func (e *Engine) Submit(now time.Duration, r Request) error {
	if err := e.Check(r); err != nil {
		return err
	}
	if e.maxWaiting > 0 && len(e.waiting)-e.wHead >= e.maxWaiting {
		e.g.Rejected++
		return ErrQueueFull
	}
	if r.OutputTokens < 1 {
		r.OutputTokens = 1
	}
	e.waiting = append(e.waiting, &seq{Request: r, arrived: now})
	e.g.WaitingTokens += r.PromptTokens
	if !e.stepping && !e.hasWake {
		e.wake, e.hasWake = now, true
	}
	return nil
}

// Check reports whether Submit would refuse r for what it is: invalid
// (ErrInvalid), or too large for the context or the KV cache
// (ErrTooLarge, counted as a refusal, as Submit counts it). Whether the
// waiting queue has room is not checked.
func (e *Engine) Check(r Request) error {
	if r.PromptTokens < 1 {
		return fmt.Errorf("%w: prompt of %d tokens", ErrInvalid, r.PromptTokens)
	}
	if want := (r.PromptTokens + e.page - 1) / e.page; len(r.Blocks) != want {
		return fmt.Errorf("%w: %d blocks for a %d-token prompt (want %d of %d tokens)", ErrInvalid, len(r.Blocks), r.PromptTokens, want, e.page)
	}
	out := max(r.OutputTokens, 1)
	// Compared without adding them first: an output of 2^63 tokens would
	// wrap the sum below the context.
	if r.PromptTokens > e.prof.MaxContextTokens || out > e.prof.MaxContextTokens-r.PromptTokens ||
		e.blocksFor(r.PromptTokens+out) > e.kv.capacity {
		e.g.Rejected++
		return fmt.Errorf("%w: %d prompt + %d output tokens (context %d, KV cache %d tokens)",
			ErrTooLarge, r.PromptTokens, out, e.prof.MaxContextTokens, e.g.KVCapacityTokens)
	}
	return nil
}

// Next returns the time of the engine's next event: the end of the running
// step, or the start of the next one. ok is false when the engine is idle
// with nothing queued.
func (e *Engine) Next() (t time.Duration, ok bool) {
	if e.stepping {
		return e.stepEnd, true
	}
	return e.wake, e.hasWake
}

// Advance runs the engine up to and including now, appending what happened
// to out. Steps run back to back while there is work.
func (e *Engine) Advance(now time.Duration, out []Event) []Event {
	for {
		if e.stepping {
			if e.stepEnd > now {
				return out
			}
			t := e.stepEnd
			e.stepping = false
			out = e.finishStep(t, out)
			if e.hasWork() {
				e.startStep(t)
			}
			continue
		}
		if !e.hasWake || e.wake > now {
			return out
		}
		e.hasWake = false
		if e.hasWork() {
			e.startStep(e.wake)
		}
	}
}

// Cancel removes a request wherever it is, freeing what it holds. It
// reports whether the request was found.
func (e *Engine) Cancel(id uint64) bool {
	defer func() {
		if !e.stepping && !e.hasWork() {
			e.hasWake = false // nothing left to wake up for
		}
	}()
	for i := e.wHead; i < len(e.waiting); i++ {
		if s := e.waiting[i]; s.ID == id {
			e.g.WaitingTokens -= s.PromptTokens
			copy(e.waiting[i:], e.waiting[i+1:])
			e.waiting[len(e.waiting)-1] = nil
			e.waiting = e.waiting[:len(e.waiting)-1]
			return true
		}
	}
	for i, s := range e.running {
		if s.ID == id {
			if s.chunk > 0 || s.decoding {
				// Its share of the running step's work is already paid for.
				s.chunk, s.decoding = 0, false
			}
			e.g.PrefillTokens -= s.PromptTokens - s.prefilled
			e.free(s)
			e.running = append(e.running[:i], e.running[i+1:]...)
			return true
		}
	}
	return false
}

// Gauges returns the engine's state now.
func (e *Engine) Gauges() Gauges {
	g := e.g
	g.Running = len(e.running)
	g.Waiting = len(e.waiting) - e.wHead
	g.KVUsedTokens = e.kv.used * e.page
	if g.PromptTokens > 0 {
		g.CacheHitRate = float64(g.CachedTokens) / float64(g.PromptTokens)
	}
	return g
}

// Flush empties the prefix cache, as SGLang's /flush_cache does, if the
// engine has no request running or waiting (it would still use its
// blocks); it reports whether it did.
func (e *Engine) Flush() bool {
	if e.hasWork() {
		return false
	}
	for e.kv.lruLen > 0 {
		e.kv.evict()
	}
	return true
}

// CachedBlocks returns how many leading blocks of a prompt the cache holds
// now.
func (e *Engine) CachedBlocks(blocks []uint64) int {
	n, _ := e.kv.match(blocks)
	return n
}

// CachedPrefix returns how many prompt tokens of a prompt with these blocks
// the cache holds now.
func (e *Engine) CachedPrefix(blocks []uint64, promptTokens int) int {
	n, _ := e.kv.match(blocks)
	return min(n*e.page, promptTokens)
}

func (e *Engine) blocksFor(tokens int) int { return (tokens + e.page - 1) / e.page }

func (e *Engine) hasWork() bool { return len(e.running) > 0 || len(e.waiting) > e.wHead }

// admit moves the waiting request at i into the running batch if the KV
// cache can hold its prompt and output, loading and pinning its adapter.
// The requests before it in the queue keep their order.
func (e *Engine) admit(i int) (*seq, bool) {
	s := e.waiting[i]
	m, idle := e.kv.match(s.Blocks)
	need := e.blocksFor(s.PromptTokens+s.OutputTokens) - m
	if need > e.kv.available()-idle {
		return nil, false
	}
	s.slots = e.kv.acquire(s.Blocks[:m], s.slots[:0])
	if !e.kv.reserve(need) {
		panic("engine: reserve failed after admission check")
	}
	s.private = need
	// An engine always computes at least the last prompt token.
	s.cached = min(m*e.page, s.PromptTokens-1)
	s.prefilled = s.cached
	if s.Adapter != 0 {
		s.loaded = e.useLoRA(s.Adapter)
	}

	if i > e.wHead { // skipped requests before it: shift them up one
		copy(e.waiting[e.wHead+1:i+1], e.waiting[e.wHead:i])
	}
	e.waiting[e.wHead] = nil
	e.wHead++
	if e.wHead > 64 && e.wHead*2 > len(e.waiting) {
		n := copy(e.waiting, e.waiting[e.wHead:])
		clear(e.waiting[n:])
		e.waiting = e.waiting[:n]
		e.wHead = 0
	}
	e.g.WaitingTokens -= s.PromptTokens
	e.g.PrefillTokens += s.PromptTokens - s.cached
	e.g.Admitted++
	e.g.PromptTokens += int64(s.PromptTokens)
	e.g.CachedTokens += int64(s.cached)
	return s, true
}

// startStep forms the batch of the step starting at t.
//
// Mixed (vLLM's scheduler): one decode token for every decoding sequence,
// then prefill chunks for partly prefilled sequences, then newly admitted
// ones, all within the token budget.
//
// Prefill-first (SGLang's default, without mixed chunks): if there is
// prefill work (a partly prefilled sequence, or a waiting request that can
// be admitted), the step prefills only, up to the budget, and the decoding
// sequences wait; otherwise every decoding sequence decodes one token.
func (e *Engine) startStep(t time.Duration) {
	for _, s := range e.running {
		s.chunk, s.decoding = 0, false
	}
	budget := e.chunk
	e.loads = 0
	var prefill, decodes, context int
	if e.prof.Schedule == SchedulePrefillFirst {
		if prefill, _ = e.schedulePrefill(budget); prefill == 0 {
			decodes, context, _ = e.scheduleDecodes(-1)
		}
	} else {
		decodes, context, budget = e.scheduleDecodes(budget)
		prefill, _ = e.schedulePrefill(budget)
	}
	e.stepping = true
	e.stepEnd = t + e.prof.StepTime(prefill, decodes, context) + time.Duration(e.loads)*e.loraLoad
	e.g.Steps++
}

// scheduleDecodes gives each decoding sequence one token of the budget
// (budget < 0: no limit) and returns the decodes, their context tokens and
// the budget left.
func (e *Engine) scheduleDecodes(budget int) (decodes, context, left int) {
	for _, s := range e.running {
		if s.prefilled == s.PromptTokens && budget != 0 {
			s.decoding = true
			decodes++
			context += s.PromptTokens + s.generated
			if budget > 0 {
				budget--
			}
		}
	}
	return decodes, context, budget
}

// schedulePrefill gives the budget to prefill chunks: partly prefilled
// sequences first, then waiting requests admitted in FCFS order. A
// waiting request whose adapter cannot be made resident (every slot pinned
// by the running batch) is skipped, keeping its place; one that does not
// fit in the KV cache stops admission. It returns the prefill tokens
// scheduled and the budget left.
func (e *Engine) schedulePrefill(budget int) (prefill, left int) {
	for _, s := range e.running {
		if s.prefilled < s.PromptTokens && budget > 0 {
			s.chunk = min(s.PromptTokens-s.prefilled, budget)
			budget -= s.chunk
			prefill += s.chunk
		}
	}
	skipped := 0 // waiting[wHead:wHead+skipped] wait for an adapter slot
	for budget > 0 && len(e.running) < e.maxRunning && len(e.waiting) > e.wHead+skipped {
		i := e.wHead + skipped
		if a := e.waiting[i].Adapter; a != 0 && !e.loraOK(a) {
			skipped++
			continue
		}
		s, ok := e.admit(i)
		if !ok {
			break
		}
		s.chunk = min(s.PromptTokens-s.prefilled, budget)
		budget -= s.chunk
		prefill += s.chunk
		e.running = append(e.running, s)
	}
	return prefill, budget
}

// finishStep applies the step that ended at t.
func (e *Engine) finishStep(t time.Duration, out []Event) []Event {
	kept := e.running[:0]
	for _, s := range e.running {
		switch {
		case s.chunk > 0:
			s.prefilled += s.chunk
			e.g.PrefillTokens -= s.chunk
			s.chunk = 0
			if s.prefilled == s.PromptTokens {
				e.commit(s)
				s.generated = 1
				e.g.GeneratedTokens++
				out = append(out, Event{Kind: EventFirstToken, ID: s.ID, Time: t, Generated: 1, CachedTokens: s.cached,
					OnAdapter: s.Adapter != 0, AdapterLoaded: s.loaded})
			}
		case s.decoding:
			s.decoding = false
			s.generated++
			e.g.GeneratedTokens++
			if e.tokenEvts {
				out = append(out, Event{Kind: EventToken, ID: s.ID, Time: t, Generated: s.generated, CachedTokens: s.cached})
			}
		}
		if s.generated >= s.OutputTokens {
			e.free(s)
			e.g.Finished++
			out = append(out, Event{Kind: EventFinish, ID: s.ID, Time: t, Generated: s.generated, CachedTokens: s.cached})
			continue
		}
		kept = append(kept, s)
	}
	clear(e.running[len(kept):])
	e.running = kept
	return out
}

// commit enters a freshly prefilled prompt's blocks into the prefix cache.
func (e *Engine) commit(s *seq) {
	for _, id := range s.Blocks[len(s.slots):] {
		s.slots = append(s.slots, e.kv.commit(id))
		s.private--
	}
}

// free gives back everything a running sequence holds.
func (e *Engine) free(s *seq) {
	e.kv.release(s.slots)
	e.kv.unreserve(s.private)
	s.slots, s.private = nil, 0
	if s.Adapter != 0 {
		e.unpinLoRA(s.Adapter)
	}
}

// Clone returns an independent copy of the engine, reusing dst's storage
// when dst is not nil. The copy shares the requests' Blocks slices, which
// neither modifies. A simulator uses it to ask "what if".
func (e *Engine) Clone(dst *Engine) *Engine {
	if dst == nil {
		dst = &Engine{}
	}
	kv, waiting, running, pool, loras := dst.kv, dst.waiting[:0], dst.running[:0], dst.pool[:0], dst.loras[:0]
	*dst = *e
	dst.kv = e.kv.cloneInto(kv)
	dst.pool = pool
	dst.loras = append(loras, e.loras...)
	copySeq := func(s *seq) *seq {
		var c *seq
		if k := len(dst.pool); k < cap(dst.pool) {
			dst.pool = dst.pool[:k+1]
			c = dst.pool[k]
		}
		if c == nil {
			c = new(seq)
			if k := len(dst.pool); k > 0 && dst.pool[k-1] == nil {
				dst.pool[k-1] = c
			} else {
				dst.pool = append(dst.pool, c)
			}
		}
		slots := c.slots[:0]
		*c = *s
		c.slots = append(slots, s.slots...)
		return c
	}
	for _, s := range e.waiting[e.wHead:] {
		waiting = append(waiting, copySeq(s))
	}
	dst.waiting, dst.wHead = waiting, 0
	for _, s := range e.running {
		running = append(running, copySeq(s))
	}
	dst.running = running
	return dst
}
