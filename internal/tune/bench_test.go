package tune

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// BenchmarkOnlineLearn is the tuner's work per decision and outcome, with
// gorgo serve's window, and its early stop on (1.5) and off (0): the early
// stop reads both arms' percentiles after every outcome, from tallies kept
// sorted as the outcomes come.
func BenchmarkOnlineLearn(b *testing.B) {
	for _, stop := range []float64{1.5, 0} {
		b.Run(fmt.Sprintf("early-stop=%g", stop), func(b *testing.B) {
			o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1}, Base: policy.DefaultName, Window: 256, Hop: 1, EarlyStop: stop})
			if err != nil {
				b.Fatal(err)
			}
			reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
			rng := rand.New(rand.NewPCG(1, 1))
			var d policy.Decision
			req := &policy.Request{PromptTokens: 100}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				if err := o.Decide(&d, req, reps, rng); err != nil {
					b.Fatal(err)
				}
				i++
				// Both arms alike, so that rounds run to their full window.
				o.Learn(d.Tag, policy.Outcome{TTFT: time.Duration(i*7919%1000) * time.Millisecond, E2E: time.Duration(i*104729%5000) * time.Millisecond, ITL: 10 * time.Millisecond})
			}
		})
	}
}

// benchSamples are an arm's outcomes at its largest: two windows of
// gorgo serve's 256.
func benchSamples() []Sample {
	s := make([]Sample, 512)
	for i := range s {
		s[i] = Sample{TTFT: time.Duration(i*7919%1000) * time.Millisecond, E2E: time.Duration(i*104729%5000) * time.Millisecond, ITL: 10 * time.Millisecond}
	}
	return s
}

// BenchmarkMeasure is a measurement made afresh: copy and sort an arm's
// outcomes (what the early stop would pay after every outcome without
// tallies).
func BenchmarkMeasure(b *testing.B) {
	s := benchSamples()
	b.ReportAllocs()
	for b.Loop() {
		Measure(s)
	}
}

// BenchmarkTally is what the early stop pays per outcome: fold one into a
// tally of up to 512 and read its metrics.
func BenchmarkTally(b *testing.B) {
	s := benchSamples()
	var t tally
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		if t.n == len(s) {
			t.rebuild(nil)
		}
		t.add(s[i%len(s)])
		i++
		_ = t.metrics()
	}
}
