package policy

import (
	"math/rand/v2"

	"github.com/cespare/xxhash/v2"

	"github.com/gorgo-llm/gorgo/internal/prefix"
)

// simpleAffinity is the paper's "session affinity": the hash of the
// prompt's first 256 tokens (Request.PrefixKey) modulo the number of
// available replicas, which are counted in the order of their ids
// (whatever order the router holds them in: the simulator and the proxy
// split sessions alike); the fallbacks follow that order. When the number
// changes (a replica is down or drained) most sessions move, as with any
// modulo hash; session-affinity (rendezvous hashing) is the one that moves
// only the lost replica's.
type simpleAffinity struct{}

func (simpleAffinity) Name() string { return "simple-session-affinity" }

func (simpleAffinity) Decide(d *Decision, req *Request, reps []Replica, _ *rand.Rand) error {
	n := len(reps)
	start := int(req.PrefixKey % uint64(n))
	d.Scores = d.Scores[:0]
	for i := range reps {
		rank := 0 // replicas whose ids sort before this one's
		for j := range reps {
			if reps[j].ID < reps[i].ID {
				rank++
			}
		}
		d.Scores = append(d.Scores, Terms{Total: float64((rank - start + n) % n)})
		if rank == start {
			d.Replica = i
		}
	}
	return nil
}

// rendezvous is session affinity by rendezvous (highest random weight)
// hashing on the session key: a session stays on its replica, and when a
// replica leaves only its own sessions move. Without a session key it hashes
// the prompt's prefix key instead. The fallbacks follow the weights.
type rendezvous struct{}

func (rendezvous) Name() string { return "session-affinity" }

func (rendezvous) Decide(d *Decision, req *Request, reps []Replica, _ *rand.Rand) error {
	d.Scores = d.Scores[:0]
	key := req.PrefixKey
	if req.SessionKey != "" {
		key = xxhash.Sum64String(req.SessionKey)
	}
	best := 0
	var bestW uint64
	for i := range reps {
		w := prefix.Fmix64(key ^ xxhash.Sum64String(reps[i].ID))
		// The highest weight ranks first: score by its complement.
		d.Scores = append(d.Scores, Terms{Total: float64(^w)})
		if i == 0 || w > bestW {
			best, bestW = i, w
		}
	}
	d.Replica = best
	return nil
}
