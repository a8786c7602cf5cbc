// Package admit is the router's flow control: what it does with a request
// the fleet cannot take now. Like the router, it reads no clock: times are
// arguments, so the simulator and the proxy share it.
//
// A request goes at once when the fleet can serve it within its TTFT SLO
// (its own, or the gate's): its best predicted TTFT (the router's, see
// router.Predict) is within the SLO; and, for work below Standard
// priority (batch, sheddable), some replica that can serve it has no more
// than SaturationWaiting requests waiting for their first token: the
// engines' own queues, as the router's ledger sees them. A fleet that
// cannot take a request is saturated for it; the request then waits in a
// bounded router-side queue, or is refused at once (HTTP 429 with
// Retry-After): in ModeReject, when it could not meet its SLO even on an
// idle replica, when it is sheddable (priority below 0), or when the queue
// is full and no one in it holds more than this request's tenant.
//
// The queue is flow control's: bands by priority, the highest first (a
// lower band gets what the fleet has left, and a request does not go
// ahead of waiting requests of its priority or above); within a band,
// tenants share by weighted deficit round robin counted in tokens (a
// tenant of weight w may send w × Quantum tokens a round); within a
// tenant, earliest deadline (arrival + SLO) first. Each time the fleet
// changes (Release), requests are dispatched in that order while the fleet
// can take them; a request that can no longer meet its deadline even on an
// idle replica leaves with a refusal. A full queue makes room by refusing
// the latest arrival of the tenant holding the most of its lowest band,
// for its weight (see evict).
package admit

import (
	"fmt"
	"math"
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

// Config configures flow control. The zero SLO turns it off for requests
// that bring no SLO of their own.
type Config struct {
	// SLO is the TTFT a request should get, from its arrival at the
	// router, unless its Class gives its own.
	SLO time.Duration
	// Mode is ModeQueue (the default) or ModeReject.
	Mode Mode
	// MaxQueue bounds the queue (default 1024 requests).
	MaxQueue int
	// SaturationWaiting says when the fleet is saturated for requests
	// below Standard priority (batch, sheddable), even those that would
	// meet their SLO: when every replica that could serve one has more
	// than SaturationWaiting requests waiting for their first token (in
	// its engine's queue or prefill). They then wait in the router-side
	// queue (sheddable ones are refused), and go only to a replica with no
	// more than that many waiting (policy.Request.WaitingCap), leaving the
	// engines' queues to the requests above them. Negative: such requests
	// are held only when they would miss their SLO, as the others are.
	// Validate leaves 0 as it is: no request waiting.
	SaturationWaiting int
	// Weights are the tenants' weights in fair shares (default 1; at
	// least MinWeight).
	Weights map[string]float64
	// Quantum is the tokens a tenant of weight 1 may send per round
	// (default 4096).
	Quantum int
}

// MinWeight is the least weight a tenant can have.
const MinWeight = 0.01

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
	for name, w := range c.Weights {
		if !(w >= MinWeight) || math.IsInf(w, 0) {
			return fmt.Errorf("admission: tenant %s's weight must be a finite number of at least %v, got %v", name, MinWeight, w)
		}
	}
	if c.Quantum == 0 {
		c.Quantum = 4096
	}
	if c.Quantum < 0 {
		return fmt.Errorf("admission: quantum must be positive, got %d", c.Quantum)
	}
	return nil
}

// WaitingCap is what flow control asks of the decision for a request of
// class c (policy.Request.WaitingCap): below Standard, under an SLO (its
// own or the gate's), with SaturationWaiting set, a replica with no more
// than SaturationWaiting requests waiting for their first token.
func (c *Config) WaitingCap(cl Class) int {
	if c.SLO <= 0 && cl.SLO <= 0 || cl.Priority >= Standard || c.SaturationWaiting < 0 {
		return 0
	}
	return c.SaturationWaiting + 1
}

// TTFTBudget is what is left at now of the TTFT SLO of a request of class
// cl that arrived at arrived (its own SLO, else the gate's), less the
// Headroom, in ms, for policy.Request.TTFTBudgetMS: the decision then keeps
// off the replicas forecast to miss it. Zero without an SLO or once it has
// passed.
func (c *Config) TTFTBudget(cl Class, arrived, now time.Duration) float64 {
	slo := c.SLOOf(cl)
	if slo <= 0 {
		return 0
	}
	return max((1-Headroom)*float64(arrived+slo-now)/1e6, 0)
}

// SLOOf is the TTFT SLO a request of class cl is held to: its class's,
// else the config's; zero for none.
func (c *Config) SLOOf(cl Class) time.Duration {
	if cl.SLO > 0 {
		return cl.SLO
	}
	return c.SLO
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
	// Reject: refuse it (429), for a Reason.
	Reject
)

// Reason says why a request was refused.
type Reason string

