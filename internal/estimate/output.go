package estimate

import "sync"

// Outputs estimates how many tokens a request's answer will have from the
// answers that came before it: over all requests, and over the requests that
// share a key with it (its prompt's opening: the application whose system
// prompt it carries; its conversation). A key's mean is shrunk toward the
// broader estimate by OutputPrior requests' worth, so a key seen once moves
// the estimate a little and a key seen often stands for itself.
//
// Keys help only where they tell the length. Where answers do not depend on
// them, the keyed means wander around the global one, and an estimate made
// of them is worse than the global mean (and moves decisions for nothing).
// So Outputs scores, on every answer, what each depth of keys would have
// predicted (the global mean; shrunk toward the first key; toward both), and
// answers with the deepest whose recent squared error is clearly below the
// shallower ones' (by OutputEdge).
//
// It remembers at most capacity keys, forgetting the oldest first, so that
// clients inventing keys cannot grow it. It is safe for concurrent use.
type Outputs struct {
	mu     sync.Mutex
	global float64 // running mean over all requests
	keys   map[uint64]*outputMean
	order  []uint64 // keys in the order they came, a ring once full
	next   int      // the ring's oldest slot
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
	// OutputKeys is the default number of keys remembered.
	OutputKeys = 1 << 14
	// OutputScoreAlpha is the weight of an answer in each depth's squared
	// error (a memory of about 200 answers).
	OutputScoreAlpha = 0.005
	// OutputEdge is how much lower a deeper estimate's squared error must be
	// than each shallower one's for Expect to use it.
	OutputEdge = 0.95
)

// NewOutputs returns an estimator that expects prior tokens before it has
// seen an answer and remembers up to capacity keys (OutputKeys if 0).
func NewOutputs(prior float64, capacity int) *Outputs {
	if capacity <= 0 {
		capacity = OutputKeys
	}
	return &Outputs{global: prior, keys: make(map[uint64]*outputMean), order: make([]uint64, 0, capacity)}
}

// Observe records an answer of tokens tokens to a request with those keys,
// broadest first (0: none; at most two).
func (o *Outputs) Observe(tokens int, keys ...uint64) {
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
	for _, k := range keys {
		if k == 0 {
			continue
		}
		m := o.keys[k]
		if m == nil {
			m = o.add(k)
		}
		m.n++
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

// add remembers a new key, forgetting the oldest if full. Call with mu.
func (o *Outputs) add(k uint64) *outputMean {
	if len(o.order) < cap(o.order) {
		o.order = append(o.order, k)
	} else {
		delete(o.keys, o.order[o.next])
		o.order[o.next] = k
		o.next = (o.next + 1) % len(o.order)
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
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.global
	for _, k := range keys[:min(len(keys), o.depth)] {
		e = o.shrink(e, k)
	}
	return e
}

// Depth returns how many of a request's keys Expect uses now.
func (o *Outputs) Depth() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.depth
}

// Global returns the mean answer length over all requests.
func (o *Outputs) Global() float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.global
}

// Keys returns how many keys it remembers.
func (o *Outputs) Keys() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.keys)
}
