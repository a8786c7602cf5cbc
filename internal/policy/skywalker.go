package policy

import "math/rand/v2"

// SkyWalkerThreshold is how many requests waiting for their first token a
// local replica may have before skywalker looks to other regions.
const SkyWalkerThreshold = 4

// skyWalker is our reading of SkyWalker (EuroSys '26, "a locality-aware
// cross-region load balancer for LLM inference"), which publishes no code:
// a balancer in each region serves its region's traffic locally, and pushes
// a request to another region only when the local pending work is high.
//
//   - Pending work at a replica is the requests this router sent there
//     that have not produced a first token (waiting or prefilling).
//   - Local first: if some replica in the router's region has fewer than
//     SkyWalkerThreshold pending, the request stays in the region, on the
//     local replica holding the longest cached prefix among those, the least
//     pending on a tie.
//   - Otherwise it goes to the replica of least pending work among those
//     (in any region) holding part of its prefix, if that is less than the
//     best local replica's; else to the least pending replica anywhere.
//
// It knows nothing of the network beyond "local or not". What it knows of
// other routers' requests depends on what the routers share (a mesh's
// variants), as for every policy.
type skyWalker struct{ region string }

// newSkyWalker makes the policy for a router in o.Region; with no region
// no replica is local, and it balances pending work, prefix holders first.
func newSkyWalker(o Options) (Policy, error) { return &skyWalker{region: o.Region}, nil }

func (*skyWalker) Name() string { return "skywalker" }

func (p *skyWalker) Decide(d *Decision, req *Request, reps []Replica, _ *rand.Rand) error {
	d.Scores = d.Scores[:0]
	pending := func(r *Replica) int { return max(r.InFlight-r.Decoding, 0) }
	// Score: local replicas under the threshold first (by prefix, then
	// pending), then every replica by pending work, prefix holders first.
	bestLocal, bestHolder, minLocal := -1, -1, -1
	local := func(r *Replica) bool { return p.region != "" && r.Region == p.region }
	for i := range reps {
		r := &reps[i]
		if local(r) && (minLocal < 0 || pending(r) < minLocal) {
			minLocal = pending(r)
		}
		if local(r) && pending(r) < SkyWalkerThreshold {
			if bestLocal < 0 || r.CachedTokens > reps[bestLocal].CachedTokens ||
				r.CachedTokens == reps[bestLocal].CachedTokens && pending(r) < pending(&reps[bestLocal]) {
				bestLocal = i
			}
		}
		if r.CachedTokens > 0 && (bestHolder < 0 || pending(r) < pending(&reps[bestHolder])) {
			bestHolder = i
		}
	}
	for i := range reps {
		r := &reps[i]
		t := Terms{Queue: float64(pending(r))}
		switch {
		case i == bestLocal:
			t.Total = -2
		case bestLocal < 0 && i == bestHolder && (minLocal < 0 || pending(r) < minLocal):
			t.Total = -1
		default:
			t.Total = t.Queue
			if local(r) {
				t.Total -= 0.5 // stay local on a tie
			}
		}
		d.Scores = append(d.Scores, t)
	}
	d.Replica, d.ExactTies = ByScore, true
	return nil
}