const (
	// ReasonSLO: it is predicted to miss its SLO (ModeReject), or would
	// miss it even on an idle replica.
	ReasonSLO Reason = "slo"
	// ReasonExpired: it waited in the queue and can no longer meet its
	// SLO.
	ReasonExpired Reason = "expired"
	// ReasonShed: it is sheddable and the fleet is saturated.
	ReasonShed Reason = "shed"
	// ReasonFull: the queue is full of requests of its priority or above.
	ReasonFull Reason = "queue_full"
	// ReasonEvicted: it waited and was pushed out of a full queue by a
	// request of a higher priority.
	ReasonEvicted Reason = "evicted"
)

// Prediction is the router's forecast of a request's TTFT now: Best on the
// replica where it is least, Floor what it would be there with no queue
// (round trip plus its own prefill); and Waiting, the fewest requests a
// replica that can serve it has waiting for their first token (in its
// engine's queue or prefill).
type Prediction struct {
	Best, Floor time.Duration
	Waiting     int
}

// Class is what flow control knows of a request besides its prediction.
type Class struct {
	// Tenant is whose request it is: the fairness id within a band.
	Tenant string
	// Priority orders the bands, higher first; below 0 the request is
	// sheddable.
	Priority int
	// Tokens is what the request costs in its tenant's fair share: its
	// prompt and expected completion tokens (at least 1 is counted).
	Tokens int
	// SLO is its own TTFT SLO (0: the gate's).
	SLO time.Duration
}

// Gate is flow control for one router. It is not safe for concurrent use.
type Gate[T any] struct {
	cfg   Config
	n     int        // requests waiting
	bands []*band[T] // highest priority first; none empty
	seq   uint64     // arrivals, to order equal deadlines
	pass  uint64     // Release calls, to mark tenants blocked in one
}

// New returns a gate; cfg must have passed Validate.
func New[T any](cfg Config) *Gate[T] { return &Gate[T]{cfg: cfg} }

// Config returns the gate's config.
func (g *Gate[T]) Config() Config { return g.cfg }

// Len returns how many requests wait.
func (g *Gate[T]) Len() int { return g.n }

// Headroom is the share of the time left before a request's TTFT deadline
// that its forecast must leave free for it to go. The forecast already
// carries the margin by which the replica's first tokens overran forecasts
// of its size (router.TailQuantile); the headroom covers what that margin
// cannot see: the decision takes the least of several forecasts, which
// errs low, and the fleet moves between the forecast and the engine. (On
// the Azure conversation trace at ten times its rate, a 3 s SLO: with the
// margin and 5%, 97.5–98.7% of the admitted requests meet it; with the
// margin alone, 94.5–97.9%; with a 10% headroom and no margin, 89–93%.
// docs/results.md, part 10.)
const Headroom = 0.05

// fits reports whether the fleet can take a request of priority prio with
// prediction p and wait left before its deadline, with Headroom to spare.
func (g *Gate[T]) fits(prio int, p Prediction, left time.Duration) bool {
	return float64(p.Best) <= (1-Headroom)*float64(left) && (prio >= Standard || g.cfg.SaturationWaiting < 0 || p.Waiting <= g.cfg.SaturationWaiting)
}

// Arrive decides for request v of class c arriving at now with prediction
// p: Go, Hold (v is queued: run Release soon, as requests of its priority
// or above may wait that could go now too), or Reject with the reason. A
// request that makes room in a full queue is handed to refuse with
// ReasonEvicted.
func (g *Gate[T]) Arrive(v T, c Class, now time.Duration, p Prediction, refuse func(T, Reason)) (Verdict, Reason) {
	slo := g.cfg.SLOOf(c)
	if slo <= 0 {
		return Go, ""
	}
	fits := g.fits(c.Priority, p, slo)
	switch {
	case fits && !g.waitingAtOrAbove(c.Priority):
		return Go, ""
	case p.Floor > slo:
		return Reject, ReasonSLO
	case !fits && c.Priority < 0:
		return Reject, ReasonShed
	case !fits && g.cfg.Mode == ModeReject:
		return Reject, ReasonSLO
	}
	if g.n >= g.cfg.MaxQueue {
		victim, ok := g.evict(c.Priority, c.Tenant, g.weight(c.Tenant))
		if !ok {
			return Reject, ReasonFull
		}
		refuse(victim, ReasonEvicted)
	}
	g.seq++
	g.bandOf(c.Priority).tenantOf(c.Tenant, g.weight(c.Tenant)).push(held[T]{v: v, deadline: now + slo, floor: p.Floor, cost: max(c.Tokens, 1), seq: g.seq})
	g.n++
	return Hold, ""
}

func (g *Gate[T]) weight(tenant string) float64 {
	if w, ok := g.cfg.Weights[tenant]; ok {
		return w
	}
	return 1
}

// Release goes through the queue at now: it refuses each request that can
// no longer meet its deadline, then dispatches in flow control's order
// (bands from the highest, tenants by deficit round robin, deadlines) what
// the fleet can take, asking predict just before each (the dispatches
// before it changed the fleet's backlog): a lower band gets what the
// higher ones left. A tenant whose head the fleet cannot take tries the
// few requests behind it, then waits; so does one whose head no replica
// can serve (predict reports false), without holding up the others. Its
// cost is a pass over the queue's deadlines plus a few predictions per
// tenant and two per request dispatched.
func (g *Gate[T]) Release(now time.Duration, predict func(T) (Prediction, bool), dispatch func(T), refuse func(T, Reason)) {
	if g.n == 0 {
		return
	}
	g.pass++
	g.expire(now, refuse)
	for _, b := range g.bands {
		g.releaseBand(b, now, predict, dispatch, refuse)
	}
	g.prune()
}

