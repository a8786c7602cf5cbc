package admit

import (
	"slices"
	"sort"
	"time"
)

// band is the requests of one priority: its tenants with requests
// waiting, in round-robin order.
type band[T any] struct {
	priority int
	ring     []*tenant[T]
	next     int // the tenant whose turn it is
}

// tenant is one tenant's requests in a band, earliest deadline first, and
// its deficit: the tokens it may still send this round.
type tenant[T any] struct {
	name    string
	weight  float64
	deficit float64
	queue   []held[T]
	blocked uint64 // the Release pass in which no replica could take its head
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
	b := &band[T]{priority: p}
	g.bands = slices.Insert(g.bands, i, b)
	return b
}

// tenantOf returns the band's queue of the named tenant, joining the round
// (last) if it had none.
func (b *band[T]) tenantOf(name string, weight float64) *tenant[T] {
	if t := b.find(name); t != nil {
		return t
	}
	t := &tenant[T]{name: name, weight: weight}
	// Join just before the tenant whose turn it is: last in this round.
	b.ring = slices.Insert(b.ring, b.next, t)
	b.next++
	return t
}

// leave takes the (empty) tenant at ring[k] out of the round; its deficit
// goes with it, as deficit round robin has it.
func (b *band[T]) leave(k int) {
	b.ring = slices.Delete(b.ring, k, k+1)
	if k < b.next {
		b.next--
	}
	if len(b.ring) > 0 {
		b.next %= len(b.ring)
	} else {
		b.next = 0
	}
}

// prune drops the empty bands.
func (g *Gate[T]) prune() {
	g.bands = slices.DeleteFunc(g.bands, func(b *band[T]) bool { return len(b.ring) == 0 })
}

// waitingAtOrAbove reports whether requests of priority p or higher wait.
func (g *Gate[T]) waitingAtOrAbove(p int) bool {
	return len(g.bands) > 0 && g.bands[0].priority >= p
}

// evict makes room in a full queue for a request of priority p from the
// named tenant: it takes out the latest arrival of the tenant with the
// most requests waiting for its weight in the lowest band, if that band
// is below p, or is p's and that tenant holds more than its share against
// the arriving one (a tenant flooding its band cannot hold the queue
// against the others).
func (g *Gate[T]) evict(p int, name string, weight float64) (T, bool) {
	var zero T
	if len(g.bands) == 0 {
		return zero, false
	}
	b := g.bands[len(g.bands)-1]
	if b.priority > p {
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
		b.leave(k)
		g.prune()
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
