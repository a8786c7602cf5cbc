package router

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/route"
)

func newRouter(t testing.TB, policy string, n int, online bool) *Router {
	t.Helper()
	p, err := route.New(policy, route.Options{TieMargin: -1})
	if err != nil {
		t.Fatal(err)
	}
	reps := make([]ReplicaConfig, n)
	for i := range reps {
		reps[i] = ReplicaConfig{ID: string(rune('a' + i)), KVCapacityTokens: 100 * 16, PrefillMSPerToken: 0.06, QueueMSPerToken: 0.06}
	}
	r, err := New(Config{Replicas: reps, Policy: p, BlockTokens: 16, OnlineRates: online})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func blocks(base uint64, n int) []uint64 {
	b := make([]uint64, n)
	for i := range b {
		b[i] = base<<32 | uint64(i)
	}
	return b
}

func TestLedgerAndIndex(t *testing.T) {
	r := newRouter(t, "gorgo", 2, false)
	r.ObserveRTT(0, 10*time.Millisecond)
	r.ObserveRTT(1, 200*time.Millisecond)
	rng := rand.New(rand.NewPCG(1, 1))
	req := route.Request{PromptTokens: 160, Blocks: blocks(1, 10)}
	t1, err := r.Route(0, &req, rng)
	if err != nil {
		t.Fatal(err)
	}
	if t1.Replica != 0 || t1.EstCachedTokens != 0 || t1.RTT != 10*time.Millisecond {
		t.Fatalf("first ticket %+v", t1)
	}
	// The same prompt again: the index now believes replica 0 holds it,
	// and the ledger holds the first request.
	// gorgo: a = 0.276·10 + 0 + 0.5·160; b = 0.276·200 + 160.
	explain, _ := route.New("gorgo", route.Options{TieMargin: -1})
	if _, d, err := r.Explain(time.Millisecond, &req, explain, rng); err != nil || d.Scores[0].Queue != 80 || d.Scores[1].Prefill != 160 {
		t.Errorf("terms %+v, %v", d.Scores, err)
	}
	t2, err := r.Route(time.Millisecond, &req, rng)
	if err != nil {
		t.Fatal(err)
	}
	if t2.Replica != 0 || t2.EstCachedTokens != 160 || t2.Backlog != 160 || t2.Terms.Queue != 80 {
		t.Fatalf("second ticket %+v", t2)
	}
	r.FirstToken(&t1, 50*time.Millisecond)
	r.FirstToken(&t1, 50*time.Millisecond) // idempotent
	r.Finish(&t1)
	r.Finish(&t1)
	r.Finish(&t2) // failed before its first token
	r.mu.Lock()
	s := r.reps[0]
	r.mu.Unlock()
	if s.inflight != 0 || s.unfin != 0 || s.backlog != 0 {
		t.Errorf("ledger not empty: inflight %d unfinished %d backlog %d", s.inflight, s.unfin, s.backlog)
	}
}

func TestIndexResetsWhenReplicaForgets(t *testing.T) {
	r := newRouter(t, "session-affinity", 1, false)
	rng := rand.New(rand.NewPCG(1, 1))
	req := route.Request{SessionKey: "s", PromptTokens: 160, Blocks: blocks(1, 10)}
	first, _ := r.Route(0, &req, rng)
	r.CachedReport(&first, 0)
	// The replica keeps reporting nothing cached although the router
	// believes it holds the whole prompt: it was evidently flushed.
	reset := false
	for i := 0; i < 40 && !reset; i++ {
		tk, _ := r.Route(0, &req, rng)
		if tk.EstCachedTokens != 160 {
			t.Fatalf("request %d: estimate %d before any reset", i, tk.EstCachedTokens)
		}
		reset = r.CachedReport(&tk, 0)
	}
	if !reset || r.IndexResets() != 1 {
		t.Fatalf("no reset after repeated misses")
	}
	r.mu.Lock()
	n := r.index.Blocks(0)
	r.mu.Unlock()
	if n != 0 {
		t.Errorf("replica still believed to hold %d blocks", n)
	}
	// Agreeing reports never reset.
	for range 100 {
		tk, _ := r.Route(0, &req, rng)
		if r.CachedReport(&tk, tk.EstCachedTokens) {
			t.Fatal("reset although the replica confirmed the estimate")
		}
	}
}

func TestOnlineRates(t *testing.T) {
	r := newRouter(t, "gorgo-ms", 1, true)
	rng := rand.New(rand.NewPCG(1, 1))
	// The replica is twice as slow at prefill as configured (0.12 ms per
	// token) and each backlog token ahead costs 0.03 ms.
	type pending struct {
		tk   Ticket
		ttft time.Duration
	}
	var queue []pending
	for i := range 3000 {
		req := route.Request{PromptTokens: 100 + rng.IntN(8000), Blocks: blocks(uint64(i+1), 3)}
		tk, err := r.Route(0, &req, rng)
		if err != nil {
			t.Fatal(err)
		}
		ttft := time.Duration((0.12*float64(tk.PromptTokens-tk.EstCachedTokens) + 0.03*float64(tk.Backlog)) * 1e6)
		queue = append(queue, pending{tk, ttft})
		// First tokens come back a varying number of requests later, so
		// the backlog varies.
		for len(queue) > rng.IntN(12) {
			p := &queue[0]
			r.FirstToken(&p.tk, p.ttft)
			r.Finish(&p.tk)
			queue = queue[1:]
		}
	}
	p, q := r.Rates(0)
	if p < 0.115 || p > 0.125 || q < 0.025 || q > 0.035 {
		t.Errorf("learned rates %.4f %.4f, want ≈ 0.12 and 0.03", p, q)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	p, _ := route.New("random", route.Options{})
	cases := []Config{
		{Policy: p, BlockTokens: 16},
		{Replicas: []ReplicaConfig{{ID: "a"}}, BlockTokens: 16},
		{Replicas: []ReplicaConfig{{ID: "a"}, {ID: "a"}}, Policy: p, BlockTokens: 16},
		{Replicas: []ReplicaConfig{{ID: "a"}}, Policy: p},
		{Replicas: []ReplicaConfig{{ID: "a"}}, Policy: p, BlockTokens: 16, RTTAlpha: 2},
	}
	for i, c := range cases {
		if _, err := New(c); err == nil {
			t.Errorf("case %d accepted", i)
		}
	}
}

// A decision allocates nothing once the router is warm, whatever the policy.
func TestDecideDoesNotAllocate(t *testing.T) {
	for _, name := range route.Names() {
		r := newRouter(t, name, 5, true)
		rng := rand.New(rand.NewPCG(1, 1))
		req := &route.Request{SessionKey: "s", PrefixKey: 9, PromptTokens: 160, Blocks: blocks(1, 10)}
		if _, err := r.Route(0, req, rng); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() {
			if _, err := r.Decide(0, req, rng); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("%s: %v allocations per decision", name, n)
		}
	}
}

func TestRouteExceptSkipsTriedReplicas(t *testing.T) {
	r := newRouter(t, "gorgo", 3, false)
	for i, ms := range []int{10, 20, 30} {
		r.ObserveRTT(i, time.Duration(ms)*time.Millisecond)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	req := route.Request{PromptTokens: 16, Blocks: blocks(1, 1)}
	tk, err := r.Dispatch(0, &req, rng, []bool{true, false, false})
	if err != nil || tk.Replica != 1 {
		t.Fatalf("skipping the nearest: replica %d, %v", tk.Replica, err)
	}
	if st := r.Snapshot(); st[1].InFlight != 1 || st[1].IndexBlocks != 0 {
		t.Errorf("dispatched but not accepted: %+v", st[1])
	}
	r.Accepted(&tk, &req)
	r.Finish(&tk)
	if _, err := r.Dispatch(0, &req, rng, []bool{true, true, true}); err == nil {
		t.Error("routed with every replica skipped")
	}
	if st := r.Snapshot(); len(st) != 3 || st[1].InFlight != 0 || st[0].RTT != 10*time.Millisecond || st[1].IndexBlocks != 1 {
		t.Errorf("snapshot %+v", st)
	}
	// Explain runs another policy instance and records nothing.
	p, _ := route.New("round-robin", route.Options{})
	before := r.Snapshot()
	if _, _, err := r.Explain(0, &req, p, rand.New(rand.NewPCG(9, 9))); err != nil {
		t.Fatal(err)
	}
	if after := r.Snapshot(); !reflect.DeepEqual(before, after) {
		t.Errorf("Explain changed the router: %+v -> %+v", before, after)
	}
}
