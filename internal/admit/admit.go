// Package admit is the router's flow control: what it does with a request
// the fleet cannot take now. Like the router, it reads no clock: times are
// arguments, so the simulator and the proxy share it.
//
// A request goes at once when the fleet can serve it within its TTFT SLO
// (its own, or the gate's): its best predicted TTFT (the router's, see
// router.Predict) is within the SLO; and, for work below Standard
// priority (batch, sheddable), some replica that can serve it has no more
// than SaturationWaiting requests waiting for their first token: the
// engines' own queues, as the router's ledger sees them; and it leaves the
// room that the recent arrivals of the bands above it, and of the other
// tenants of its band, need (see roomFor: a lower band or a laxer tenant
// does not fill the engines' queues so deep that the others' next requests
// could not meet their SLOs). A fleet that cannot take a request is
// saturated for it; the request then waits in a bounded router-side queue,
// or is refused at once (HTTP 429 with Retry-After): in ModeReject, when it
// is predicted to miss its SLO, when it could not meet its SLO even on an
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
// can take them; a head that waits only for the fleet's load to fall holds
// back what comes after it in that order (see Release); a request that can
// no longer meet its deadline even on an idle replica leaves with a
// refusal. A full queue makes room by refusing the latest arrival of the
// tenant holding the most of its lowest band, for its weight (see evict).
package admit

import (
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
	// ReasonSLO: it is predicted to miss its SLO (ModeReject).
	ReasonSLO Reason = "slo"
	// ReasonUnattainable: it would miss its SLO even on an idle replica
	// (its own round trip and prefill are longer): waiting or retrying
	// cannot help.
	ReasonUnattainable Reason = "unattainable"
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
	bands []*band[T] // highest priority first; each with tenants waiting or remembered
	seq   uint64     // arrivals, to order equal deadlines
	pass  uint64     // Release calls, to mark tenants blocked in one
	// forgot is when Arrive last forgot old reservations.
	forgot time.Duration
	epoch  uint64 // Release calls and changes to the queue in them (see short)
}

// New returns a gate; cfg must have passed Validate.
func New[T any](cfg Config) *Gate[T] { return &Gate[T]{cfg: cfg} }

// Config returns the gate's config.
func (g *Gate[T]) Config() Config { return g.cfg }

// SetWeights makes w the tenants' weights in fair shares from now on (a
// reload's; each at least MinWeight, as Validate checks them): the
// requests waiting keep their places, their tenants' turns weighed anew,
// those with requests waiting and those remembered alike.
func (g *Gate[T]) SetWeights(w map[string]float64) {
	g.cfg.Weights = w
	for _, b := range g.bands {
		for _, t := range b.ring {
			t.weight = g.weight(t.name)
		}
		for _, t := range b.gone {
			t.weight = g.weight(t.name)
		}
	}
}

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
// prediction p and wait left before its deadline, with Headroom to spare,
// leaving room for others (see roomFor).
func (g *Gate[T]) fits(prio int, p Prediction, left, room time.Duration) bool {
	return g.meets(prio, p, left) && roomy(p, room)
}

// roomy reports whether a request with prediction p leaves the others
// room: its forecast is within room, or at most twice its own floor (the
// fleet about as free as it gets for it).
func roomy(p Prediction, room time.Duration) bool {
	return p.Best <= room || p.Best <= 2*p.Floor
}

