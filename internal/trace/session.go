package trace

import "strconv"

// DeriveSessions assigns a Session ("s1", "s2", … in order of first
// appearance) and a Turn (1-based position in the session) to every request
// of reqs, which must be in time order, overwriting any they had, and returns
// the number of sessions.
//
// The rule: build the trie of the block chains of the whole trace (ids are
// prefix-unique, so an id has one parent). A block is shared if at least two
// of its distinct children are themselves non-leaves (two different chains
// continue through it), or if it is an ancestor of a shared block: shared
// blocks are those every conversation starts with, such as a system prompt or
// a fork point. Then, in time order, a request continues the session of the
// most recent earlier request that contains its deepest previously seen block,
// provided that block is not shared; otherwise (no block seen before, or the
// deepest one shared) it starts a new session.
//
// Leaf children are not counted because a conversation's turns end in a
// partial last block that the next turn replaces with a full one, so every
// multi-turn conversation leaves leaves behind without forking.
func DeriveSessions(reqs []Request) int {
	bi := newBlockIndex(reqs)
	shared := sharedBlocks(&bi, len(reqs))
	last := make([]int32, bi.n) // session+1 of the latest request holding each block
	var turns []int             // per session: requests so far
	for i := range reqs {
		blocks := bi.blocks(i)
		session := int32(-1)
		for j := len(blocks) - 1; j >= 0; j-- {
			if s := last[blocks[j]]; s > 0 {
				if !shared[blocks[j]] {
					session = s - 1
				}
				break
			}
		}
		if session < 0 {
			session = int32(len(turns))
			turns = append(turns, 0)
		}
		turns[session]++
		reqs[i].Session = "s" + strconv.Itoa(int(session)+1)
		reqs[i].Turn = turns[session]
		for _, b := range blocks {
			last[b] = session + 1
		}
	}
	return len(turns)
}

// sharedBlocks returns which blocks of the trace indexed by bi are shared
// (see DeriveSessions).
func sharedBlocks(bi *blockIndex, nreqs int) []bool {
	parent := make([]int32, bi.n) // parent+1; 0 = none (first block of a chain)
	hasChild := make([]bool, bi.n)
	for i := range nreqs {
		blocks := bi.blocks(i)
		for j, b := range blocks {
			if j > 0 && parent[b] == 0 {
				parent[b] = blocks[j-1] + 1
			}
			if j < len(blocks)-1 {
				hasChild[b] = true
			}
		}
	}
	// Count, for every block, its distinct children that are non-leaves.
	// Ids are prefix-unique, so distinct blocks with the same parent are
	// distinct children.
	branches := make([]int32, bi.n)
	shared := make([]bool, bi.n)
	found := false
	for b, p := range parent {
		if p > 0 && hasChild[b] {
			branches[p-1]++
			if branches[p-1] == 2 {
				shared[p-1], found = true, true
			}
		}
	}
	if !found {
		return shared
	}
	// Ancestors of shared blocks are shared: in every chain holding a shared
	// block, the blocks before it are its ancestors.
	for i := range nreqs {
		blocks := bi.blocks(i)
		for j := len(blocks) - 1; j > 0; j-- {
			if shared[blocks[j]] {
				for _, b := range blocks[:j] {
					shared[b] = true
				}
				break
			}
		}
	}
	return shared
}
