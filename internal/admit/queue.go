package admit

import (
	"slices"
	"sort"
	"time"
)

// band is the requests of one priority: its tenants with requests
// waiting, in round-robin order, and those without, remembered (what is
// left of their deficit, the room their next request needs: see Gate.note)
// until ReserveFor after their last arrival.
type band[T any] struct {
	priority int
	ring     []*tenant[T]
	gone     []*tenant[T]  // oldest first
	next     int           // the tenant whose turn it is
	round    uint64        // rounds of the ring so far (from 1)
	above    time.Duration // in a Release, the room the bands above need (see Gate.roomFor)
}

// tenant is one tenant's requests in a band, earliest deadline first, and
// its deficit: the tokens it may still send this round.
type tenant[T any] struct {
	name    string
	weight  float64
	deficit float64
	queue   []held[T]
	blocked uint64 // the Release pass in which it was passed over
	// contended is until when its head, waiting for load, holds the others
	// back at once (it was found to compete with the requests sent past it).
	contended time.Duration
	turn      uint64  // the round in which its last turn started
	need      float64 // what its deficit lacked at its last turn's end
	earned    uint64  // the Gate's epoch then
	// room is the room its next request will need, going by its recent
	// arrivals, at last (see Gate.note); floor is their floors' moving
	// average.
	room, last, floor time.Duration
}

type held[T any] struct {
	v        T
	deadline time.Duration
	floor    time.Duration // its predicted floor at arrival
	cost     int
	seq      uint64
}

// bandOf returns the band of priority p, made if need be.
func (g *Gate[T]) bandOf(p int) *band[T] {
	i := sort.Search(len(g.bands), func(i int) bool { return g.bands[i].priority <= p })
	if i < len(g.bands) && g.bands[i].priority == p {
		return g.bands[i]
	}
	b := &band[T]{priority: p, round: 1}
	g.bands = slices.Insert(g.bands, i, b)
	return b
}

// tenantOf returns the band's queue of the named tenant, joining the round
// if it had none, for a request of cost cost: its turn comes at once if it
// has not had one this round, or if what is left of its deficit covers the
// request (a tenant that comes back does not wait for the turns of others,
// which under load last as long as the fleet takes to serve their quanta,
// to send what this round owes it); else last in this round.
func (b *band[T]) tenantOf(name string, weight float64, cost int) *tenant[T] {
	if t := b.find(name); t != nil {
		return t
	}
	t := b.recall(name)
	if t == nil {
		t = &tenant[T]{name: name}
	}
	t.weight = weight
	// Join just before the tenant whose turn it is: its turn now, or, had
	// it one this round, last in the round.
	b.ring = slices.Insert(b.ring, b.next, t)
	if t.turn == b.round && t.deficit < float64(cost) {
		b.next++
	}
	return t
}

// recall takes the named tenant out of those remembered (nil if not).
func (b *band[T]) recall(name string) *tenant[T] {
	for k, t := range b.gone {
		if t.name == name {
			b.gone = slices.Delete(b.gone, k, k+1)
			return t
		}
	}
	return nil
}

// maxGone bounds the tenants a band remembers.
const maxGone = 256

// leave takes the (empty) tenant at ring[k] out of the round and remembers
// it, with what is left of its deficit up to a round's quantum (quantum per
// unit of weight): no more than deficit round robin would have let it send
// had it stayed.
func (b *band[T]) leave(k int, quantum float64) {
	t := b.ring[k]
	b.ring = slices.Delete(b.ring, k, k+1)
	if k < b.next {
		b.next--
	}
	t.deficit = min(t.deficit, t.weight*quantum)
	b.remember(t)
}

// remember adds t to the tenants remembered, forgetting the oldest past
// maxGone.
func (b *band[T]) remember(t *tenant[T]) {
	if len(b.gone) == maxGone {
		b.gone = slices.Delete(b.gone, 0, 1)
	}
	b.gone = append(b.gone, t)
}

// prune drops the bands with nothing waiting and nothing remembered.
func (g *Gate[T]) prune() {
	g.bands = slices.DeleteFunc(g.bands, func(b *band[T]) bool { return len(b.ring) == 0 && len(b.gone) == 0 })
}

// forget drops the tenants remembered whose last arrival is more than
// ReserveFor before now, then the bands left empty.
func (g *Gate[T]) forget(now time.Duration) {
	for _, b := range g.bands {
		b.gone = slices.DeleteFunc(b.gone, func(t *tenant[T]) bool { return now-t.last > ReserveFor })
	}
	g.prune()
}

// waitingAtOrAbove reports whether requests of priority p or higher wait.
func (g *Gate[T]) waitingAtOrAbove(p int) bool {
	for _, b := range g.bands {
		if b.priority < p {
			break
		}
		if len(b.ring) > 0 {
			return true
		}
	}
	return false
}

// lowest is the lowest band with requests waiting (nil if none).
func (g *Gate[T]) lowest() *band[T] {
	for i := len(g.bands) - 1; i >= 0; i-- {
		if len(g.bands[i].ring) > 0 {
			return g.bands[i]
		}
	}
	return nil
}

// evict makes room in a full queue for a request of priority p from the
// named tenant: it takes out the latest arrival of the tenant with the
// most requests waiting for its weight in the lowest band, if that band
// is below p, or is p's and that tenant holds more than its share against
// the arriving one (a tenant flooding its band cannot hold the queue
// against the others).
func (g *Gate[T]) evict(p int, name string, weight float64) (T, bool) {
	var zero T
	b := g.lowest()
	if b == nil || b.priority > p {
		return zero, false
	}
	k, most := -1, 0.0
	for i, t := range b.ring {
		if n := float64(len(t.queue)) / t.weight; k < 0 || n > most {
			k, most = i, n
		}
	}
	t := b.ring[k]
	if b.priority == p {
		mine := 1.0 / weight // the arriving one, counted
		if bt := b.find(name); bt != nil {
			mine = float64(len(bt.queue)+1) / bt.weight
		}
		if t.name == name || most <= mine {
			return zero, false
		}
	}
	last := 0
	for i, h := range t.queue {
		if h.seq > t.queue[last].seq {
			last = i
		}
	}
	v := t.queue[last].v
	t.remove(last)
	g.n--
	if len(t.queue) == 0 {
		b.leave(k, float64(g.cfg.Quantum))
	}
	return v, true
}

// find is the band's queue of the named tenant (nil if none).
func (b *band[T]) find(name string) *tenant[T] {
	for _, t := range b.ring {
		if t.name == name {
			return t
		}
	}
	return nil
}

// push queues h in deadline order (arrival order among equal deadlines).
func (t *tenant[T]) push(h held[T]) {
	i := sort.Search(len(t.queue), func(i int) bool {
		q := t.queue[i]
		return q.deadline > h.deadline || q.deadline == h.deadline && q.seq > h.seq
	})
	t.queue = slices.Insert(t.queue, i, h)
}

func (t *tenant[T]) remove(i int) {
	t.queue = slices.Delete(t.queue, i, i+1)
}