// meets reports whether a request of priority prio with prediction p
// would meet its deadline, wait left away, with Headroom to spare (and,
// below Standard, find a replica not saturated).
func (g *Gate[T]) meets(prio int, p Prediction, left time.Duration) bool {
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
	if now-g.forgot >= time.Second {
		// Release forgets old reservations only while requests wait: an
		// idle queue forgets them here, or the bands of every priority
		// asked for would stay, and roomFor walk them all.
		g.forget(now)
		g.forgot = now
	}
	meets := g.meets(c.Priority, p, slo)
	fits := meets && roomy(p, g.roomFor(c.Priority, c.Tenant, now))
	switch {
	case fits && !g.waitingAtOrAbove(c.Priority):
		g.note(c, slo, p.Floor, now, nil)
		return Go, ""
	case p.Floor > slo:
		return Reject, ReasonUnattainable
	case !fits && c.Priority < 0:
		return Reject, ReasonShed
	case !meets && g.cfg.Mode == ModeReject:
		return Reject, ReasonSLO
	}
	if g.n >= g.cfg.MaxQueue {
		victim, ok := g.evict(c.Priority, c.Tenant, g.weight(c.Tenant))
		if !ok {
			return Reject, ReasonFull
		}
		refuse(victim, ReasonEvicted)
	}
	t := g.bandOf(c.Priority).tenantOf(c.Tenant, g.weight(c.Tenant), max(c.Tokens, 1))
	g.note(c, slo, p.Floor, now, t)
	g.seq++
	t.push(held[T]{v: v, deadline: now + slo, floor: p.Floor, cost: max(c.Tokens, 1), seq: g.seq})
	g.n++
	return Hold, ""
}

// ReserveFor is how long a tenant's last arrival keeps room for its next
// (see note) after it.
const ReserveFor = time.Minute

// note notes an arrival of class c, held to slo, whose floor is floor,
// queued in t (nil: it went at once, and its band remembers its tenant).
// Its tenant's next request, if like its recent ones, will need room: the
// fleet's forecast, when it arrives, must be at most (1 − Headroom) × its
// SLO less its floor, the floors of the tenant's arrivals averaged (a
// fifth of the way to each new one: one long prompt, whose floor nearly
// fills its SLO, must not hold the fleet's queues near empty for
// ReserveFor). Until ReserveFor has passed, the bands below, and the
// other tenants of its band, leave it that room (see roomFor). A request
// that could not meet its SLO even on an idle replica reserves nothing.
func (g *Gate[T]) note(c Class, slo, floor, now time.Duration, t *tenant[T]) {
	if t == nil {
		b := g.bandOf(c.Priority)
		if t = b.recall(c.Tenant); t == nil {
			t = &tenant[T]{name: c.Tenant, weight: g.weight(c.Tenant)}
		}
		b.remember(t)
	}
	if t.last == 0 && t.floor == 0 {
		t.floor = floor
	} else {
		t.floor += (floor - t.floor) / 5
	}
	t.room = time.Duration((1-Headroom)*float64(slo)) - t.floor
	if t.room <= 0 {
		t.room = time.Duration(math.MaxInt64)
	}
	t.last = now
}

// roomFor is how far a request of the named tenant, at priority prio, may
// push the fleet's forecast: the least room that the recent arrivals of
// the bands above it need, and of the other tenants of its band, whether
// requests of theirs wait or not. A band does not fill the engines' queues
// so deep that the work above it, arriving next, could not meet its SLO;
// and a tenant not so deep that another's next request, needing more room
// (a tighter SLO, a longer prompt), could not: who goes first is still
// flow control's order. No limit without any; and a request whose forecast
// is at most twice its floor (the fleet about as free as it gets for it)
// is not held to it (see fits).
func (g *Gate[T]) roomFor(prio int, name string, now time.Duration) time.Duration {
	room := time.Duration(math.MaxInt64)
	for _, b := range g.bands { // highest first
		switch {
		case b.priority > prio:
			room = min(room, b.room(now, ""))
		case b.priority == prio:
			room = min(room, b.room(now, name))
		default:
			return room
		}
	}
	return room
}

