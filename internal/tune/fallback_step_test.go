package tune

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// After a change of the fleet the tuner explores the new fleet with its
// first step size (docs/architecture.md "The tuner", docs/results.md
// "Why the paper's way...": "it falls back to its starting weights, its
// first step size and no guard drift"), also one that never accepted a
// candidate (2026-12-05: it kept the step its rejections had shrunk on the
// old fleet, at the floor after some 30 of them, and searched the new one
// in steps of 2%, which the noise of a p95 over a window hides).
func TestFleetChangeRestoresTheFirstStep(t *testing.T) {
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1, Sigma: 0.3}, Base: policy.DefaultName, Window: 2, Hop: 1})
	if err != nil {
		t.Fatal(err)
	}
	first := o.Sigma()
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	rng := rand.New(rand.NewPCG(1, 1))
	var d policy.Decision
	// Every candidate loses: the step shrinks to its floor.
	for range 200 {
		if err := o.Decide(&d, &policy.Request{PromptTokens: 10}, reps, rng); err != nil {
			t.Fatal(err)
		}
		ttft := time.Second
		if d.Tag%2 == 1 {
			ttft = 2 * time.Second
		}
		o.Learn(d.Tag, policy.Outcome{TTFT: ttft, E2E: 3 * time.Second})
	}
	if judged, won := o.Counts(); judged < 30 || won != 0 || o.Sigma() != o.ES().Config().SigmaMin {
		t.Fatalf("%d judged, %d accepted, sigma %v: want many rejected, the step at its floor", judged, won, o.Sigma())
	}
	o.FleetChanged(policy.FleetChange{Why: "replica c added"})
	if o.Sigma() != first {
		t.Errorf("after the fleet changed the step is %v, want the first step %v", o.Sigma(), first)
	}
}
