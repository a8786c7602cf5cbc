package tune

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/report"
)

// Sample is one request's outcome, as the router saw it.
type Sample = policy.Outcome

// Metrics summarise the samples of one measurement, in ms.
type Metrics struct {
	N, Failed                 int
	TTFTP50, TTFTP95, TTFTP99 float64
	E2EP95                    float64
	// E2EPerTokenP95 is the p95 of each request's E2E over its answer's
	// tokens (ms a token), over the PerTokenN requests whose length is
	// known.
	E2EPerTokenP95 float64
	PerTokenN      int
	ITLMean        float64
	// SLON is how many completed requests had SLOs, SLOP95 the p95 of
	// their SLO ratios (policy.Outcome.SLORatio): about 1 when 95% of
	// them met their SLOs, below when more did.
	SLON   int
	SLOP95 float64
}

// Measure summarises samples. Failed requests count in N and Failed only.
func Measure(samples []Sample) Metrics {
	var t tally
	t.rebuild(samples)
	return t.metrics()
}

// tally is a measurement kept up to date outcome by outcome: the TTFTs
// and E2Es sorted, so that its percentiles are read without sorting.
type tally struct {
	n, failed int
	ttft, e2e []float64 // ms, sorted
	perToken  []float64 // ms a token, sorted
	itl       float64   // ms, summed over nitl outcomes
	nitl      int
	slo       []float64 // SLO ratios of the outcomes that have them, sorted
}

// count counts an outcome and its ITL, and reports whether it completed
// (a failure has no TTFT or E2E to sort in).
func (t *tally) count(s Sample) bool {
	t.n++
	if s.Failed {
		t.failed++
		return false
	}
	if s.ITL > 0 {
		t.itl += ms(s.ITL)
		t.nitl++
	}
	return true
}

// add folds in one outcome: an insertion into each sorted slice (a
// whole answer has no TTFT to sort in).
func (t *tally) add(s Sample) {
	if t.count(s) {
		if !s.Unstreamed {
			t.ttft = insertSorted(t.ttft, ms(s.TTFT))
		}
		t.e2e = insertSorted(t.e2e, ms(s.E2E))
		if s.Tokens > 0 {
			t.perToken = insertSorted(t.perToken, ms(s.E2E)/float64(s.Tokens))
		}
		if r, ok := s.SLORatio(); ok {
			t.slo = insertSorted(t.slo, r)
		}
	}
}

// rebuild makes the tally that of samples alone.
func (t *tally) rebuild(samples []Sample) {
	t.n, t.failed, t.ttft, t.e2e, t.perToken, t.itl, t.nitl, t.slo = 0, 0, t.ttft[:0], t.e2e[:0], t.perToken[:0], 0, 0, t.slo[:0]
	for _, s := range samples {
		if t.count(s) {
			if !s.Unstreamed {
				t.ttft = append(t.ttft, ms(s.TTFT))
			}
			t.e2e = append(t.e2e, ms(s.E2E))
			if s.Tokens > 0 {
				t.perToken = append(t.perToken, ms(s.E2E)/float64(s.Tokens))
			}
			if r, ok := s.SLORatio(); ok {
				t.slo = append(t.slo, r)
			}
		}
	}
	slices.Sort(t.ttft)
	slices.Sort(t.e2e)
	slices.Sort(t.perToken)
	slices.Sort(t.slo)
}

func (t *tally) metrics() Metrics {
	m := Metrics{N: t.n, Failed: t.failed,
		TTFTP50: report.Percentile(t.ttft, 0.50), TTFTP95: report.Percentile(t.ttft, 0.95),
		TTFTP99: report.Percentile(t.ttft, 0.99), E2EP95: report.Percentile(t.e2e, 0.95), E2EPerTokenP95: report.Percentile(t.perToken, 0.95), PerTokenN: len(t.perToken),
		SLON: len(t.slo), SLOP95: report.Percentile(t.slo, 0.95)}
	if t.nitl > 0 {
		m.ITLMean = t.itl / float64(t.nitl)
	}
	return m
}

func insertSorted(xs []float64, x float64) []float64 {
	i, _ := slices.BinarySearch(xs, x)
	return slices.Insert(xs, i, x)
}

