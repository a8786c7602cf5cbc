package prefix

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// chain returns n chained block ids of a prompt family: prompts with the
// same base share every block.
func chain(base uint64, n int) []uint64 {
	b := make([]uint64, n)
	for i := range b {
		b[i] = base<<32 | uint64(i)
	}
	return b
}

func newIndex(t testing.TB, caps ...int) *Index {
	t.Helper()
	ix, err := New(16)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range caps {
		if slot, err := ix.AddReplica(c); err != nil || slot != i {
			t.Fatalf("replica %d got slot %d, %v", i, slot, err)
		}
	}
	return ix
}

// holds reports whether replica r is believed to hold the block.
func holds(ix *Index, r int, hash uint64) bool {
	for nd := ix.head(ix.lookup(hash)); nd >= 0; nd = ix.nodes.At(nd).sibling {
		if int(ix.nodes.At(nd).replica) == r {
			return true
		}
	}
	return false
}

func TestMatchEveryReplica(t *testing.T) {
	ix := newIndex(t, 1600, 1600, 1600)
	a := chain(1, 10)
	ix.Insert(0, a[:10])
	ix.Insert(1, a[:4])
	ix.Insert(2, chain(2, 5))
	depth := make([]int, 3)
	ix.Match(a, depth)
	if want := []int{10, 4, 0}; !slices.Equal(depth, want) {
		t.Errorf("depth %v, want %v", depth, want)
	}
	// A prompt that extends a[:6] with new blocks.
	b := append(slices.Clone(a[:6]), 900, 901)
	ix.Match(b, depth)
	if want := []int{6, 4, 0}; !slices.Equal(depth, want) {
		t.Errorf("depth %v, want %v", depth, want)
	}
	ix.Match(nil, depth)
	if want := []int{0, 0, 0}; !slices.Equal(depth, want) {
		t.Errorf("empty prompt: depth %v", depth)
	}
}

func TestLRUForgetsTailsFirst(t *testing.T) {
	ix := newIndex(t, 16*8) // 8 blocks
	a, b := chain(1, 6), chain(2, 4)
	ix.Insert(0, a)
	ix.Insert(0, b) // 10 blocks: a's two last blocks go
	depth := make([]int, 1)
	ix.Match(a, depth)
	if depth[0] != 4 || ix.Blocks(0) != 8 {
		t.Errorf("a depth %d (want 4), blocks %d (want 8)", depth[0], ix.Blocks(0))
	}
	ix.Insert(0, a[:2]) // a's head is now the most recent
	ix.Insert(0, chain(3, 4))
	ix.Match(a, depth)
	if depth[0] != 2 {
		t.Errorf("a depth %d, want 2 (its recently used head)", depth[0])
	}
	ix.Match(b, depth)
	if depth[0] != 2 {
		t.Errorf("b depth %d, want 2 (tail forgotten first)", depth[0])
	}
	ix.SetCapacity(0, 3)
	if ix.Blocks(0) != 3 || ix.Len() != 3 {
		t.Errorf("after shrinking: %d blocks, %d entries", ix.Blocks(0), ix.Len())
	}
}

// linear is the obvious matcher the bisection must agree with.
func linear(ix *Index, blocks []uint64, depth []int) {
	for r := range depth {
		depth[r] = 0
		for _, h := range blocks {
			if !holds(ix, r, h) {
				break
			}
			depth[r]++
		}
	}
}

func TestMatchAgreesWithLinearScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	const reps = 70
	caps := make([]int, reps)
	for i := range caps {
		caps[i] = 16 * (20 + rng.IntN(200))
	}
	ix := newIndex(t, caps...)
	// Prompts from 30 families; each is a prefix of its family's chain,
	// sometimes diverging into a private tail.
	var prompts [][]uint64
	for range 5000 {
		fam := uint64(rng.IntN(30))
		n := 1 + rng.IntN(80)
		p := chain(fam, n)
		if rng.IntN(3) == 0 {
			k := rng.IntN(n)
			for i := k; i < n; i++ {
				p[i] = rng.Uint64()
			}
		}
		prompts = append(prompts, p)
		ix.Insert(rng.IntN(reps), p)
	}
	got, want := make([]int, reps), make([]int, reps)
	for i, p := range prompts {
		ix.Match(p, got)
		linear(ix, p, want)
		if !slices.Equal(got, want) {
			t.Fatalf("prompt %d: bisection %v, linear %v", i, got, want)
		}
	}
	for r := range reps {
		if ix.Blocks(r) > ix.Capacity(r) {
			t.Errorf("replica %d holds %d blocks > capacity %d", r, ix.Blocks(r), ix.Capacity(r))
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := New(0); err == nil {
		t.Error("zero block size accepted")
	}
}

// TestSlotsAreRecycled: a removed replica's slot goes to the next one added,
// empty, and the others keep what they hold; the index holds MaxReplicas
// replicas at once and refuses one more.
func TestSlotsAreRecycled(t *testing.T) {
	ix := newIndex(t, 1600, 1600, 1600)
	a := chain(1, 10)
	for r := range 3 {
		ix.Insert(r, a[:3+r])
	}
	ix.RemoveReplica(1)
	if ix.Blocks(1) != 0 || ix.Len() != 5 {
		t.Fatalf("after removal: slot 1 holds %d blocks, index %d", ix.Blocks(1), ix.Len())
	}
	slot, err := ix.AddReplica(800)
	if err != nil || slot != 1 || ix.Capacity(1) != 50 {
		t.Fatalf("new replica in slot %d (capacity %d), %v; want the freed slot 1", slot, ix.Capacity(1), err)
	}
	depth := make([]int, ix.Slots())
	ix.Match(a, depth)
	if want := []int{3, 0, 5}; !slices.Equal(depth, want) {
		t.Errorf("depth %v, want %v", depth, want)
	}
	for r := 3; r < MaxReplicas; r++ {
		if _, err := ix.AddReplica(160); err != nil {
			t.Fatalf("replica %d: %v", r, err)
		}
	}
	if _, err := ix.AddReplica(16); err != ErrFull {
		t.Fatalf("replica %d accepted (%v)", MaxReplicas+1, err)
	}
	if ix.Slots() != MaxReplicas {
		t.Errorf("%d slots, want %d", ix.Slots(), MaxReplicas)
	}
	// Every slot in use, and a block held by the last of them matches.
	ix.Insert(MaxReplicas-1, a[:2])
	depth = make([]int, ix.Slots())
	ix.Match(a, depth)
	if depth[MaxReplicas-1] != 2 || depth[2] != 5 {
		t.Errorf("depths %d %d, want 2 and 5", depth[MaxReplicas-1], depth[2])
	}
}

func TestChain(t *testing.T) {
	a := Chain([]byte("hello world, how are you"), 8, nil)
	b := Chain([]byte("hello world, who are you"), 8, nil)
	if len(a) != 3 || len(b) != 3 {
		t.Fatalf("lengths %d %d, want 3", len(a), len(b))
	}
	if a[0] != b[0] || a[1] == b[1] || a[2] == b[2] {
		t.Errorf("a %x b %x: want equal first block only", a, b)
	}
	// Same bytes in block 2 but a different prefix: different hash.
	c := Chain([]byte("HELLO world, how are you"), 8, nil)
	if c[2] == a[2] {
		t.Error("block hash does not depend on its prefix")
	}
	if x, y := ChainIDs([]uint64{1, 2}, nil), ChainIDs([]uint64{2, 2}, nil); x[1] == y[1] {
		t.Error("ChainIDs ignores the prefix")
	}
}

func TestChainIDsIsPositionAware(t *testing.T) {
	a := ChainIDs([]uint64{0, 7}, nil)
	b := ChainIDs([]uint64{7}, nil)
	c := ChainIDs([]uint64{0, 0, 7}, nil)
	if a[1] == b[0] || c[2] == a[1] || a[0] == c[1] {
		t.Errorf("leading zero ids are lost: %x %x %x", a, b, c)
	}
}
