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
// An Index is not safe for concurrent use.
package prefix

import (
	"fmt"
	"math/bits"
)

// MaxReplicas is the largest number of replicas an Index tracks.
const MaxReplicas = 256

// set is a set of replica indexes.
type set [MaxReplicas / 64]uint64

func (s *set) add(r int)      { s[r>>6] |= 1 << (r & 63) }
func (s *set) remove(r int)   { s[r>>6] &^= 1 << (r & 63) }
func (s *set) has(r int) bool { return s[r>>6]&(1<<(r&63)) != 0 }
func (s *set) empty() bool    { return s[0]|s[1]|s[2]|s[3] == 0 }
func andNot(a, b set) (out set) {
	for i := range a {
		out[i] = a[i] &^ b[i]
	}
	return out
}

// entry is one distinct block and the replicas believed to hold it.
type entry struct {
	hash    uint64
	holders set
	nodes   int32 // first node of this block's per-replica node list, -1 if none
}

// node is one (block, replica) membership, linked into the replica's LRU
// list and into its block's node list.
type node struct {
	entry      int32
	replica    int32
	prev, next int32 // replica LRU: prev is more recent
	sibling    int32 // next node of the same entry
}

type lru struct {
	head, tail int32 // head: most recent; tail: next to evict
	n          int
	capacity   int // blocks
}

// Index tracks, per replica, the blocks it is believed to cache.
type Index struct {
	blockTokens int
	entries     []entry
	freeEntries []int32
	byHash      map[uint64]int32
	nodes       []node
	freeNodes   []int32
	reps        []lru
}

// New returns an empty index over len(capacityTokens) replicas, replica i
// holding at most capacityTokens[i]/blockTokens blocks.
func New(blockTokens int, capacityTokens []int) (*Index, error) {
	if blockTokens <= 0 {
		return nil, fmt.Errorf("prefix index: block size must be positive, got %d", blockTokens)
	}
	if len(capacityTokens) > MaxReplicas {
		return nil, fmt.Errorf("prefix index: %d replicas, at most %d supported", len(capacityTokens), MaxReplicas)
	}
	ix := &Index{blockTokens: blockTokens, byHash: make(map[uint64]int32), reps: make([]lru, len(capacityTokens))}
	for i, c := range capacityTokens {
		ix.reps[i] = lru{head: -1, tail: -1, capacity: max(c/blockTokens, 1)}
	}
	return ix, nil
}

// BlockTokens returns the tokens each block stands for.
func (ix *Index) BlockTokens() int { return ix.blockTokens }

// Blocks returns how many blocks replica r is believed to hold.
func (ix *Index) Blocks(r int) int { return ix.reps[r].n }

// Capacity returns replica r's capacity in blocks.
func (ix *Index) Capacity(r int) int { return ix.reps[r].capacity }

// SetCapacity changes replica r's capacity (blocks, at least 1), forgetting
// least recently used blocks if it now holds too many.
func (ix *Index) SetCapacity(r, blocks int) {
	ix.reps[r].capacity = max(blocks, 1)
	ix.shrink(r)
}

// Clear forgets everything replica r is believed to hold.
func (ix *Index) Clear(r int) {
	for ix.reps[r].tail >= 0 {
		ix.drop(ix.reps[r].tail)
	}
}

// Len returns the number of distinct blocks indexed.
func (ix *Index) Len() int { return len(ix.byHash) }

// holders returns the replicas believed to hold the block.
func (ix *Index) holders(hash uint64) set {
	if e, ok := ix.byHash[hash]; ok {
		return ix.entries[e].holders
	}
	return set{}
}

// Match writes into depth[r] how many leading blocks of the prompt replica r
// is believed to hold, for every replica; depth must have one element per
// replica. It looks up O(k·log n) blocks for n blocks and k distinct depths.
func (ix *Index) Match(blocks []uint64, depth []int) {
	clear(depth)
	n := len(blocks)
	if n == 0 {
		return
	}
	first := ix.holders(blocks[0])
	if first.empty() {
		return
	}
	last := first
	if n > 1 {
		last = ix.holders(blocks[n-1])
	}
	forEach(last, func(r int) { depth[r] = n })
	ix.bisect(blocks, 0, n-1, first, last, depth)
}

