package route

import (
	"math/rand/v2"

	"github.com/cespare/xxhash/v2"
)

// simpleAffinity is the paper's "session affinity": the hash of the
// prompt's first 256 tokens (Request.PrefixKey) modulo the number of
// replicas. If that replica is unhealthy, the next healthy one in order
// takes the request, so the others keep their sessions.
type simpleAffinity struct{}

func (simpleAffinity) Name() string { return "simple-session-affinity" }

func (simpleAffinity) Decide(d *Decision, req *Request, reps []Replica, _ *rand.Rand) error {
	d.Scores = d.Scores[:0]
	n := len(reps)
	if n == 0 {
		return ErrNoReplica
	}
	start := int(req.PrefixKey % uint64(n))
	for k := range n {
		if i := (start + k) % n; reps[i].Healthy {
			d.Replica = i
			return nil
		}
	}
	return ErrNoReplica
}

// rendezvous is session affinity by rendezvous (highest random weight)
// hashing on the session key: a session stays on its replica, and when a
// replica leaves only its own sessions move. Without a session key it hashes
// the prompt's prefix key instead.
type rendezvous struct{}

func (rendezvous) Name() string { return "session-affinity" }

func (rendezvous) Decide(d *Decision, req *Request, reps []Replica, _ *rand.Rand) error {
	d.Scores = d.Scores[:0]
	key := req.PrefixKey
	if req.SessionKey != "" {
		key = xxhash.Sum64String(req.SessionKey)
	}
	best := -1
	var bestW uint64
	for i := range reps {
		if !reps[i].Healthy {
			continue
		}
		w := mix64(key ^ xxhash.Sum64String(reps[i].ID))
		if best < 0 || w > bestW {
			best, bestW = i, w
		}
	}
	if best < 0 {
		return ErrNoReplica
	}
	d.Replica = best
	return nil
}

// mix64 is a 64-bit finaliser (MurmurHash3's fmix64).
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
