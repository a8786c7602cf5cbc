package trace

// idArena hands out sub-slices of large shared arrays, so that a trace's
// hash ids cost a few allocations instead of one per request.
type idArena struct{ buf []uint64 }

const arenaChunk = 1 << 16

// copy returns a copy of ids whose capacity equals its length.
func (a *idArena) copy(ids []uint64) []uint64 {
	n := len(ids)
	if n > arenaChunk/4 {
		return append([]uint64(nil), ids...)
	}
	if cap(a.buf)-len(a.buf) < n {
		a.buf = make([]uint64, 0, arenaChunk)
	}
	start := len(a.buf)
	a.buf = append(a.buf, ids...)
	return a.buf[start : start+n : start+n]
}

// alloc returns a zeroed slice of n ids whose capacity equals its length.
func (a *idArena) alloc(n int) []uint64 {
	if n > arenaChunk/4 {
		return make([]uint64, n)
	}
	if cap(a.buf)-len(a.buf) < n {
		a.buf = make([]uint64, 0, arenaChunk)
	}
	start := len(a.buf)
	a.buf = a.buf[:start+n]
	return a.buf[start : start+n : start+n]
}

// blockIndex numbers the distinct block ids of a trace densely (0, 1, … in
// order of first appearance), so that per-block state can live in slices
// instead of maps. Blocks of requests for different models are distinct
// even when their ids are equal (a cache holds a prefix for one model).
type blockIndex struct {
	// dense holds every request's block indexes back to back; request i's
	// are dense[start[i]:start[i+1]].
	dense []int32
	start []int
	// n is the number of distinct ids.
	n int
}

func newBlockIndex(reqs []Request) blockIndex {
	total := 0
	for i := range reqs {
		total += len(reqs[i].HashIDs)
	}
	bi := blockIndex{dense: make([]int32, total), start: make([]int, len(reqs)+1)}
	models := map[string]uint64{}
	for i := range reqs {
		if m := reqs[i].Model; m != "" {
			if _, ok := models[m]; !ok {
				models[m] = uint64(len(models) + 1)
			}
		}
	}
	if len(models) == 0 {
		ids := make(map[uint64]int32, total/2+16)
		k := 0
		for i := range reqs {
			bi.start[i] = k
			for _, id := range reqs[i].HashIDs {
				d, ok := ids[id]
				if !ok {
					d = int32(len(ids))
					ids[id] = d
				}
				bi.dense[k] = d
				k++
			}
		}
		bi.start[len(reqs)] = k
		bi.n = len(ids)
		return bi
	}
	ids := make(map[[2]uint64]int32, total/2+16)
	k := 0
	for i := range reqs {
		bi.start[i] = k
		m := models[reqs[i].Model] // 0 for none
		for _, id := range reqs[i].HashIDs {
			d, ok := ids[[2]uint64{m, id}]
			if !ok {
				d = int32(len(ids))
				ids[[2]uint64{m, id}] = d
			}
			bi.dense[k] = d
			k++
		}
	}
	bi.start[len(reqs)] = k
	bi.n = len(ids)
	return bi
}

// blocks returns request i's dense block indexes.
func (bi *blockIndex) blocks(i int) []int32 { return bi.dense[bi.start[i]:bi.start[i+1]] }

// ownerSet records which owners (sessions or users) have held each block.
// Most blocks have one owner, kept in a slice; later owners of a block go
// to an overflow map.
type ownerSet struct {
	first    []int32 // owner+1 of each block; 0 = none yet
	overflow map[[2]int32]struct{}
}

func newOwnerSet(blocks int) ownerSet {
	return ownerSet{first: make([]int32, blocks), overflow: make(map[[2]int32]struct{})}
}

func (o *ownerSet) has(block, owner int32) bool {
	switch o.first[block] {
	case owner + 1:
		return true
	case 0:
		return false
	}
	_, ok := o.overflow[[2]int32{block, owner}]
	return ok
}

func (o *ownerSet) add(block, owner int32) {
	switch o.first[block] {
	case owner + 1:
	case 0:
		o.first[block] = owner + 1
	default:
		o.overflow[[2]int32{block, owner}] = struct{}{}
	}
}