// FromRun reads the metrics of a simulator or replay run summary.
func FromRun(r report.Run) Metrics {
	return Metrics{N: r.Requests, Failed: r.Failed, TTFTP50: r.TTFT.P50, TTFTP95: r.TTFT.P95, TTFTP99: r.TTFT.P99,
		E2EP95: r.E2E.P95, ITLMean: r.ITL.Mean}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Objective names the metric the tuner minimises.
type Objective string

// Objectives.
const (
	P50TTFT Objective = "p50-ttft"
	P95TTFT Objective = "p95-ttft"
	P99TTFT Objective = "p99-ttft"
	P95E2E  Objective = "p95-e2e"
	// P95E2EPerToken is the p95 of each request's E2E over its answer's
	// tokens (the normalised latency of serving papers): the end-to-end
	// latency with the answers' lengths, which the router does not
	// choose and which make a window's p95 E2E mostly theirs, divided
	// out.
	P95E2EPerToken Objective = "p95-e2e-per-token"
	// SLOP95 is the p95 of the requests' SLO ratios (each request's time
	// to first token since it reached the router over its TTFT SLO, or
	// its time per output token over its TPOT SLO, whichever is nearer
	// missing): about 1 when 95% of the requests with SLOs met them,
	// below when more did. It ranks arms where SLO goodput cannot: at a
	// load where nearly every request meets its SLO both arms of a window
	// of a few hundred requests miss none, yet one may come nearer. Only
	// requests with SLOs count (online tuning only: Online judges windows
	// of them).
	SLOP95 Objective = "slo-p95"
)

// Format writes a value of the objective: ms to the ms, a ratio to the
// thousandth.
func (o Objective) Format(v float64) string {
	if o == SLOP95 {
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

// Objectives lists the valid objectives.
func Objectives() []Objective {
	return []Objective{P50TTFT, P95TTFT, P99TTFT, P95E2E, P95E2EPerToken, SLOP95}
}

// Of returns the objective's value over the completed requests (Judge
// rejects a candidate that fails more requests than the incumbent).
func (o Objective) Of(m Metrics) (float64, error) {
	var v float64
	switch o {
	case P50TTFT:
		v = m.TTFTP50
	case P95TTFT:
		v = m.TTFTP95
	case P99TTFT:
		v = m.TTFTP99
	case P95E2E:
		v = m.E2EP95
	case P95E2EPerToken:
		if m.PerTokenN == 0 {
			return math.NaN(), nil
		}
		v = m.E2EPerTokenP95
	case SLOP95:
		if m.SLON == 0 {
			return math.NaN(), nil
		}
		v = m.SLOP95
	default:
		return 0, fmt.Errorf("unknown objective %q (valid: p50-ttft, p95-ttft, p99-ttft, p95-e2e, p95-e2e-per-token, slo-p95)", string(o))
	}
	if m.N == m.Failed {
		return math.NaN(), nil
	}
	return v, nil
}

// Guard rejects a candidate whose Metric is worse than the incumbent's by
// more than a factor (candidate ≤ MaxRatio × incumbent), counting the drift
// of the incumbent since the start (see ES.Judge).
type Guard struct {
	Metric   string // "e2e-p95" or "itl-mean"
	MaxRatio float64
}

// Guard metrics.
var guardMetrics = map[string]func(Metrics) float64{
	"e2e-p95":  func(m Metrics) float64 { return m.E2EP95 },
	"itl-mean": func(m Metrics) float64 { return m.ITLMean },
}

// ratio is the guarded metric of the candidate over the incumbent's.
func (g Guard) ratio(cand, inc Metrics) float64 {
	f := guardMetrics[g.Metric]
	switch c, i := f(cand), f(inc); {
	case c <= 0 || math.IsNaN(c) || i <= 0 || math.IsNaN(i):
		// A window measured none of it (no streamed answer of several
		// tokens, say): no evidence either way. A ratio of 0 would zero
		// the guard's drift, and switch the guard off for good; +Inf
		// would reject a candidate for the incumbent's want of a measure
		// (2026-12-06, a review).
		return 1
	default:
		return c / i
	}
}

// String formats the guard as ParseGuard reads it.
func (g Guard) String() string { return g.Metric + "=" + strconv.FormatFloat(g.MaxRatio, 'g', -1, 64) }

// ParseGuard reads "METRIC=RATIO", e.g. "e2e-p95=1.05": reject a candidate
// whose p95 E2E exceeds 1.05 times the incumbent's.
func ParseGuard(s string) (Guard, error) {
	k, v, ok := strings.Cut(s, "=")
	r, err := strconv.ParseFloat(v, 64)
	if _, known := guardMetrics[k]; !ok || !known || err != nil || !(r >= 1) || math.IsInf(r, 0) {
		return Guard{}, fmt.Errorf("bad guard %q: want e2e-p95=RATIO or itl-mean=RATIO with a finite RATIO >= 1", s)
	}
	return Guard{Metric: k, MaxRatio: r}, nil
}
