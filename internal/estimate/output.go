package estimate

import "sync"

// Outputs estimates how many tokens a request's answer will have from the
// answers that came before it: over all requests, and over the requests that
// share a key with it (its application; its conversation). A key's mean is shrunk toward the
// broader estimate by OutputPrior requests' worth, so a key seen once moves
// the estimate a little and a key seen often stands for itself.
//
// Keys help only where they tell the length. Where answers do not depend on
// them, the keyed means wander around the global one, and an estimate made
// of them is worse than the global mean (and moves decisions for nothing).
// So Outputs scores, on every answer, what each depth of keys would have
// predicted (the global mean; shrunk toward the first key; toward both),
// and answers with the deepest whose recent squared error is clearly below
// (by OutputEdge) that of the best shallower depth.
//
// It remembers at most capacity keys of each depth, so that clients
// inventing keys cannot grow it; when full it forgets the oldest key not
// used since the last time the search for one passed it (a second chance),
// so that an application's key, used by every request, is not pushed out by
// a stream of new conversations. It is safe for concurrent use.
type Outputs struct {
	mu     sync.Mutex
	global float64 // running mean over all requests
	keys   map[uint64]*outputMean
	// rings hold each depth's keys in the order they came (0: first keys,
	// 1: second), as rings once full.
	rings [maxOutputKeys]outputRing
	// mse is the recent squared error of each depth's predictions (0: the
	// global mean, 1: shrunk toward the first key, 2: toward both), and
	// depth the one Expect uses.
	mse   [maxOutputKeys + 1]float64
	depth int
}

// maxOutputKeys is how many keys a request has at most.
const maxOutputKeys = 2

type outputMean struct {
	mean float64
	n    int
	used bool // observed since the eviction hand last passed it
}

// outputRing is one depth's keys, oldest at hand once full.
type outputRing struct {
	keys []uint64
	hand int
}

// Output estimates' constants.
const (
	// OutputGlobalAlpha is the weight of an answer in the global mean (a
	// memory of about 50 requests).
	OutputGlobalAlpha = 0.02
	// OutputKeyMemory is how many of a key's latest answers its mean
	// remembers: a plain mean until then, a moving one after.
	OutputKeyMemory = 32
	// OutputPrior is how many requests' worth of weight the broader
	// estimate carries against a key's mean.
	OutputPrior = 4
	// OutputKeys is the default number of keys remembered of each depth.
	OutputKeys = 1 << 14
	// OutputScoreAlpha is the weight of an answer in each depth's squared
	// error (a memory of about 200 answers).
	OutputScoreAlpha = 0.005
	// OutputEdge is how much lower a deeper estimate's squared error must be
	// than the best shallower one's for Expect to use it.
	OutputEdge = 0.95
	// MaxOutputTokens is the longest answer Observe learns from: longer
	// than any model's context, so a longer one is a replica's or a
	// peer's bad report, not an answer. One such report (2^40 tokens)
	// would otherwise move the global mean by 2% of it, and the
	// expectation of the next few hundred requests with it.
	MaxOutputTokens = 1 << 20
)

// NewOutputs returns an estimator that expects prior tokens before it has
// seen an answer and remembers up to capacity keys of each depth
// (OutputKeys if 0).
func NewOutputs(prior float64, capacity int) *Outputs {
	if capacity <= 0 {
		capacity = OutputKeys
	}
	o := &Outputs{global: prior, keys: make(map[uint64]*outputMean)}
	for i := range o.rings {
		o.rings[i].keys = make([]uint64, 0, capacity)
	}
	return o
}

// Observe records an answer of tokens tokens to a request with those keys,
// broadest first (0: none; at most two). The keys of different depths must
// differ (the router seeds them apart). A length below 0 or above
// MaxOutputTokens is no answer's and is ignored: clamped, it would still
// move the means by far more than any true answer.
func (o *Outputs) Observe(tokens int, keys ...uint64) {
	if tokens < 0 || tokens > MaxOutputTokens {
		return
	}
	x := float64(tokens)
	keys = keys[:min(len(keys), maxOutputKeys)]
	o.mu.Lock()
	defer o.mu.Unlock()
	// Score each depth's prediction of this answer, before learning it.
	e := o.global
	for d := range o.mse {
		if d > 0 && d <= len(keys) {
			e = o.shrink(e, keys[d-1])
		}
		o.mse[d] += OutputScoreAlpha * ((x-e)*(x-e) - o.mse[d])
	}
	o.depth = 0
	for d := 1; d < len(o.mse); d++ {
		if o.mse[d] < OutputEdge*o.mse[o.depth] {
			o.depth = d
		}
	}
	o.global += OutputGlobalAlpha * (x - o.global)
	for i, k := range keys {
		if k == 0 {
			continue
		}
		m := o.keys[k]
		if m == nil {
			m = o.add(&o.rings[i], k)
		}
		m.n++
		m.used = true
		m.mean += (x - m.mean) / float64(min(m.n, OutputKeyMemory))
	}
}

// shrink moves the estimate e toward key k's mean, as far as k was seen.
// Call with mu.
func (o *Outputs) shrink(e float64, k uint64) float64 {
	m := o.keys[k]
	if k == 0 || m == nil {
		return e
	}
	n := float64(m.n)
	return (n*m.mean + OutputPrior*e) / (n + OutputPrior)
}

// add remembers a new key in ring r, forgetting one if r is full: from the
// hand on, the first key not used since the hand last passed it (each one
// passed loses its mark; a full turn finds one). Call with mu.
func (o *Outputs) add(r *outputRing, k uint64) *outputMean {
	if len(r.keys) < cap(r.keys) {
		r.keys = append(r.keys, k)
	} else {
		for {
			old := o.keys[r.keys[r.hand]]
			if !old.used {
				break
			}
			old.used = false
			r.hand = (r.hand + 1) % len(r.keys)
		}
		delete(o.keys, r.keys[r.hand])
		r.keys[r.hand] = k
		r.hand = (r.hand + 1) % len(r.keys)
	}
	m := &outputMean{}
	o.keys[k] = m
	return m
}

// Expect returns the answer length expected of a request with those keys,
// broadest first (an application, then a conversation within it; 0: none):
// the global mean, shrunk toward each key's mean in turn as deep as the keys
// have lately told answers' lengths better (see Outputs).
func (o *Outputs) Expect(keys ...uint64) float64 {
	e, _ := o.Estimate(keys...)
	return e
}

// Estimate returns Expect's answer and the global mean, read at one instant.
func (o *Outputs) Estimate(keys ...uint64) (expected, mean float64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.global
	for _, k := range keys[:min(len(keys), o.depth)] {
		e = o.shrink(e, k)
	}
	return e, o.global
}

// OutputState is an estimator's state, as an operator sees it.
type OutputState struct {
	// Mean is the running mean of all answers, in tokens.
	Mean float64
	// Depth is how many of a request's keys Expect uses now.
	Depth int
	// Keys is how many keys it remembers, of all depths.
	Keys int
}

// State returns the estimator's state, read at one instant.
func (o *Outputs) State() OutputState {
	o.mu.Lock()
	defer o.mu.Unlock()
	return OutputState{Mean: o.global, Depth: o.depth, Keys: len(o.keys)}
}
