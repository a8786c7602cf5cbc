package prefix

import "github.com/cespare/xxhash/v2"

// Chain turns a prompt's bytes into chained block hashes, one per
// blockBytes bytes (the last block may be shorter), appended to dst. Block
// i's hash depends on its bytes and on block i-1's hash, so equal hashes at
// position i mean equal prompts up to the end of block i.
func Chain(prompt []byte, blockBytes int, dst []uint64) []uint64 {
	h := chainSeed
	for off := 0; off < len(prompt); off += blockBytes {
		end := min(off+blockBytes, len(prompt))
		h = mix(h, xxhash.Sum64(prompt[off:end]))
		dst = append(dst, h)
	}
	return dst
}

// ChainIDs turns a prompt's block ids (for instance a trace's hash ids,
// which may be reused across unrelated traces) into chained hashes.
func ChainIDs(ids []uint64, dst []uint64) []uint64 {
	h := chainSeed
	for _, id := range ids {
		h = mix(h, id)
		dst = append(dst, h)
	}
	return dst
}

// chainSeed starts every chain, so that no block hash is zero-sensitive:
// with a zero start, a leading block whose own hash is 0 would vanish.
const chainSeed uint64 = 0x243f6a8885a308d3

// mix combines a parent hash and a block's own hash (a 64-bit finaliser
// applied to an asymmetric combination, so that order matters).
func mix(parent, block uint64) uint64 { return Fmix64(parent*0x9e3779b97f4a7c15 ^ block) }

// Fmix64 is MurmurHash3's 64-bit finaliser: every bit of x affects every
// bit of the result.
func Fmix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// ModelKey is the key of a served model's share of a prefix cache (see
// Keyed): 0 for none (a request that names no model), else a hash of the
// name.
func ModelKey(model string) uint64 {
	if model == "" {
		return 0
	}
	return Fmix64(xxhash.Sum64String(model) | 1)
}

// Keyed makes a prompt's chained block hashes the model's (key from
// ModelKey), in place: engines key their prefix caches by model and
// adapter (a prompt cached for one adapter is no hit for another), so a
// router's index must too. Key 0 leaves the hashes as they are.
func Keyed(blocks []uint64, key uint64) []uint64 {
	if key == 0 {
		return blocks
	}
	for i, b := range blocks {
		blocks[i] = mix(key, b)
	}
	return blocks
}

// CommonPrefix is how many leading blocks two chains share: a chain's hash
// depends on every block before it, so they agree up to some block and
// differ from it on, and a binary search finds where.
func CommonPrefix(a, b []uint64) int {
	lo, hi := 0, min(len(a), len(b)) // a[:lo] == b[:lo]; they differ before hi, or hi is the end
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if a[mid-1] == b[mid-1] {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// ValidEnds reports whether ends marks where a batch's chains end in n
// blocks, laid end to end: not decreasing (an empty prompt has no
// blocks), the last n.
func ValidEnds(ends []int, n int) bool {
	prev := 0
	for _, e := range ends {
		if e < prev {
			return false
		}
		prev = e
	}
	return len(ends) > 0 && prev == n
}
