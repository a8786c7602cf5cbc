// Package prefix is the router's belief of what each replica holds in its
// prefix KV cache: for every replica, a bounded LRU set of prompt blocks,
// identified by chained block hashes.
//
// The router inserts a prompt's blocks into the chosen replica's set when it
// dispatches the request, and the set forgets its least recently used blocks
// once it holds more than the replica's capacity, so the belief decays the
// way the engine's cache does. Blocks of a prompt are touched last block
// first, so that within a replica a block is never less recent than any
// block after it in a chain: a replica's set always holds whole prefixes.
// That invariant lets Match find every replica's cached prefix with a
// bisection over the prompt's blocks instead of a lookup per block.
//
// Replicas live in slots: AddReplica takes a free slot (a removed
// replica's, else a new one) and RemoveReplica forgets a replica and frees
// its slot, so a fleet that changes does not grow the index. A block's
// holders are a list of slots sorted by slot, so the index costs memory per
// (block, holder), not per (block, slot): fleets of MaxReplicas replicas
// cost no more per cached block than fleets of three.
//
// An Index is not safe for concurrent use.
package prefix

import (
	"errors"
	"fmt"

	"github.com/gorgo-llm/gorgo/internal/slab"
)

// MaxReplicas is the most replicas an Index holds at once (its slots).
const MaxReplicas = 4096

// ErrFull means every slot holds a replica.
var ErrFull = fmt.Errorf("prefix index: at most %d replicas", MaxReplicas)

// entry is one distinct block and the replicas believed to hold it.
type entry struct {
	hash  uint64
	nodes int32 // first node of this block's holder list (sorted by slot), -1 if none
	count int32 // holders
}

// node is one (block, replica) membership, linked into the replica's LRU
// list and into its block's holder list.
type node struct {
	entry      int32
	replica    int32
	prev, next int32 // replica LRU: prev is more recent
	sibling    int32 // next holder of the same block, in slot order
}

type lru struct {
	head, tail int32 // head: most recent; tail: next to evict
	n          int
	capacity   int // blocks; 0 marks a free slot
}

// Index tracks, per replica, the blocks it is believed to cache.
type Index struct {
	blockTokens int
	entries     slab.Slab[entry]
	byHash      map[uint64]int32
	nodes       slab.Slab[node]
	reps        []lru
	freeSlots   []int
}

// New returns an empty index of blocks of blockTokens tokens.
func New(blockTokens int) (*Index, error) {
	if blockTokens <= 0 {
		return nil, fmt.Errorf("prefix index: block size must be positive, got %d", blockTokens)
	}
	return &Index{blockTokens: blockTokens, byHash: make(map[uint64]int32)}, nil
}

// AddReplica gives a new replica of capacityTokens KV tokens an empty slot
// and returns it: a slot a removed replica freed if there is one, so slots
// stay below the largest number of replicas ever held at once.
func (ix *Index) AddReplica(capacityTokens int) (int, error) {
	l := lru{head: -1, tail: -1, capacity: max(capacityTokens/ix.blockTokens, 1)}
	if k := len(ix.freeSlots); k > 0 {
		slot := ix.freeSlots[k-1]
		ix.freeSlots = ix.freeSlots[:k-1]
		ix.reps[slot] = l
		return slot, nil
	}
	if len(ix.reps) >= MaxReplicas {
		return 0, ErrFull
	}
	ix.reps = append(ix.reps, l)
	return len(ix.reps) - 1, nil
}

// RemoveReplica forgets what the replica in slot holds and frees the slot.
func (ix *Index) RemoveReplica(slot int) {
	ix.Clear(slot)
	ix.reps[slot].capacity = 0
	ix.freeSlots = append(ix.freeSlots, slot)
}

// Slots returns one more than the highest slot ever used: the length a
// depth slice given to Match must have.
func (ix *Index) Slots() int { return len(ix.reps) }

// BlockTokens returns the tokens each block stands for.
func (ix *Index) BlockTokens() int { return ix.blockTokens }

// Blocks returns how many blocks the replica in slot is believed to hold.
func (ix *Index) Blocks(slot int) int { return ix.reps[slot].n }

// Capacity returns the replica's capacity in blocks.
func (ix *Index) Capacity(slot int) int { return ix.reps[slot].capacity }

// SetCapacity changes a replica's capacity (blocks, at least 1), forgetting
// its least recently used blocks if it now holds too many.
func (ix *Index) SetCapacity(slot, blocks int) {
	ix.reps[slot].capacity = max(blocks, 1)
	ix.shrink(slot)
}

// Clear forgets everything the replica in slot is believed to hold.
func (ix *Index) Clear(slot int) {
	for ix.ClearSome(slot, 1<<30) {
	}
}

// ClearSome forgets at most n of the replica's least recently used blocks
// (so a caller holding a lock can clear a large replica in pieces) and
// reports whether any are left. What is left is still whole prefixes.
func (ix *Index) ClearSome(slot, n int) (more bool) {
	l := &ix.reps[slot]
	for ; n > 0 && l.tail >= 0; n-- {
		ix.drop(l.tail)
	}
	return l.tail >= 0
}

// Len returns the number of distinct blocks indexed.
func (ix *Index) Len() int { return len(ix.byHash) }

// lookup returns the block's entry, -1 if no replica holds it.
func (ix *Index) lookup(hash uint64) int32 {
	if e, ok := ix.byHash[hash]; ok {
		return e
	}
	return -1
}

