package policy

import (
	"math/rand/v2"

	"github.com/cespare/xxhash/v2"

	"github.com/gorgo-llm/gorgo/internal/prefix"
)

// simpleAffinity is the paper's "session affinity": the hash of the
// prompt's first 256 tokens (Request.PrefixKey) modulo the number of
// available replicas. When that number changes (a replica is down or
// drained) most sessions move, as with any modulo hash; session-affinity
// (rendezvous hashing) is the one that moves only the lost replica's.
type simpleAffinity struct{}

func (simpleAffinity) Name() string { return "simple-session-affinity" }

func (simpleAffinity) Decide(d *Decision, req *Request, reps []Replica, _ *rand.Rand) error {
	rotation(d, len(reps), int(req.PrefixKey%uint64(len(reps))))
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
