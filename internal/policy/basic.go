package policy

import "math/rand/v2"

// rotation scores the replicas by their distance after start in view
// order, so that the fallbacks after a policy's choice follow the order it
// would have taken them in.
func rotation(d *Decision, n, start int) {
	d.Scores = d.Scores[:0]
	for i := range n {
		d.Scores = append(d.Scores, Terms{Total: float64((i - start + n) % n)})
	}
	d.Replica = start
}

// roundRobin cycles through the available replicas. Not safe for
// concurrent use (the router serialises decisions).
type roundRobin struct{ next int }

func (*roundRobin) Name() string { return "round-robin" }

func (p *roundRobin) Decide(d *Decision, _ *Request, reps []Replica, _ *rand.Rand) error {
	rotation(d, len(reps), p.next%len(reps))
	p.next++
	return nil
}

// random picks a replica uniformly.
type random struct{}

func (random) Name() string { return "random" }

func (random) Decide(d *Decision, _ *Request, reps []Replica, rng *rand.Rand) error {
	rotation(d, len(reps), rng.IntN(len(reps)))
	return nil
}

// leastRequest picks the replica with the fewest requests, counting the
// larger of the router's requests in flight and the engine's last scraped
// running requests (as the paper's baseline does); ties at random.
type leastRequest struct{}

func (leastRequest) Name() string { return "least-request" }

func (leastRequest) Decide(d *Decision, _ *Request, reps []Replica, _ *rand.Rand) error {
	counts(d, reps, requests)
	return nil
}

// requests is the request count least-request and prefix-cache compare.
func requests(r *Replica) int { return max(r.InFlight, r.Engine.Running) }

// counts scores every replica by an integer key, least first, exact ties.
func counts(d *Decision, reps []Replica, key func(*Replica) int) {
	d.Scores = d.Scores[:0]
	for i := range reps {
		d.Scores = append(d.Scores, Terms{Total: float64(key(&reps[i]))})
	}
	d.Replica, d.ExactTies = ByScore, true
}

// powerOfTwo samples two distinct replicas and keeps the one with fewer
// requests in flight (the first sampled on a tie); the other sample is the
// first fallback.
type powerOfTwo struct{}

func (powerOfTwo) Name() string { return "power-of-two" }

func (powerOfTwo) Decide(d *Decision, _ *Request, reps []Replica, rng *rand.Rand) error {
	n := len(reps)
	if n == 1 {
		return random{}.Decide(d, nil, reps, rng)
	}
	a := rng.IntN(n)
	b := rng.IntN(n - 1)
	if b >= a {
		b++
	}
	if reps[b].InFlight < reps[a].InFlight {
		a, b = b, a
	}
	rotation(d, n, a)
	d.Scores[a].Total, d.Scores[b].Total = -2, -1
	return nil
}