// releaseBand dispatches what the fleet can take of one band, its tenants
// in deficit round robin: a tenant's turn goes on while its deficit
// covers what it can send, and a tenant gets a new round's quantum only
// when it has a request the fleet can take now (waiting earns nothing). A
// tenant with nothing the fleet can take (no replica for its head, or no
// room for it or the few behind it) waits this time round.
func (g *Gate[T]) releaseBand(b *band[T], now time.Duration, predict func(T) (Prediction, bool), dispatch func(T), refuse func(T, Reason)) {
	blocked := 0 // tenants passed over this time round
	for len(b.ring) > blocked {
		b.next %= len(b.ring)
		t := b.ring[b.next]
		if t.blocked == g.pass {
			b.next++
			continue
		}
		i, expired := g.pick(b.priority, t, now, predict)
		switch {
		case expired:
			refuse(t.queue[0].v, ReasonExpired)
		case i < 0:
			t.blocked = g.pass
			blocked++
			b.next++
			continue
		case t.deficit < float64(t.queue[i].cost):
			t.deficit += t.weight * float64(g.cfg.Quantum)
			b.next++ // its turn ends: it sends on its next
			continue
		default:
			dispatch(t.queue[i].v)
			t.deficit -= float64(t.queue[i].cost)
		}
		t.remove(max(i, 0))
		g.n--
		if len(t.queue) == 0 {
			b.leave(b.next)
		}
	}
}

// pick is which of a tenant's requests the fleet can take now: the one
// with the earliest deadline that it can take, or -1 for none. expired
// says its head can no longer meet its deadline even on an idle replica.
//
// Whether a request fits depends mostly on how much time it has left, so
// under a backlog that outlasts the heads' deadlines the requests that fit
// are the latest ones: pick tries the head and the few behind it (a
// shorter prompt may fit), then the tail, and if the tail fits, searches
// between for the earliest that does. Without that, the heads that can no
// longer fit would hold the fleet idle until they expired, and the
// requests behind them would spend their time in the queue (on the Azure
// trace at ten times its rate, the queue's goodput was 40% below refusing
// at once).
func (g *Gate[T]) pick(prio int, t *tenant[T], now time.Duration, predict func(T) (Prediction, bool)) (int, bool) {
	h := t.queue[0]
	p, ok := predict(h.v)
	switch {
	case !ok:
		return -1, false
	case now+p.Floor > h.deadline:
		return 0, true
	}
	fits := func(i int) bool {
		h := t.queue[i]
		p, ok := predict(h.v)
		return ok && g.fits(prio, p, h.deadline-now)
	}
	if g.fits(prio, p, h.deadline-now) {
		return 0, false
	}
	near := min(len(t.queue), 1+lookahead)
	for i := 1; i < near; i++ {
		if fits(i) {
			return i, false
		}
	}
	last := len(t.queue) - 1
	if last < near || !fits(last) {
		return -1, false
	}
	// queue[near-1] does not fit and queue[last] does: the earliest that
	// fits, taking fitting to hold from some point on.
	lo, hi := near-1, last
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if fits(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, false
}

// lookahead is how many requests behind a tenant's head Release tries one
// by one when the head cannot go.
const lookahead = 8

// expire refuses every waiting request that can no longer meet its
// deadline even on an idle replica, by the floor it was predicted at its
// arrival (round trip and its own prefill change little meanwhile).
func (g *Gate[T]) expire(now time.Duration, refuse func(T, Reason)) {
	for _, b := range g.bands {
		for k := 0; k < len(b.ring); {
			t := b.ring[k]
			kept := t.queue[:0]
			for _, h := range t.queue {
				if now+h.floor > h.deadline {
					refuse(h.v, ReasonExpired)
					g.n--
					continue
				}
				kept = append(kept, h)
			}
			clear(t.queue[len(kept):])
			t.queue = kept
			if len(t.queue) == 0 {
				b.leave(k)
				continue
			}
			k++
		}
	}
}

// Drop removes v from the queue (its client went away); eq tells requests
// apart. It reports whether v was queued.
func (g *Gate[T]) Drop(eq func(T) bool) bool {
	for _, b := range g.bands {
		for k, t := range b.ring {
			for i, h := range t.queue {
				if eq(h.v) {
					t.remove(i)
					g.n--
					if len(t.queue) == 0 {
						b.leave(k)
					}
					g.prune()
					return true
				}
			}
		}
	}
	return false
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
	for _, b := range g.bands {
		for _, t := range b.ring {
			for _, h := range t.queue {
				refuse(h.v)
			}
		}
	}
	g.bands, g.n = nil, 0
}