// bisect assigns depths to the replicas that hold block lo (set a) but not
// block hi (set b): by the prefix invariant each holds some run 0..d-1 with
// lo < d <= hi.
func (ix *Index) bisect(blocks []uint64, lo, hi int, a, b set, depth []int) {
	if a == b {
		return
	}
	if hi-lo == 1 {
		forEach(andNot(a, b), func(r int) { depth[r] = lo + 1 })
		return
	}
	mid := lo + (hi-lo)/2
	m := ix.holders(blocks[mid])
	ix.bisect(blocks, lo, mid, a, m, depth)
	ix.bisect(blocks, mid, hi, m, b, depth)
}

func forEach(s set, f func(int)) {
	for w, bitsLeft := range s {
		for bitsLeft != 0 {
			i := bits.TrailingZeros64(bitsLeft)
			f(w*64 + i)
			bitsLeft &^= 1 << i
		}
	}
}

// Insert records that replica r now holds the prompt's blocks, making them
// its most recently used (the first block most recent of all).
func (ix *Index) Insert(r int, blocks []uint64) {
	for i := len(blocks) - 1; i >= 0; i-- {
		ix.touch(r, blocks[i])
	}
	ix.shrink(r)
}

// touch makes block hash replica r's most recently used block.
func (ix *Index) touch(r int, hash uint64) {
	e, ok := ix.byHash[hash]
	if !ok {
		e = ix.newEntry(hash)
	}
	nd := ix.find(e, int32(r))
	l := &ix.reps[r]
	if nd >= 0 {
		if l.head == nd {
			return
		}
		ix.unlink(nd)
	} else {
		nd = ix.newNode(e, int32(r))
		ix.entries[e].holders.add(r)
		l.n++
	}
	ix.pushHead(nd)
}

// shrink evicts replica r's least recently used blocks beyond its capacity.
func (ix *Index) shrink(r int) {
	l := &ix.reps[r]
	for l.n > l.capacity {
		ix.drop(l.tail)
	}
}

func (ix *Index) find(e, r int32) int32 {
	for nd := ix.entries[e].nodes; nd >= 0; nd = ix.nodes[nd].sibling {
		if ix.nodes[nd].replica == r {
			return nd
		}
	}
	return -1
}

func (ix *Index) newEntry(hash uint64) int32 {
	var e int32
	if k := len(ix.freeEntries); k > 0 {
		e = ix.freeEntries[k-1]
		ix.freeEntries = ix.freeEntries[:k-1]
	} else {
		e = int32(len(ix.entries))
		ix.entries = append(ix.entries, entry{})
	}
	ix.entries[e] = entry{hash: hash, nodes: -1}
	ix.byHash[hash] = e
	return e
}

func (ix *Index) newNode(e, r int32) int32 {
	var nd int32
	if k := len(ix.freeNodes); k > 0 {
		nd = ix.freeNodes[k-1]
		ix.freeNodes = ix.freeNodes[:k-1]
	} else {
		nd = int32(len(ix.nodes))
		ix.nodes = append(ix.nodes, node{})
	}
	ix.nodes[nd] = node{entry: e, replica: r, prev: -1, next: -1, sibling: ix.entries[e].nodes}
	ix.entries[e].nodes = nd
	return nd
}

// drop removes a node from its replica and its block, and the block from
// the index when no replica holds it any more.
func (ix *Index) drop(nd int32) {
	n := ix.nodes[nd]
	ix.unlink(nd)
	ix.reps[n.replica].n--
	en := &ix.entries[n.entry]
	en.holders.remove(int(n.replica))
	if en.nodes == nd {
		en.nodes = n.sibling
	} else {
		p := en.nodes
		for ix.nodes[p].sibling != nd {
			p = ix.nodes[p].sibling
		}
		ix.nodes[p].sibling = n.sibling
	}
	ix.freeNodes = append(ix.freeNodes, nd)
	if en.nodes < 0 {
		delete(ix.byHash, en.hash)
		ix.freeEntries = append(ix.freeEntries, n.entry)
	}
}

func (ix *Index) pushHead(nd int32) {
	l := &ix.reps[ix.nodes[nd].replica]
	ix.nodes[nd].prev = -1
	ix.nodes[nd].next = l.head
	if l.head >= 0 {
		ix.nodes[l.head].prev = nd
	} else {
		l.tail = nd
	}
	l.head = nd
}

func (ix *Index) unlink(nd int32) {
	n := &ix.nodes[nd]
	l := &ix.reps[n.replica]
	if n.prev >= 0 {
		ix.nodes[n.prev].next = n.next
	} else {
		l.head = n.next
	}
	if n.next >= 0 {
		ix.nodes[n.next].prev = n.prev
	} else {
		l.tail = n.prev
	}
	n.prev, n.next = -1, -1
}
