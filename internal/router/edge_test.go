package router

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// Predict's wait term sums the dispatch times of the requests waiting for
// a first token in an int64, which wraps after ~107 days of router uptime
// with 1,000 requests waiting at one replica: the wait is still right
// (it made the replica's forecast ~213 days).
func TestWaitSumWraps(t *testing.T) {
	p, _ := policy.New("gorgo-ms", policy.Options{})
	r, err := New(Config{Policy: p, BlockTokens: 16, Replicas: []ReplicaConfig{{ID: "a", KVCapacityTokens: 1 << 20}}}) // zero rates: the forecast is RTT + wait
	if err != nil {
		t.Fatal(err)
	}
	r.ObserveRTT("a", 10*time.Millisecond)
	rng := rand.New(rand.NewPCG(1, 1))
	start := 120 * 24 * time.Hour // the router has been up 120 days
	for range 1000 {
		if _, err := r.Route(start, &policy.Request{PromptTokens: 100}, rng); err != nil {
			t.Fatal(err)
		}
	}
	f, err := r.Predict(start+time.Second, &policy.Request{PromptTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	// RTT 10 ms + the 1 s the waiting requests have waited.
	if f.Best > 2*time.Second {
		t.Errorf("forecast %v, want about 1.01s", f.Best)
	}
}

// nanPolicy scores replica 0 NaN, the others by index.
type nanPolicy struct{}

func (nanPolicy) Name() string { return "nan" }
func (nanPolicy) Decide(d *policy.Decision, _ *policy.Request, reps []policy.Replica, _ *rand.Rand) error {
	d.Scores = d.Scores[:0]
	for i := range reps {
		d.Scores = append(d.Scores, policy.Terms{Total: float64(i)})
	}
	d.Scores[0].Total = math.NaN()
	d.Replica = policy.ByScore
	return nil
}

// A NaN score never wins the choice (policy.Pick), and ranks last among
// the fallbacks, not ahead of every finite score.
func TestNaNRanksLastAmongFallbacks(t *testing.T) {
	r, err := New(Config{Policy: nanPolicy{}, BlockTokens: 16, Replicas: []ReplicaConfig{replicaConfig(0), replicaConfig(1), replicaConfig(2)}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r.ObserveRTT(id(i), time.Millisecond)
	}
	tk, fb, err := r.Dispatch(0, &policy.Request{PromptTokens: 10}, rand.New(rand.NewPCG(1, 1)), make([]Candidate, 0, 2))
	if err != nil {
		t.Fatal(err)
	}
	got := []string{tk.ID}
	for _, c := range fb {
		got = append(got, c.ID)
	}
	if got[1] != "c" {
		t.Errorf("ranked %v, want [b c a]: the NaN-scored replica last", got)
	}
}
