package policy

import (
	"math/rand/v2"
	"sync/atomic"
)

// weighted holds a policy's weights, which SetWeights may change while it
// routes: the next decision uses them.
type weighted struct{ w atomic.Pointer[Weights] }

// Weights returns the weights the next decision uses.
func (p *weighted) Weights() Weights { return *p.w.Load() }

// SetWeights validates and sets the weights of the next decisions.
func (p *weighted) SetWeights(w Weights) error {
	if err := w.Validate(); err != nil {
		return err
	}
	p.w.Store(&w)
	return nil
}

// PaperWeights are the weights the paper's tuner learned on ART-Chat.
var PaperWeights = Weights{RTT: 0.276, Queue: 0.5}

// gorgo is the paper's cost, in units of prompt tokens:
//
//	w_rtt·rtt_ms + uncached_tokens + w_queue·queued_tokens
//
// where uncached is the prompt less the router's estimate of the replica's
// cached prefix and queued the prompt tokens the router sent there that
// have not finished. The replica of least cost wins; the router draws among
// replicas within its tie margin of the least cost (the reference
// implementation took the first, which herds traffic).
type gorgo struct{ weighted }

func newGorgo(o Options) (Policy, error) {
	w := o.Weights
	if w == (Weights{}) {
		w = PaperWeights
	}
	p := &gorgo{}
	return p, p.SetWeights(w)
}

func (*gorgo) Name() string { return "gorgo" }

func (p *gorgo) Decide(d *Decision, req *Request, reps []Replica, _ *rand.Rand) error {
	d.Scores = d.Scores[:0]
	w := p.w.Load()
	for i := range reps {
		r := &reps[i]
		t := Terms{
			RTT:     w.RTT * ms(r),
			Prefill: float64(max(req.PromptTokens-r.CachedTokens, 0)),
			Queue:   w.Queue * float64(r.UnfinishedTokens),
		}
		t.Total = t.RTT + t.Prefill + t.Queue
		d.Scores = append(d.Scores, t)
	}
	d.Replica = ByScore
	return nil
}

// gorgoMS is gorgo's decision in milliseconds, for fleets of unequal
// hardware: each replica's uncached and queued tokens are priced at its own
// rates,
//
//	w_rtt·rtt_ms + uncached·prefill_ms_per_token + w_queue·queued·queue_ms_per_token
//
// Its queue is the replica's prefill backlog (uncached prompt tokens sent
// there that have not produced a first token), not the paper's unfinished
// prompt tokens: a request that is decoding barely delays a new one's first
// token, one still waiting for its prefill delays it by all of it.
type gorgoMS struct{ weighted }

func newGorgoMS(o Options) (Policy, error) {
	w := o.MSWeights
	if w == (Weights{}) {
		w = Weights{RTT: 1, Queue: 1}
	}
	p := &gorgoMS{}
	return p, p.SetWeights(w)
}

func (*gorgoMS) Name() string { return "gorgo-ms" }

func (p *gorgoMS) Decide(d *Decision, req *Request, reps []Replica, _ *rand.Rand) error {
	d.Scores = d.Scores[:0]
	w := p.w.Load()
	for i := range reps {
		r := &reps[i]
		t := Terms{
			RTT:     w.RTT * ms(r),
			Prefill: float64(max(req.PromptTokens-r.CachedTokens, 0)) * r.PrefillMSPerToken,
			Queue:   w.Queue * float64(r.BacklogTokens) * r.QueueMSPerToken,
		}
		t.Total = t.RTT + t.Prefill + t.Queue
		d.Scores = append(d.Scores, t)
	}
	d.Replica = ByScore
	return nil
}

func ms(r *Replica) float64 { return float64(r.RTT) / 1e6 }

// DefaultE2EWeights are gorgo-e2e's weights when none are given: chosen on
// the embedded workload and the Mooncake trace, checked on the chat and
// agent presets and on unequal hardware (docs/results.md, part 6).
var DefaultE2EWeights = Weights{RTT: 1, Queue: 1, Decode: 0.2, ITL: 0.2}

// gorgoE2E prices, in ms, both what a request will wait for its first
// token and what its decode will cost, the others' and its own:
//
//	ttft  = w_rtt·rtt + uncached·prefill_ms + w_queue·backlog·queue_ms   (gorgo-ms)
//	stall = decoding·uncached·prefill_ms   its prefill stalls the requests decoding there
//	own   = E·(base + slope·(n+1))         its decode: E tokens at the ITL it will see
//	cost  = ttft + w_decode·stall + w_itl·own
//
// decoding is how many of the router's requests at the replica are past
// their first token, n how many are in flight, E the router's estimate of
// the output length (Request.ExpectedOutputTokens), base and slope the
// replica's inter-token latency model, learned from the token gaps the
// router observes (Replica.ITLBaseMS, ITLSlopeMS).
//
// Where gorgo-ms piles requests on the nearest replica, whose decodes then
// crawl, the stall term pushes back: while an engine prefills a prompt
// (SGLang's prefill-first scheduler) or shares its steps with the prefill
// (vLLM's mixed one), every sequence decoding there waits about as long,
// so sending a long uncached prompt to a replica with many requests
// decoding costs them all. That is what makes a crowded replica's ITL
// grow; the batch itself adds little per sequence (20 µs to a 9 ms step
// on the paper's engine). The own term prices the request's decode at the
// ITL it will see: on unequal hardware it keeps long answers off slow
// replicas.
type gorgoE2E struct{ weighted }

func newGorgoE2E(o Options) (Policy, error) {
	w := o.E2EWeights
	if w == (Weights{}) {
		w = DefaultE2EWeights
	}
	p := &gorgoE2E{}
	return p, p.SetWeights(w)
}

func (*gorgoE2E) Name() string { return DefaultName }

func (p *gorgoE2E) Decide(d *Decision, req *Request, reps []Replica, _ *rand.Rand) error {
	d.Scores = d.Scores[:0]
	w := p.w.Load()
	e := float64(req.ExpectedOutputTokens)
	for i := range reps {
		r := &reps[i]
		prefill := float64(max(req.PromptTokens-r.CachedTokens, 0)) * r.PrefillMSPerToken
		t := Terms{
			RTT:     w.RTT * ms(r),
			Prefill: prefill,
			Queue:   w.Queue * float64(r.BacklogTokens) * r.QueueMSPerToken,
			Decode: w.Decode*float64(r.Decoding)*prefill +
				w.ITL*e*(r.ITLBaseMS+r.ITLSlopeMS*float64(r.InFlight+1)),
		}
		t.Total = t.RTT + t.Prefill + t.Queue + t.Decode
		d.Scores = append(d.Scores, t)
	}
	d.Replica = ByScore
	return nil
}
