package engine

import "github.com/gorgo-llm/gorgo/internal/slab"

// cache is a replica's prefix KV cache, counted in fixed-size blocks (pages).
//
// A block is identified by a chained hash: its id stands for its own tokens
// and every token before it, so the cached prefix of a prompt is the longest
// run of leading block ids present in the cache. Blocks referenced by running
// requests cannot be evicted; unreferenced blocks stay cached in LRU order
// until space is needed. Requests also hold private blocks (the parts of a
// prompt still being prefilled, and their output tokens), which count against
// the capacity but are never shared.
//
// The zero value is not usable; call newCache.
type cache struct {
	capacity int // blocks
	used     int // cached blocks (referenced or not) + private blocks

	index map[uint64]int32 // block id -> slot
	slots slab.Slab[slot]

	// LRU list of unreferenced cached blocks: head is the least recently
	// used, the next to evict. -1 terminates.
	head, tail int32
	lruLen     int
}

type slot struct {
	id         uint64
	refs       int32
	prev, next int32 // LRU links, valid while refs == 0
}

func newCache(capacityBlocks int) *cache {
	return &cache{
		capacity: capacityBlocks,
		index:    make(map[uint64]int32),
		head:     -1,
		tail:     -1,
	}
}

// match returns how many leading blocks of ids are cached, and how many of
// those are unreferenced (so would stop being evictable once acquired).
func (c *cache) match(ids []uint64) (n, idle int) {
	for _, id := range ids {
		s, ok := c.index[id]
		if !ok {
			break
		}
		if c.slots.At(s).refs == 0 {
			idle++
		}
		n++
	}
	return n, idle
}

// available is how many new blocks could be allocated, evicting every
// unreferenced block if need be.
func (c *cache) available() int { return c.capacity - c.used + c.lruLen }

// acquire references the first n blocks of ids, which must be cached, and
// appends their slots to dst.
func (c *cache) acquire(ids []uint64, dst []int32) []int32 {
	for _, id := range ids {
		s := c.index[id]
		if c.slots.At(s).refs == 0 {
			c.unlink(s)
		}
		c.slots.At(s).refs++
		dst = append(dst, s)
	}
	return dst
}

// reserve allocates n private blocks, evicting unreferenced blocks as needed.
// It reports false, allocating nothing, if they do not fit.
func (c *cache) reserve(n int) bool {
	if n > c.available() {
		return false
	}
	for c.capacity-c.used < n {
		c.evict()
	}
	c.used += n
	return true
}

// unreserve returns n private blocks.
func (c *cache) unreserve(n int) { c.used -= n }

// commit turns one private block into the cached block id, referenced once,
// and returns its slot. If id is already cached (another request computed
// the same block meanwhile), the private block is given back and the
// existing one referenced instead.
func (c *cache) commit(id uint64) int32 {
	if s, ok := c.index[id]; ok {
		c.used--
		if c.slots.At(s).refs == 0 {
			c.unlink(s)
		}
		c.slots.At(s).refs++
		return s
	}
	s := c.slots.New(slot{id: id, refs: 1, prev: -1, next: -1})
	c.index[id] = s
	return s
}

// release drops one reference from each slot. Slots are given in prompt
// order; they enter the LRU list tail first, so that when a prompt's blocks
// become evictable its last blocks go before its first ones (a shared prefix
// outlives the suffixes built on it).
func (c *cache) release(slots []int32) {
	for i := len(slots) - 1; i >= 0; i-- {
		s := slots[i]
		c.slots.At(s).refs--
		if c.slots.At(s).refs == 0 {
			c.pushMRU(s)
		}
	}
}

// evict drops the least recently used unreferenced block.
func (c *cache) evict() {
	s := c.head
	c.unlink(s)
	delete(c.index, c.slots.At(s).id)
	c.slots.Free(s)
	c.used--
}

func (c *cache) pushMRU(s int32) {
	c.slots.At(s).prev = c.tail
	c.slots.At(s).next = -1
	if c.tail >= 0 {
		c.slots.At(c.tail).next = s
	} else {
		c.head = s
	}
	c.tail = s
	c.lruLen++
}

func (c *cache) unlink(s int32) {
	p, n := c.slots.At(s).prev, c.slots.At(s).next
	if p >= 0 {
		c.slots.At(p).next = n
	} else {
		c.head = n
	}
	if n >= 0 {
		c.slots.At(n).prev = p
	} else {
		c.tail = p
	}
	c.slots.At(s).prev, c.slots.At(s).next = -1, -1
	c.lruLen--
}

// cloneInto returns an independent copy, reusing dst's storage when dst
// is not nil.
func (c *cache) cloneInto(dst *cache) *cache {
	if dst == nil {
		dst = &cache{}
	}
	index, slots := dst.index, dst.slots
	*dst = *c
	if index == nil {
		index = make(map[uint64]int32, len(c.index))
	}
	clear(index)
	for k, v := range c.index {
		index[k] = v
	}
	dst.index = index
	dst.slots = slots
	dst.slots.CopyFrom(&c.slots)
	return dst
}