func (ix *Index) count(e int32) int32 {
	if e < 0 {
		return 0
	}
	return ix.entries.At(e).count
}

func (ix *Index) head(e int32) int32 {
	if e < 0 {
		return -1
	}
	return ix.entries.At(e).nodes
}

// Match writes into depth[slot] how many leading blocks of the prompt the
// replica in that slot is believed to hold, for every slot; depth must have
// Slots() elements. It looks up O(k·log n) blocks for n blocks and k
// distinct depths.
func (ix *Index) Match(blocks []uint64, depth []int) {
	clear(depth)
	n := len(blocks)
	if n == 0 {
		return
	}
	first := ix.lookup(blocks[0])
	if first < 0 {
		return
	}
	last := first
	if n > 1 {
		last = ix.lookup(blocks[n-1])
	}
	for nd := ix.head(last); nd >= 0; nd = ix.nodes.At(nd).sibling {
		depth[ix.nodes.At(nd).replica] = n
	}
	ix.bisect(blocks, 0, n-1, first, last, depth)
}

// bisect assigns depths to the replicas that hold block lo (entry a) but
// not block hi (entry b): by the prefix invariant b's holders are a subset
// of a's, and each of the others holds some run 0..d-1 with lo < d <= hi.
func (ix *Index) bisect(blocks []uint64, lo, hi int, a, b int32, depth []int) {
	if ix.count(a) == ix.count(b) {
		return
	}
	if hi-lo == 1 {
		// a's holders not in b's: both lists are sorted by slot.
		nb := ix.head(b)
		for na := ix.head(a); na >= 0; na = ix.nodes.At(na).sibling {
			r := ix.nodes.At(na).replica
			for nb >= 0 && ix.nodes.At(nb).replica < r {
				nb = ix.nodes.At(nb).sibling
			}
			if nb < 0 || ix.nodes.At(nb).replica != r {
				depth[r] = lo + 1
			}
		}
		return
	}
	mid := lo + (hi-lo)/2
	m := ix.lookup(blocks[mid])
	ix.bisect(blocks, lo, mid, a, m, depth)
	ix.bisect(blocks, mid, hi, m, b, depth)
}

// Insert records that the replica in slot now holds the prompt's blocks,
// making them its most recently used (the first block most recent of all).
func (ix *Index) Insert(slot int, blocks []uint64) {
	if ix.reps[slot].capacity == 0 {
		panic(errors.New("prefix index: insert into a free slot"))
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		ix.touch(int32(slot), blocks[i])
	}
	ix.shrink(slot)
}

// touch makes block hash replica r's most recently used block.
func (ix *Index) touch(r int32, hash uint64) {
	e, ok := ix.byHash[hash]
	if !ok {
		e = ix.entries.New(entry{hash: hash, nodes: -1})
		ix.byHash[hash] = e
	}
	// Find r in the block's holder list, or where it belongs.
	prev, nd := int32(-1), ix.entries.At(e).nodes
	for nd >= 0 && ix.nodes.At(nd).replica < r {
		prev, nd = nd, ix.nodes.At(nd).sibling
	}
	l := &ix.reps[r]
	if nd >= 0 && ix.nodes.At(nd).replica == r {
		if l.head == nd {
			return
		}
		ix.unlink(nd)
	} else {
		nd = ix.nodes.New(node{entry: e, replica: r, prev: -1, next: -1, sibling: nd})
		if prev >= 0 {
			ix.nodes.At(prev).sibling = nd
		} else {
			ix.entries.At(e).nodes = nd
		}
		ix.entries.At(e).count++
		l.n++
	}
	ix.pushHead(nd)
}

// shrink evicts the replica's least recently used blocks beyond its
// capacity.
func (ix *Index) shrink(slot int) {
	l := &ix.reps[slot]
	for l.n > l.capacity {
		ix.drop(l.tail)
	}
}

// drop removes a node from its replica and its block, and the block from
// the index when no replica holds it any more.
func (ix *Index) drop(nd int32) {
	n := *ix.nodes.At(nd)
	ix.unlink(nd)
	ix.reps[n.replica].n--
	en := ix.entries.At(n.entry)
	if en.nodes == nd {
		en.nodes = n.sibling
	} else {
		p := en.nodes
		for ix.nodes.At(p).sibling != nd {
			p = ix.nodes.At(p).sibling
		}
		ix.nodes.At(p).sibling = n.sibling
	}
	en.count--
	ix.nodes.Free(nd)
	if en.nodes < 0 {
		delete(ix.byHash, en.hash)
		ix.entries.Free(n.entry)
	}
}

func (ix *Index) pushHead(nd int32) {
	n := ix.nodes.At(nd)
	l := &ix.reps[n.replica]
	n.prev = -1
	n.next = l.head
	if l.head >= 0 {
		ix.nodes.At(l.head).prev = nd
	} else {
		l.tail = nd
	}
	l.head = nd
}

func (ix *Index) unlink(nd int32) {
	n := ix.nodes.At(nd)
	l := &ix.reps[n.replica]
	if n.prev >= 0 {
		ix.nodes.At(n.prev).next = n.next
	} else {
		l.head = n.next
	}
	if n.next >= 0 {
		ix.nodes.At(n.next).prev = n.prev
	} else {
		l.tail = n.prev
	}
	n.prev, n.next = -1, -1
}