// room is the least room the band's tenants other than the named one need
// (see Gate.note), of those that arrived within ReserveFor of now.
func (b *band[T]) room(now time.Duration, name string) time.Duration {
	room := time.Duration(math.MaxInt64)
	for _, ts := range [][]*tenant[T]{b.ring, b.gone} {
		for _, u := range ts {
			if u.name != name && now-u.last <= ReserveFor {
				room = min(room, u.room)
			}
		}
	}
	return room
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
// before it changed the fleet's backlog).
//
// A head the fleet cannot take now but could on an emptier fleet (it waits
// for load) holds back what comes after it in that order: the bands below
// and, once its tenant's deficit covers it, the tenants after it in the
// round, so that it goes first when the fleet frees (a lower band gets
// only what the higher ones leave, a tenant its share whatever its
// requests need). It holds them only if they compete with it for
// replicas: until that is known, they go on, and after each request they
// send the held heads are predicted again; one whose forecast worsened
// stops the release there, and its tenant then holds the others at once
// for Reprobe. A head the fleet could not take even idle (no replica
// serves it: predict reports false; or it cannot meet its deadline, with
// the headroom, even on an idle replica) holds no one up, and its tenant
// earns nothing meanwhile; such a head is refused once it cannot meet its
// deadline at all, so no head holds the others for longer than its SLO.
//
// Its cost is a pass over the queue's deadlines plus, per request
// dispatched, a few predictions per tenant of its band and one per held
// head (at most maxHeld): rounds in which no tenant could send are taken
// at once, whatever the weights and the sizes of the requests.
func (g *Gate[T]) Release(now time.Duration, predict func(T) (Prediction, bool), dispatch func(T), refuse func(T, Reason)) {
	if g.n == 0 {
		return
	}
	g.pass++
	g.expire(now, refuse)
	g.epoch++
	r := releaser[T]{g: g, now: now, predict: predict, dispatch: dispatch, refuse: refuse}
	above := time.Duration(math.MaxInt64)
	for _, b := range g.bands {
		b.above = above
		above = min(above, b.room(now, ""))
	}
	for _, b := range g.bands {
		if r.stop {
			break
		}
		if len(b.ring) > 0 {
			r.band(b)
		}
	}
	g.forget(now)
}

// Reprobe is how long a tenant whose held head was found to compete with
// the requests sent past it holds the others back without trying again
// (one request then goes past it, to see).
const Reprobe = time.Second

// maxHeld bounds the heads held in one Release whose competition with the
// others is not known; past it, Release stops.
const maxHeld = 8

// releaser is one Release's state.
type releaser[T any] struct {
	g        *Gate[T]
	now      time.Duration
	predict  func(T) (Prediction, bool)
	dispatch func(T)
	refuse   func(T, Reason)
	held     []heldHead[T] // heads held for load, not known to compete
	stop     bool          // a held head competes: nothing more goes
}

// heldHead is a tenant whose head waits for load: the request it waits
// for, and its forecast then.
type heldHead[T any] struct {
	b *band[T]
	t *tenant[T]
	v T
	p Prediction
}

// band dispatches what the fleet can take of one band, its tenants in
// deficit round robin: a tenant's turn starts with a round's quantum (once
// a round) and goes on while its deficit covers what it can send. A tenant
// whose head waits for load earns its quantum at its turn as the others
// do, and once its deficit covers its head it holds the turn (see
// Release); one with nothing the fleet could take earns nothing and waits
// this time round. Rounds in which no tenant could send are taken at once.
func (r *releaser[T]) band(b *band[T]) {
	g := r.g
	q := float64(g.cfg.Quantum)
	blocked := 0         // tenants passed over this time round
	var first *tenant[T] // the first held this pass, while nothing went after it
	for len(b.ring) > blocked {
		if b.next >= len(b.ring) {
			b.next = 0
			if first == nil { // a held head's turn has not ended
				b.round++
			}
		}
		t := b.ring[b.next]
		if t.blocked == g.pass {
			b.next++
			continue
		}
		i, st, p := g.pick(b, t, r.now, r.predict)
		switch st {
		case headExpired:
			r.refuse(t.queue[0].v, ReasonExpired)
			r.remove(b, t, 0)
			continue
		case headUnservable:
			t.blocked = g.pass
			blocked++
			b.next++
			continue
		}
		cost := float64(t.queue[i].cost)
		if t.deficit < cost && t.turn != b.round && (st != headLoaded || first == nil) {
			// Its turn starts.
			t.deficit += t.weight * q
			t.turn = b.round
		}
		if st == headLoaded && (t.deficit >= cost || first != nil) {
			// Owed its head; or past another held head, where its turn
			// does not start.
			if t.contended > r.now || len(r.held) == maxHeld {
				r.halt(b, t, first)
				return
			}
			r.held = append(r.held, heldHead[T]{b, t, t.queue[i].v, p})
			if first == nil {
				first = t
			}
			t.blocked = g.pass
			blocked++
			b.next++
			continue
		}
		if t.deficit < cost {
			if first != nil {
				// Short, and no new round before the held head's turn ends.
				t.blocked = g.pass
				blocked++
			} else {
				r.short(b, t, cost)
			}
			b.next++ // its turn ends
			continue
		}
		r.dispatch(t.queue[i].v)
		t.deficit -= cost
		first = nil
		r.remove(b, t, i)
		if r.probe() {
			return
		}
	}
	if k := slices.Index(b.ring, first); k >= 0 {
		// Nothing went after it: the turn is still its own.
		b.next = k
	}
}

// halt stops the release at t, the turn back to first if one is held.
func (r *releaser[T]) halt(b *band[T], t, first *tenant[T]) {
	r.stop = true
	if first != nil {
		t = first
	}
	b.next = slices.Index(b.ring, t)
}

// remove takes t's request i out of the queue; t is ring[b.next].
func (r *releaser[T]) remove(b *band[T], t *tenant[T], i int) {
	t.remove(i)
	r.g.n--
	r.g.epoch++
	if len(t.queue) == 0 {
		b.leave(b.next, float64(r.g.cfg.Quantum))
	}
}

// short ends t's turn, its deficit short of cost. When every tenant of
// the band still in play has ended its turn so since the queue last
// changed, the rounds to come are alike until one can send: the next one
// gives each its quantum, and the ones before it are taken at once, each
// tenant given that many quanta.
func (r *releaser[T]) short(b *band[T], t *tenant[T], cost float64) {
	g := r.g
	q := float64(g.cfg.Quantum)
	t.need, t.earned = cost-t.deficit, g.epoch
	k := math.Inf(1)
	for _, u := range b.ring {
		if u.blocked == g.pass {
			continue
		}
		if u.earned != g.epoch {
			return
		}
		k = min(k, math.Ceil(u.need/(u.weight*q)))
	}
	if k--; k <= 0 || math.IsInf(k, 0) {
		return
	}
	for _, u := range b.ring {
		if u.blocked != g.pass {
			u.deficit += k * u.weight * q
		}
	}
	b.round += uint64(k)
	g.epoch++
}

// probe predicts the held heads again after a dispatch; it reports whether
// one's forecast worsened: the request sent competes with it, its tenant is
// marked so, and the release stops with the turn back to it.
func (r *releaser[T]) probe() bool {
	for _, h := range r.held {
		p, ok := r.predict(h.v)
		if ok && (p.Best > h.p.Best || p.Waiting > h.p.Waiting) {
			h.t.contended = r.now + Reprobe
			r.halt(h.b, h.t, nil)
			return true
		}
	}
	return false
}

// headState is what pick found of a tenant's requests.
type headState int

const (
	// headFits: the request picked fits now.
	headFits headState = iota
	// headExpired: the head can no longer meet its deadline even on an
	// idle replica.
	headExpired
	// headUnservable: no replica serves the head, or none of the
	// tenant's requests fits now or would on an idle replica.
	headUnservable
	// headLoaded: none fits now, but the request picked would on an
	// emptier fleet: it waits for load.
	headLoaded
)

// pick is which of a tenant's requests the fleet can take now: the one
// with the earliest deadline that it can take (headFits); else the
// earliest that would fit on an idle replica (headLoaded: it waits for
// load), or -1 for none; with the prediction of the one picked (of the
// head for none).
//
// Whether a request fits depends mostly on how much time it has left, so
// under a backlog that outlasts the heads' deadlines the requests that fit
// are the latest ones: pick tries the head and the few behind it (a
// shorter prompt may fit), then the tail, and if the tail fits, searches
// between for the earliest that does. Without that, the heads that can no
// longer fit would hold the fleet idle until they expired, and the
// requests behind them would spend their time in the queue (on the Azure
// trace at ten times its rate, the queue's goodput was 40% below refusing
// at once). A head too close to its deadline to fit even on an idle
// replica does not make its tenant's later requests stop waiting for load:
// the request waited for is the earliest that would fit there, by the
// floor predicted at its arrival.
func (g *Gate[T]) pick(b *band[T], t *tenant[T], now time.Duration, predict func(T) (Prediction, bool)) (int, headState, Prediction) {
	prio, room := b.priority, min(b.above, b.room(now, t.name))
	h := t.queue[0]
	p, ok := predict(h.v)
	switch {
	case !ok:
		return -1, headUnservable, p
	case now+p.Floor > h.deadline:
		return 0, headExpired, p
	}
	fits := func(i int) bool {
		h := t.queue[i]
		p, ok := predict(h.v)
		return ok && g.fits(prio, p, h.deadline-now, room)
	}
	if g.fits(prio, p, h.deadline-now, room) {
		return 0, headFits, p
	}
	near := min(len(t.queue), 1+lookahead)
	for i := 1; i < near; i++ {
		if fits(i) {
			return i, headFits, p
		}
	}
	last := len(t.queue) - 1
	if last < near || !fits(last) {
		return g.waited(prio, t, now, p, predict)
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
	return hi, headFits, p
}

// waited is the earliest of t's requests, none of which fits now, that
// would fit on an idle replica (headLoaded), with its prediction, or
// headUnservable; p is the head's prediction.
func (g *Gate[T]) waited(prio int, t *tenant[T], now time.Duration, p Prediction, predict func(T) (Prediction, bool)) (int, headState, Prediction) {
	idle := func(floor, deadline time.Duration) bool {
		return g.meets(prio, Prediction{Best: floor}, deadline-now)
	}
	if idle(p.Floor, t.queue[0].deadline) {
		return 0, headLoaded, p
	}
	for i := 1; i < len(t.queue); i++ {
		if h := t.queue[i]; idle(h.floor, h.deadline) {
			if q, ok := predict(h.v); ok {
				return i, headLoaded, q
			}
			break
		}
	}
	return -1, headUnservable, p
}

// lookahead is how many requests behind a tenant's head Release tries one
// by one when the head cannot go.
const lookahead = 8

// expire refuses every waiting request that can no longer meet its
// deadline even on an idle replica, by the floor it was predicted at its
// arrival (round trip and its own prefill change little meanwhile).
func (g *Gate[T]) expire(now time.Duration, refuse func(T, Reason)) {
	g.removeIf(func(h *held[T]) bool { return now+h.floor > h.deadline }, func(v T) { refuse(v, ReasonExpired) })
}

// removeIf takes every waiting request match reports out of the queue,
// handing each to removed, and returns how many; a tenant left with none
// leaves its band's round.
func (g *Gate[T]) removeIf(match func(*held[T]) bool, removed func(T)) int {
	n := 0
	for _, b := range g.bands {
		for k := 0; k < len(b.ring); {
			t := b.ring[k]
			kept := t.queue[:0]
			for i := range t.queue {
				if h := &t.queue[i]; match(h) {
					removed(h.v)
					n++
					continue
				}
				kept = append(kept, t.queue[i])
			}
			clear(t.queue[len(kept):])
			t.queue = kept
			if len(t.queue) == 0 {
				b.leave(k, float64(g.cfg.Quantum))
				continue
			}
			k++
		}
	}
	g.n -= n
	return n
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
						b.leave(k, float64(g.cfg.Quantum))
					}
					g.prune()
					return true
				}
			}
		}
	}
	return false
}

// DropIf removes every queued request match reports (their clients
// aborted them), handing each to dropped, and returns how many.
func (g *Gate[T]) DropIf(match func(T) bool, dropped func(T)) int {
	n := g.removeIf(func(h *held[T]) bool { return match(h.v) }, dropped)
	g.prune()
	return n
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
