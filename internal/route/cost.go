package route

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
