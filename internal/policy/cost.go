package policy

import "math/rand/v2"

// PaperWeights are the weights the paper's tuner learned on ART-Chat.
var PaperWeights = Weights{RTT: 0.276, Queue: 0.5}

// paperSearch is the paper's search for gorgo's weights: its bounds and
// start, which the tuner uses for gorgo and gorgo-ms.
func paperSearch(name string, def float64) Param {
	switch name {
	case "rtt":
		return Param{Name: name, Default: def, Tune: true, Min: 0.05, Max: 2, Init: 0.5}
	default:
		return Param{Name: name, Default: def, Tune: true, Min: 0.05, Max: 0.5, Init: 0.1}
	}
}

func init() {
	d := DefaultE2EWeights
	for _, i := range []Info{
		{Name: "gorgo", New: newGorgo, ConfigKey: "weights", Rank: 1,
			Params: []Param{paperSearch("rtt", PaperWeights.RTT), paperSearch("queue", PaperWeights.Queue)}},
		{Name: "gorgo-ms", New: newGorgoMS, ConfigKey: "ms_weights", Rank: 2,
			Params: []Param{paperSearch("rtt", 1), paperSearch("queue", 1)}},
		// The default policy's TTFT terms keep gorgo-ms's weights; the
		// tuner varies its decode weights around their defaults.
		{Name: DefaultName, New: newGorgoE2E, ConfigKey: "e2e_weights", Rank: 3, Params: []Param{
			{Name: "rtt", Default: d.RTT, Min: 0.05, Max: 2, Init: d.RTT},
			{Name: "queue", Default: d.Queue, Min: 0.05, Max: 2, Init: d.Queue},
			{Name: "decode", Default: d.Decode, Tune: true, Min: d.Decode / 10, Max: d.Decode * 10, Init: d.Decode},
			{Name: "itl", Default: d.ITL, Tune: true, Min: d.ITL / 10, Max: d.ITL * 10, Init: d.ITL},
		}},
	} {
		Register(i)
	}
}

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
	p := &gorgo{}
	return p, p.init("gorgo", o.Params)
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
			// An adapter's load is priced as the RTT is: w_rtt turns ms
			// into the cost's units.
			Adapter: w.RTT * r.AdapterMS,
		}
		t.Total = t.RTT + t.Prefill + t.Queue + t.Adapter
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
	p := &gorgoMS{}
	return p, p.init("gorgo-ms", o.Params)
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
			Adapter: r.AdapterMS,
		}
		t.Total = t.RTT + t.Prefill + t.Queue + t.Adapter
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
//	ttft  = w_rtt·rtt + uncached·prefill_ms + w_queue·(backlog·queue_ms + memory)
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
// memory is the wait for room in the replica's KV cache (kvWait): zero
// while the requests in flight there and this one fit, so that without
// decode weights, and with room, the policy is gorgo-ms.
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
	p := &gorgoE2E{}
	return p, p.init(DefaultName, o.Params)
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
				w.ITL*e*(r.ITLBaseMS+r.ITLSlopeMS*float64(r.InFlight+req.Sequences())),
			Adapter: r.AdapterMS,
		}
		t.Queue += w.Queue * kvWait(r, req)
		t.Total = t.RTT + t.Prefill + t.Queue + t.Decode + t.Adapter
		d.Scores = append(d.Scores, t)
	}
	d.Replica = ByScore
	return nil
}

// kvWait is how long (ms) req would wait at r for room in its KV cache.
// An engine whose cache is full queues requests behind memory, not behind
// prefill: the backlog term, priced at prefill speed, cannot see it. The
// requests in flight hold their prompts and the outputs decoded so far
// (half the mean answer each, on average, for those decoding); req needs
// its uncached prompt and its expected output (for each of its answers:
// they share the prompt). What does not fit waits for
// sequences to finish, and a sequence lives about a mean answer's tokens at
// the ITL it sees there, so the resident tokens free at resident/life per
// ms. The others are priced at the mean answer, not at req's: how soon
// memory frees does not depend on what req will say.
//
// Zero when the capacity is unknown, and for a request that would not fit
// an empty cache (an engine refuses it anywhere). Prompts in flight that
// share a cached prefix are each counted whole (the router does not know
// which blocks they share), so where many share a long one the wait starts
// early. Only this router's requests (and its mesh peers') are counted.
func kvWait(r *Replica, req *Request) float64 {
	c := float64(r.KVCapacityTokens)
	if c <= 0 {
		return 0
	}
	mean := float64(req.MeanOutputTokens)
	if mean <= 0 {
		mean = float64(req.ExpectedOutputTokens)
	}
	resident := float64(r.UnfinishedTokens) + float64(r.Decoding)*mean/2
	deficit := resident + float64(max(req.PromptTokens-r.CachedTokens, 0)) + float64(req.ExpectedOutputTokens*req.Sequences()) - c
	if deficit <= 0 || resident <= 0 {
		return 0
	}
	life := mean * (r.ITLBaseMS + r.ITLSlopeMS*float64(r.InFlight+req.Sequences()))
	return deficit * life / resident
}
