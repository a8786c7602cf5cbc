package tune

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// BenchmarkOnlineLearn is the tuner's work per outcome, with gorgo serve's
// window and early stop: the early stop reads both arms' percentiles after
// every outcome, from tallies kept sorted as the outcomes come.
func BenchmarkOnlineLearn(b *testing.B) {
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1}, Base: policy.DefaultName, Window: 256, Hop: 1, EarlyStop: 1.5})
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
}
