package report

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// Spread is the least and greatest of a figure over several runs.
type Spread struct {
	Lo, Hi float64
	N      int
}

// Add widens s to take v in.
func (s Spread) Add(v float64) Spread {
	if s.N == 0 || v < s.Lo {
		s.Lo = v
	}
	if s.N == 0 || v > s.Hi {
		s.Hi = v
	}
	s.N++
	return s
}

// Outside is how far v lies outside s, relative to its nearer end: 0
// within it, positive above, negative below.
func (s Spread) Outside(v float64) float64 {
	switch {
	case s.N == 0:
		return 0
	case v > s.Hi:
		return v/s.Hi - 1
	case v < s.Lo:
		return v/s.Lo - 1
	}
	return 0
}

// WriteAgreement prints, one row per policy, a live run's p95 TTFT against
// the simulated run's and against the spread of the simulated runs' p95
// TTFT (spreads[i] for live[i]: the simulated run and its perturbed
// copies): how far the live run is from the simulated one, and whether it
// falls within the spread or how far outside it.
func WriteAgreement(w io.Writer, live, simulated []Run, spreads []Spread) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tlive p95 TTFT\tsimulated\tsimulated range\tlive vs simulated\tlive vs range\t")
	for i, l := range live {
		s := simulated[i]
		in := "within"
		if o := spreads[i].Outside(l.TTFT.P95); o != 0 {
			in = fmt.Sprintf("%+.1f%%", 100*o)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s–%s\t%+.1f%%\t%s\t\n", l.Policy, ms(l.TTFT.P95), ms(s.TTFT.P95),
			ms(spreads[i].Lo), ms(spreads[i].Hi), 100*(l.TTFT.P95/s.TTFT.P95-1), in)
	}
	return tw.Flush()
}
