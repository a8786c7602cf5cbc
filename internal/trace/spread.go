package trace

import (
	"cmp"
	"iter"
	"math/rand/v2"
	"slices"
	"time"
)

// Spread moves the requests that share an arrival time apart: each group of
// requests arriving at the same instant is spread at random over the gap to
// the next distinct arrival time (the last group over the median such gap),
// keeping the requests' order. A trace recorded in coarse ticks (the
// Mooncake conversation trace's are 3 s) otherwise replays as synchronised
// bursts, a dozen requests in the same microsecond, which no fleet of
// independent clients sends. reqs must be in time order; Spread changes
// their times in place and returns them. The same seed spreads the same way.
func Spread(reqs []Request, seed uint64) []Request {
	var gaps []time.Duration
	for i := 1; i < len(reqs); i++ {
		if d := reqs[i].Time - reqs[i-1].Time; d > 0 {
			gaps = append(gaps, d)
		}
	}
	if len(gaps) == 0 {
		return reqs // one instant, or none: nothing to spread over
	}
	slices.Sort(gaps)
	last := gaps[len(gaps)/2]
	rng := rand.New(rand.NewPCG(seed, 0x5eed5eed))
	var offsets []float64
	for i, j := range instants(reqs) {
		if j-i < 2 {
			continue
		}
		gap := last
		if j < len(reqs) {
			gap = reqs[j].Time - reqs[i].Time
		}
		// The instant's first request keeps its time; the others take
		// sorted draws, so their order holds.
		offsets = offsets[:0]
		for range j - i - 1 {
			offsets = append(offsets, rng.Float64())
		}
		slices.Sort(offsets)
		t0 := reqs[i].Time
		for k, u := range offsets {
			reqs[i+1+k].Time = t0 + time.Duration(u*float64(gap))
		}
	}
	return reqs
}

// instants yields, for reqs in time order, each run of requests that
// arrive at the same instant as [i, j).
func instants(reqs []Request) iter.Seq2[int, int] {
	return func(yield func(int, int) bool) {
		for i := 0; i < len(reqs); {
			j := i + 1
			for j < len(reqs) && reqs[j].Time == reqs[i].Time {
				j++
			}
			if !yield(i, j) {
				return
			}
			i = j
		}
	}
}

// simultaneity counts the distinct arrival times of reqs (in time order),
// the requests that share theirs with another, and the largest such group.
func simultaneity(reqs []Request) (distinct, shared, largest int) {
	for i, j := range instants(reqs) {
		distinct++
		if n := j - i; n > 1 {
			shared += n
			largest = max(largest, n)
		}
	}
	return distinct, shared, largest
}

// Perturb returns a copy of reqs with each arrival moved by a uniform draw
// in [−d, d] (not before 0), in their new time order: requests closer
// than 2d may swap. A live replay's arrivals differ from the trace's by
// about the machine's scheduling noise, and a policy whose decisions
// depend on the order or the timing of arrivals can amplify that into a
// different run; simulating perturbed copies shows how far. reqs is not
// changed. The same seed moves them the same way.
func Perturb(reqs []Request, d time.Duration, seed uint64) []Request {
	out := slices.Clone(reqs)
	if d <= 0 {
		return out
	}
	rng := rand.New(rand.NewPCG(seed, 0x9e7b))
	for i := range out {
		shift := time.Duration((2*rng.Float64() - 1) * float64(d))
		out[i].Time = max(out[i].Time+shift, 0)
	}
	slices.SortStableFunc(out, func(a, b Request) int { return cmp.Compare(a.Time, b.Time) })
	return out
}
