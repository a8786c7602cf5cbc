package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
)

// Spread is a figure's values over several runs: its least, greatest and
// median.
type Spread struct {
	vals []float64
}

// Add returns s with v taken in.
func (s Spread) Add(v float64) Spread {
	s.vals = append(slices.Clip(s.vals), v)
	return s
}

// N is the number of values taken in.
func (s Spread) N() int { return len(s.vals) }

// Lo is the least value (0 if none).
func (s Spread) Lo() float64 {
	if len(s.vals) == 0 {
		return 0
	}
	return slices.Min(s.vals)
}

// Hi is the greatest value (0 if none).
func (s Spread) Hi() float64 {
	if len(s.vals) == 0 {
		return 0
	}
	return slices.Max(s.vals)
}

// Median is the middle value, or the mean of the middle two (0 if none).
func (s Spread) Median() float64 {
	n := len(s.vals)
	if n == 0 {
		return 0
	}
	v := slices.Sorted(slices.Values(s.vals))
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// Outside is how far v lies outside s, relative to its nearer end: 0
// within it, positive above, negative below.
func (s Spread) Outside(v float64) float64 {
	switch lo, hi := s.Lo(), s.Hi(); {
	case s.N() == 0, v > hi && hi <= 0, v < lo && lo <= 0:
		return 0 // nothing, or nothing to measure against
	case v > hi:
		return v/hi - 1
	case v < lo:
		return v/lo - 1
	}
	return 0
}

// AsFar is how many of s's values lie at least as far from its median as
// v does, either side: how ordinary v would be among them (the live run
// among the simulated draws: a policy whose draws spread widely has many
// as far, where one that is steady has few).
func (s Spread) AsFar(v float64) int {
	m, n := s.Median(), 0
	for _, x := range s.vals {
		if math.Abs(x-m) >= math.Abs(v-m) {
			n++
		}
	}
	return n
}

// WriteAgreement prints, one row per policy, a live run's p95 TTFT against
// the simulator's: the simulated run's (simulated[i], the one the tables
// show), and the median and range of the simulated runs' (spreads[i]: the
// run and its copies under other draws of what the live run cannot
// reproduce), with how far the live run is from that median, how many of
// the simulated runs are as far from it (AsFar), and whether it falls
// within the range or how far outside it.
func WriteAgreement(w io.Writer, live, simulated []Run, spreads []Spread) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tlive p95 TTFT\tsimulated\tsimulated median\tsimulated range\tlive vs median\tdraws as far\tlive vs range\t")
	for i, l := range live {
		s, sp := simulated[i], spreads[i]
		in := "within"
		if o := sp.Outside(l.TTFT.P95); o != 0 {
			in = fmt.Sprintf("%+.1f%%", 100*o)
		}
		vs := "–" // no median to compare with
		if m := sp.Median(); m > 0 {
			vs = fmt.Sprintf("%+.1f%%", 100*(l.TTFT.P95/m-1))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s–%s\t%s\t%d of %d\t%s\t\n", l.Policy, ms(l.TTFT.P95), ms(s.TTFT.P95),
			ms(sp.Median()), ms(sp.Lo()), ms(sp.Hi()), vs, sp.AsFar(l.TTFT.P95), sp.N(), in)
	}
	return tw.Flush()
}
