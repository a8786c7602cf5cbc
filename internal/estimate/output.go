package estimate

import "sync"

// Outputs estimates how many tokens a request's answer will have from the
// answers that came before it: over all requests, and over the requests that
// share a key with it (its conversation, its prompt's opening: the
// application whose system prompt it carries). A key's mean is shrunk toward
// the broader estimate by OutputPrior requests' worth, so a key seen once
// moves the estimate a little and a key seen often stands for itself; where
// answers do not depend on the key, the keyed means wander around the global
// one and the estimate stays close to it.
//
// It remembers at most capacity keys, forgetting the oldest first, so that
// clients inventing keys cannot grow it. It is safe for concurrent use.
type Outputs struct {
	mu     sync.Mutex
	global float64 // running mean over all requests
	keys   map[uint64]*outputMean
	order  []uint64 // keys in the order they came, a ring once full
	next   int      // the ring's oldest slot
}

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
)

// NewOutputs returns an estimator that expects prior tokens before it has
// seen an answer and remembers up to capacity keys (OutputKeys if 0).
func NewOutputs(prior float64, capacity int) *Outputs {
	if capacity <= 0 {
		capacity = OutputKeys
	}
	return &Outputs{global: prior, keys: make(map[uint64]*outputMean), order: make([]uint64, 0, capacity)}
}

// Observe records an answer of tokens tokens to a request with those keys
// (0: none).
func (o *Outputs) Observe(tokens int, keys ...uint64) {
	x := float64(tokens)
	o.mu.Lock()
	defer o.mu.Unlock()
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
// the global mean, shrunk toward each key's mean in turn.
func (o *Outputs) Expect(keys ...uint64) float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.global
	for _, k := range keys {
		if m := o.keys[k]; k != 0 && m != nil {
			n := float64(m.n)
			e = (n*m.mean + OutputPrior*e) / (n + OutputPrior)
		}
	}
	return e
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
