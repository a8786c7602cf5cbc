// Package admit decides what a router does with a request it cannot serve
// within its TTFT SLO: hold it in a bounded router-side queue until the
// fleet can, or refuse it at once (HTTP 429 with Retry-After), instead of
// letting it wait in an engine's queue for minutes. Like the router, it
// reads no clock: times are arguments, so the simulator and the proxy
// share it.
//
// The rule: a request whose best predicted TTFT (the router's, see
// router.Predict) is within the SLO goes now. Otherwise, in ModeReject it
// is refused; in ModeQueue it waits, and each time the fleet's state
// changes the queue is released in order of predicted TTFT, least first
// (the work most likely to meet its SLO goes first), as long as the
// request at the head can still meet its deadline (arrival + SLO). A
// request that could not meet it even on an idle replica (its floor: round
// trip plus its own prefill) is refused, and so is one that finds the
// queue full.
package admit

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Mode is what happens to a request predicted to miss its SLO.
type Mode string

const (
	// ModeQueue holds it in the router-side queue.
	ModeQueue Mode = "queue"
	// ModeReject refuses it at once.
	ModeReject Mode = "reject"
)

// Config configures admission. The zero SLO turns admission off.
type Config struct {
	// SLO is the TTFT a request should get, from its arrival at the router.
	SLO time.Duration
	// Mode is ModeQueue (the default) or ModeReject.
	Mode Mode
	// MaxQueue bounds the queue (default 1024 requests).
	MaxQueue int
}

// Validate reports a config that cannot work, and fills the defaults.
func (c *Config) Validate() error {
	if c.SLO < 0 {
		return fmt.Errorf("admission: ttft_slo must not be negative, got %v", c.SLO)
	}
	if c.Mode == "" {
		c.Mode = ModeQueue
	}
	if c.Mode != ModeQueue && c.Mode != ModeReject {
		return fmt.Errorf("admission: mode must be %s or %s, got %q", ModeQueue, ModeReject, c.Mode)
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = 1024
	}
	if c.MaxQueue < 0 {
		return fmt.Errorf("admission: max_queue must be positive, got %d", c.MaxQueue)
	}
	return nil
}

// ParseMode reads a mode name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case ModeQueue, ModeReject:
		return m, nil
	}
	return "", fmt.Errorf("admission mode must be queue or reject, got %q", s)
}

// Verdict is admission's answer for one request.
type Verdict int

const (
	// Go: dispatch now.
	Go Verdict = iota
	// Hold: the request is in the queue.
	Hold
	// Reject: refuse it (429).
	Reject
)

// Prediction is the router's forecast of a request's TTFT now: Best on the
// replica where it is least, Floor what it would be there with no queue
// (round trip plus its own prefill).
type Prediction struct {
	Best, Floor time.Duration
}

// Gate is admission for one router. It is not safe for concurrent use.
type Gate[T any] struct {
	cfg   Config
	queue []held[T] // in order of arrival
	cand  []cand    // Release's scratch
}

type held[T any] struct {
	v        T
	deadline time.Duration
	sent     bool
}

// cand is a queued request that can meet its deadline now.
type cand struct {
	at   int
	best time.Duration
}

// New returns a gate; cfg must have passed Validate.
func New[T any](cfg Config) *Gate[T] { return &Gate[T]{cfg: cfg} }

// Config returns the gate's config.
func (g *Gate[T]) Config() Config { return g.cfg }

// Len returns how many requests wait.
func (g *Gate[T]) Len() int { return len(g.queue) }

// Arrive decides for request v arriving at now with prediction p: Go
// when it is predicted to meet its SLO, else Hold (v is queued) or Reject.
// A request that can meet its SLO goes ahead of those waiting, which could
// not meet theirs now: the queue's order is least predicted TTFT first.
func (g *Gate[T]) Arrive(v T, now time.Duration, p Prediction) Verdict {
	switch {
	case g.cfg.SLO <= 0 || p.Best <= g.cfg.SLO:
		return Go
	case g.cfg.Mode == ModeReject || p.Floor > g.cfg.SLO || len(g.queue) >= g.cfg.MaxQueue:
		return Reject
	}
	g.queue = append(g.queue, held[T]{v: v, deadline: now + g.cfg.SLO})
	return Hold
}

// Release goes through the queue at now: it refuses each request that
// can no longer meet its deadline even on an idle replica, and dispatches
// the others that can meet it now, least predicted TTFT first, asking
// predict again just before each (the dispatches before it changed the
// fleet's backlog). predict reports false when no replica is available;
// then nothing is released. Its cost is one prediction per request
// waiting plus one per request dispatched.
func (g *Gate[T]) Release(now time.Duration, predict func(T) (Prediction, bool), dispatch, refuse func(T)) {
	if len(g.queue) == 0 {
		return
	}
	g.cand = g.cand[:0]
	kept := g.queue[:0]
	for _, h := range g.queue {
		p, ok := predict(h.v)
		switch {
		case !ok && now > h.deadline:
			refuse(h.v) // no replica, and too late anyway
			continue
		case !ok:
			kept = append(kept, h) // no replica now: it waits
			continue
		case now+p.Floor > h.deadline:
			refuse(h.v)
			continue
		}
		kept = append(kept, h)
		if now+p.Best <= h.deadline {
			g.cand = append(g.cand, cand{at: len(kept) - 1, best: p.Best})
		}
	}
	clear(g.queue[len(kept):])
	g.queue = kept
	if len(g.cand) == 0 {
		return
	}
	slices.SortStableFunc(g.cand, func(a, b cand) int { return cmp.Compare(a.best, b.best) })
	sent := 0
	for _, c := range g.cand {
		h := &g.queue[c.at]
		if p, ok := predict(h.v); ok && now+p.Best <= h.deadline {
			dispatch(h.v)
			h.sent = true
			sent++
		}
	}
	if sent > 0 {
		kept := g.queue[:0]
		for _, h := range g.queue {
			if !h.sent {
				kept = append(kept, h)
			}
		}
		clear(g.queue[len(kept):])
		g.queue = kept
	}
}

// Drop removes v from the queue (its client went away); eq tells requests
// apart. It reports whether v was queued.
func (g *Gate[T]) Drop(eq func(T) bool) bool {
	for k := range g.queue {
		if eq(g.queue[k].v) {
			g.remove(k)
			return true
		}
	}
	return false
}

// remove deletes queue[k], keeping the order of arrival of the rest.
func (g *Gate[T]) remove(k int) {
	copy(g.queue[k:], g.queue[k+1:])
	var zero held[T]
	g.queue[len(g.queue)-1] = zero
	g.queue = g.queue[:len(g.queue)-1]
}

// RetryAfter is how long a refused client should wait before trying again:
// how far the prediction overshoots the SLO, at least a second, in whole
// seconds (HTTP's Retry-After).
func RetryAfter(p Prediction, slo time.Duration) int {
	over := p.Best - slo
	return max(1, int(math.Ceil(over.Seconds())))
}

// Flush refuses every queued request (the router is shutting down).
func (g *Gate[T]) Flush(refuse func(T)) {
	for _, h := range g.queue {
		refuse(h.v)
	}
	clear(g.queue)
	g.queue = g.queue[:0]
}
