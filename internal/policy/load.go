package policy

import (
	"math"
	"math/rand/v2"
)

// leastLoad is the paper's least-load baseline: the replica with the least
// scraped running + waiting requests + KV tokens in use, plus the prompt
// tokens this router sent there that have not finished, summed raw (the
// token terms dominate, as in the reference); ties at random.
type leastLoad struct{}

func (leastLoad) Name() string { return "least-load" }

func (leastLoad) Decide(d *Decision, _ *Request, reps []Replica, _ *rand.Rand) error {
	counts(d, reps, load)
	return nil
}

func load(r *Replica) int {
	return r.Engine.Running + r.Engine.Waiting + r.Engine.KVUsedTokens + r.UnfinishedTokens
}

// prefixCache is the AIBrix-style prefix-cache router, as the paper ran it:
//  1. if the scraped running requests differ by more than 8 between
//     replicas, least-request;
//  2. if no replica holds any of the prompt's prefix, least-request;
//  3. otherwise, among the replicas with the longest cached prefix, those
//     whose running requests are at most mean + 2·stddev of those replicas',
//     the one with the fewest running requests; ties at random.
//
// The filter in 3 never removes the candidate with the fewest running
// requests (a minimum is at most the mean), so the rule reduces to the
// least-running replica among those with the longest prefix.
type prefixCache struct{}

// PrefixCacheSpread is the imbalance in running requests beyond which
// prefix-cache falls back to least-request.
const PrefixCacheSpread = 8

func (prefixCache) Name() string { return "prefix-cache" }

func (prefixCache) Decide(d *Decision, req *Request, reps []Replica, _ *rand.Rand) error {
	lo, hi, longest := math.MaxInt, math.MinInt, 0
	for i := range reps {
		r := &reps[i]
		lo, hi = min(lo, r.Engine.Running), max(hi, r.Engine.Running)
		longest = max(longest, r.CachedTokens)
	}
	if hi-lo > PrefixCacheSpread || longest == 0 {
		counts(d, reps, requests)
		return nil
	}
	// The replicas with the longest prefix, by running requests; the
	// others tie last (as the reference's filter leaves them out).
	counts(d, reps, func(r *Replica) int {
		if r.CachedTokens < longest {
			return math.MaxInt
		}
		return r.Engine.Running
	})
	return nil
}
