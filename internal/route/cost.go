package route

import (
	"math"
	"math/rand/v2"
)

// PaperWeights are the weights the paper's tuner learned on ART-Chat.
var PaperWeights = Weights{RTT: 0.276, Queue: 0.5}

// gorgo is the paper's cost, in units of prompt tokens:
//
//	w_rtt·rtt_ms + uncached_tokens + w_queue·queued_tokens
//
// where uncached is the prompt less the router's estimate of the replica's
// cached prefix and queued the prompt tokens the router sent there that
// have not finished. The replica of least cost wins; replicas within the tie
// margin of the least cost are tied and one is drawn at random (the
// reference implementation took the first, which herds traffic).
type gorgo struct {
	w      Weights
	margin float64
}

func newGorgo(o Options) (Policy, error) {
	w := o.Weights
	if w == (Weights{}) {
		w = PaperWeights
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	return &gorgo{w: w, margin: o.tieMargin()}, nil
}

func (*gorgo) Name() string { return "gorgo" }

func (p *gorgo) Decide(d *Decision, req *Request, reps []Replica, rng *rand.Rand) error {
	d.Scores = d.Scores[:0]
	for i := range reps {
		r := &reps[i]
		t := Terms{
			RTT:     p.w.RTT * ms(r),
			Prefill: float64(max(req.PromptTokens-r.CachedTokens, 0)),
			Queue:   p.w.Queue * float64(r.UnfinishedTokens),
		}
		t.Total = t.RTT + t.Prefill + t.Queue
		d.Scores = append(d.Scores, t)
	}
	return pickMin(d, reps, p.margin, rng)
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
type gorgoMS struct {
	w      Weights
	margin float64
}

func newGorgoMS(o Options) (Policy, error) {
	w := o.MSWeights
	if w == (Weights{}) {
		w = Weights{RTT: 1, Queue: 1}
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	return &gorgoMS{w: w, margin: o.tieMargin()}, nil
}

func (*gorgoMS) Name() string { return "gorgo-ms" }

func (p *gorgoMS) Decide(d *Decision, req *Request, reps []Replica, rng *rand.Rand) error {
	d.Scores = d.Scores[:0]
	for i := range reps {
		r := &reps[i]
		t := Terms{
			RTT:     p.w.RTT * ms(r),
			Prefill: float64(max(req.PromptTokens-r.CachedTokens, 0)) * r.PrefillMSPerToken,
			Queue:   p.w.Queue * float64(r.BacklogTokens) * r.QueueMSPerToken,
		}
		t.Total = t.RTT + t.Prefill + t.Queue
		d.Scores = append(d.Scores, t)
	}
	return pickMin(d, reps, p.margin, rng)
}

func ms(r *Replica) float64 { return float64(r.RTT) / 1e6 }

// pickMin chooses among the healthy replicas whose total cost is within
// margin (relative) of the least, uniformly at random.
func pickMin(d *Decision, reps []Replica, margin float64, rng *rand.Rand) error {
	best := math.Inf(1)
	for i := range reps {
		if reps[i].Healthy && d.Scores[i].Total < best {
			best = d.Scores[i].Total
		}
	}
	if math.IsInf(best, 1) {
		return ErrNoReplica
	}
	limit := best + margin*math.Abs(best)
	chosen, n := -1, 0
	for i := range reps {
		if reps[i].Healthy && d.Scores[i].Total <= limit {
			n++
			if rng.IntN(n) == 0 {
				chosen = i
			}
		}
	}
	d.Replica = chosen
	return nil
}
