package lifecycle

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// A live router draws from the stream the simulator routes with
// (policy.DrawStream under the run's seed), so that given the same seed and
// the same requests in the same order a policy that draws picks the same
// replicas in both: the demo's live random policy picked the simulator's
// replica for 232 of 738 requests (chance) before, 726 after.
func TestDrawsAsTheSimulatorDoes(t *testing.T) {
	const seed = 7
	newRouter := func() *router.Router {
		p, err := policy.New("random", policy.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rt, err := router.New(router.Config{Policy: p, BlockTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range []string{"a", "b", "c", "d"} {
			rt.Add(router.ReplicaConfig{ID: id, KVCapacityTokens: 1 << 16, PrefillMSPerToken: 0.1, QueueMSPerToken: 0.1})
			rt.ObserveRTT(id, time.Duration(10*(i+1))*time.Millisecond)
		}
		return rt
	}
	c := NewCore(Config{Router: newRouter(), BlockTokens: 16, MaxAttempts: 1, Start: time.Unix(0, 0), Metrics: NewMetrics(prometheus.NewRegistry()), Seed: seed})
	fe := &frontEnd{}
	for range 40 {
		if st := c.Serve(context.Background(), Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now()}, fe); st != 200 {
			t.Fatalf("status %d", st)
		}
	}
	// The simulator's router, fed the simulator's stream.
	rt, rng := newRouter(), rand.New(rand.NewPCG(seed, policy.DrawStream))
	var want []string
	for range 40 {
		tk, _, err := rt.Dispatch(0, &policy.Request{PromptTokens: 10}, rng, nil)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, tk.ID)
		rt.Finish(&tk)
	}
	if !slices.Equal(fe.sent, want) {
		t.Errorf("live picks %v\nthe simulator's stream picks %v", fe.sent, want)
	}
}
