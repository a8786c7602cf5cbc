package route

import "math/rand/v2"

// roundRobin cycles through the healthy replicas. Not safe for concurrent use.
type roundRobin struct{ next int }

func (*roundRobin) Name() string { return "round-robin" }

func (p *roundRobin) Decide(d *Decision, _ *Request, reps []Replica, _ *rand.Rand) error {
	d.Scores = d.Scores[:0]
	for range reps {
		i := p.next % len(reps)
		p.next++
		if reps[i].Healthy {
			d.Replica = i
			return nil
		}
	}
	return ErrNoReplica
}

// random picks a healthy replica uniformly.
type random struct{}

func (random) Name() string { return "random" }

func (random) Decide(d *Decision, _ *Request, reps []Replica, rng *rand.Rand) error {
	d.Scores = d.Scores[:0]
	n := 0
	for i := range reps {
		if reps[i].Healthy {
			n++
		}
	}
	if n == 0 {
		return ErrNoReplica
	}
	d.Replica = nthHealthy(reps, rng.IntN(n))
	return nil
}

// leastRequest picks the replica with the fewest requests, counting the
// larger of the router's requests in flight and the engine's last scraped
// running requests (as the paper's baseline does); ties at random.
type leastRequest struct{}

func (leastRequest) Name() string { return "least-request" }

func (leastRequest) Decide(d *Decision, _ *Request, reps []Replica, rng *rand.Rand) error {
	d.Scores = d.Scores[:0]
	return argminInt(d, reps, rng, requests)
}

// requests is the request count least-request and prefix-cache compare.
func requests(r *Replica) int { return max(r.InFlight, r.Engine.Running) }

// argminInt picks the healthy replica with the least key, breaking ties
// uniformly at random.
func argminInt(d *Decision, reps []Replica, rng *rand.Rand, key func(*Replica) int) error {
	best, bestKey, ties := -1, 0, 0
	for i := range reps {
		if !reps[i].Healthy {
			continue
		}
		k := key(&reps[i])
		switch {
		case best < 0 || k < bestKey:
			best, bestKey, ties = i, k, 1
		case k == bestKey:
			// Reservoir sampling keeps each tied replica with equal chance.
			ties++
			if rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if best < 0 {
		return ErrNoReplica
	}
	d.Replica = best
	return nil
}

// powerOfTwo samples two distinct healthy replicas and keeps the one with
// fewer requests in flight (the first sampled on a tie).
type powerOfTwo struct{}

func (powerOfTwo) Name() string { return "power-of-two" }

func (powerOfTwo) Decide(d *Decision, _ *Request, reps []Replica, rng *rand.Rand) error {
	d.Scores = d.Scores[:0]
	n := 0
	for i := range reps {
		if reps[i].Healthy {
			n++
		}
	}
	switch n {
	case 0:
		return ErrNoReplica
	case 1:
		return random{}.Decide(d, nil, reps, rng)
	}
	a := rng.IntN(n)
	b := rng.IntN(n - 1)
	if b >= a {
		b++
	}
	ia, ib := nthHealthy(reps, a), nthHealthy(reps, b)
	d.Replica = ia
	if reps[ib].InFlight < reps[ia].InFlight {
		d.Replica = ib
	}
	return nil
}

// nthHealthy returns the index of the k-th (0-based) healthy replica.
func nthHealthy(reps []Replica, k int) int {
	for i := range reps {
		if reps[i].Healthy {
			if k == 0 {
				return i
			}
			k--
		}
	}
	panic("route: fewer healthy replicas than counted")
}
