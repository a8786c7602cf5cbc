package route

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// fleet builds replica views: a..z in order, all healthy, with RTTs in ms.
func fleet(rtts ...int) []Replica {
	reps := make([]Replica, len(rtts))
	for i, ms := range rtts {
		reps[i] = Replica{ID: string(rune('a' + i)), Healthy: true, RTT: time.Duration(ms) * time.Millisecond,
			PrefillMSPerToken: 0.06, QueueMSPerToken: 0.06}
	}
	return reps
}

func with(reps []Replica, f func(r []Replica)) []Replica { f(reps); return reps }

func decide(t *testing.T, name string, opts Options, req Request, reps []Replica, seed uint64) (int, Decision, error) {
	t.Helper()
	p, err := New(name, opts)
	if err != nil {
		t.Fatal(err)
	}
	var d Decision
	err = p.Decide(&d, &req, reps, rand.New(rand.NewPCG(seed, 1)))
	return d.Replica, d, err
}

func TestPolicies(t *testing.T) {
	exact := Options{TieMargin: -1}
	cases := []struct {
		name   string
		policy string
		opts   Options
		req    Request
		reps   []Replica
		want   string // replica IDs any of which is right
	}{
		// gorgo: 0.276·rtt + uncached + 0.5·queued.
		{"gorgo prefers the near replica", "gorgo", exact, Request{PromptTokens: 1000}, fleet(37, 279, 456), "a"},
		{"gorgo follows the cache", "gorgo", exact, Request{PromptTokens: 1000},
			with(fleet(37, 279, 456), func(r []Replica) { r[1].CachedTokens = 900 }), "b"}, // a: 1010, b: 177
		{"gorgo avoids the queue", "gorgo", exact, Request{PromptTokens: 1000},
			with(fleet(37, 279, 456), func(r []Replica) { r[0].UnfinishedTokens = 1000 }), "b"}, // a: 1510, b: 1077
		{"gorgo skips unhealthy", "gorgo", exact, Request{PromptTokens: 1000},
			with(fleet(37, 279, 456), func(r []Replica) { r[0].Healthy = false }), "b"},
		{"gorgo weights", "gorgo", Options{Weights: Weights{RTT: 0.05, Queue: 0.05}, TieMargin: -1}, Request{PromptTokens: 1000},
			with(fleet(37, 279, 456), func(r []Replica) { r[0].UnfinishedTokens = 2000; r[1].UnfinishedTokens = 3000 }), "c"}, // a 101.85, b 163.95, c 22.8
		{"gorgo-ms prices by replica", "gorgo-ms", exact, Request{PromptTokens: 10000},
			with(fleet(37, 100, 456), func(r []Replica) { r[1].PrefillMSPerToken = 0.03 }), "b"}, // a 637, b 400
		{"gorgo-ms backlog", "gorgo-ms", exact, Request{PromptTokens: 1000},
			with(fleet(37, 100, 456), func(r []Replica) { r[0].BacklogTokens = 5000 }), "b"},
		{"least-request", "least-request", exact, Request{},
			with(fleet(1, 1, 1), func(r []Replica) { r[0].InFlight = 3; r[1].InFlight = 1; r[2].InFlight = 2 }), "b"},
		{"least-request counts scraped running", "least-request", exact, Request{},
			with(fleet(1, 1, 1), func(r []Replica) { r[0].InFlight = 3; r[1].Engine.Running = 5; r[2].InFlight = 4 }), "a"},
		{"least-request tie", "least-request", exact, Request{}, fleet(1, 1, 1), "abc"},
		{"least-load", "least-load", exact, Request{},
			with(fleet(1, 1), func(r []Replica) {
				r[0].Engine = EngineGauges{Running: 1, Waiting: 1, KVUsedTokens: 5000}
				r[1].Engine = EngineGauges{Running: 9, Waiting: 9, KVUsedTokens: 3000}
				r[1].UnfinishedTokens = 1000
			}), "b"}, // a 5002, b 4018
		{"prefix-cache longest prefix", "prefix-cache", exact, Request{PromptTokens: 4000},
			with(fleet(1, 1, 1), func(r []Replica) { r[1].CachedTokens = 2048; r[2].CachedTokens = 1024 }), "b"},
		{"prefix-cache least running among longest", "prefix-cache", exact, Request{PromptTokens: 4000},
			with(fleet(1, 1, 1), func(r []Replica) {
				r[0].CachedTokens, r[1].CachedTokens = 2048, 2048
				r[0].Engine.Running, r[1].Engine.Running, r[2].Engine.Running = 5, 3, 0
			}), "b"},
		{"prefix-cache imbalance falls back", "prefix-cache", exact, Request{PromptTokens: 4000},
			with(fleet(1, 1, 1), func(r []Replica) {
				r[0].CachedTokens = 4000
				r[0].Engine.Running, r[1].Engine.Running, r[2].Engine.Running = 12, 3, 2
			}), "c"},
		{"prefix-cache no match falls back", "prefix-cache", exact, Request{PromptTokens: 4000},
			with(fleet(1, 1, 1), func(r []Replica) { r[0].InFlight, r[1].InFlight = 2, 1 }), "c"},
		{"simple affinity", "simple-session-affinity", exact, Request{PrefixKey: 7}, fleet(1, 1, 1), "b"}, // 7 % 3
		{"simple affinity skips unhealthy", "simple-session-affinity", exact, Request{PrefixKey: 7},
			with(fleet(1, 1, 1), func(r []Replica) { r[1].Healthy = false }), "c"},
		{"power-of-two with one healthy", "power-of-two", exact, Request{},
			with(fleet(1, 1, 1), func(r []Replica) { r[0].Healthy, r[2].Healthy = false, false }), "b"},
	}
	for _, c := range cases {
		for seed := range uint64(5) {
			i, _, err := decide(t, c.policy, c.opts, c.req, c.reps, seed)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if !strings.Contains(c.want, c.reps[i].ID) {
				t.Errorf("%s (seed %d): picked %s, want one of %q", c.name, seed, c.reps[i].ID, c.want)
			}
		}
	}
}

func TestGorgoExplainsEveryReplica(t *testing.T) {
	reps := with(fleet(37, 279), func(r []Replica) { r[1].CachedTokens = 500; r[0].UnfinishedTokens = 100 })
	_, d, err := decide(t, "gorgo", Options{}, Request{PromptTokens: 1000}, reps, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := []Terms{
		{RTT: 0.276 * 37, Prefill: 1000, Queue: 50, Total: 0.276*37 + 1000 + 50},
		{RTT: 0.276 * 279, Prefill: 500, Queue: 0, Total: 0.276*279 + 500},
	}
	if len(d.Scores) != 2 {
		t.Fatalf("scores %+v", d.Scores)
	}
	for i := range want {
		g, w := d.Scores[i], want[i]
		if abs(g.RTT-w.RTT) > 1e-9 || g.Prefill != w.Prefill || g.Queue != w.Queue || abs(g.Total-w.Total) > 1e-9 {
			t.Errorf("replica %d terms %+v, want %+v", i, g, w)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// Within the tie margin gorgo spreads load; with exact ties only it still
// draws among exactly equal replicas rather than taking the first.
func TestGorgoTieMargin(t *testing.T) {
	reps := fleet(37, 38, 200) // a and b within 1% (1010.2 vs 1010.5), c not
	count := map[string]int{}
	for seed := range uint64(400) {
		i, _, _ := decide(t, "gorgo", Options{}, Request{PromptTokens: 1000}, reps, seed)
		count[reps[i].ID]++
	}
	if count["a"] < 150 || count["b"] < 150 || count["c"] != 0 {
		t.Errorf("picks %v: want a and b about evenly, never c", count)
	}
	count = map[string]int{}
	for seed := range uint64(100) {
		i, _, _ := decide(t, "gorgo", Options{TieMargin: -1}, Request{PromptTokens: 1000}, reps, seed)
		count[reps[i].ID]++
	}
	if count["a"] != 100 {
		t.Errorf("exact ties only: picks %v, want always a", count)
	}
	equal := fleet(50, 50)
	count = map[string]int{}
	for seed := range uint64(200) {
		i, _, _ := decide(t, "gorgo", Options{TieMargin: -1}, Request{PromptTokens: 1000}, equal, seed)
		count[equal[i].ID]++
	}
	if count["a"] < 60 || count["b"] < 60 {
		t.Errorf("exact tie: picks %v, want both", count)
	}
}

func TestSessionAffinityIsStickyAndMinimalOnFailure(t *testing.T) {
	reps := fleet(1, 1, 1, 1, 1)
	home := map[string]int{}
	for s := range 200 {
		key := "session-" + string(rune('A'+s%26)) + string(rune('a'+s/26))
		i, _, _ := decide(t, "session-affinity", Options{}, Request{SessionKey: key}, reps, uint64(s))
		j, _, _ := decide(t, "session-affinity", Options{}, Request{SessionKey: key}, reps, uint64(s+1000))
		if i != j {
			t.Fatalf("session %s moved from %d to %d", key, i, j)
		}
		home[key] = i
	}
	reps[2].Healthy = false
	moved := 0
	for key, h := range home {
		i, _, _ := decide(t, "session-affinity", Options{}, Request{SessionKey: key}, reps, 1)
		if i != h {
			moved++
			if h != 2 {
				t.Errorf("session %s moved from healthy replica %d", key, h)
			}
		}
		if i == 2 {
			t.Errorf("session %s routed to the unhealthy replica", key)
		}
	}
	if moved == 0 {
		t.Error("no session lived on replica 2")
	}
}

func TestEveryPolicyRefusesEmptyOrUnhealthyFleets(t *testing.T) {
	for _, name := range Names() {
		for _, reps := range [][]Replica{nil, with(fleet(1, 1), func(r []Replica) { r[0].Healthy, r[1].Healthy = false, false })} {
			_, _, err := decide(t, name, Options{}, Request{PromptTokens: 10, PrefixKey: 3, SessionKey: "s"}, reps, 1)
			if !errors.Is(err, ErrNoReplica) {
				t.Errorf("%s with %d replicas: err %v, want ErrNoReplica", name, len(reps), err)
			}
		}
	}
}

func TestParseWeights(t *testing.T) {
	w, err := ParseWeights("rtt=0.3, queue=0.1", Weights{})
	if err != nil || w != (Weights{RTT: 0.3, Queue: 0.1}) {
		t.Errorf("got %+v, %v", w, err)
	}
	if w, err := ParseWeights("queue=0", PaperWeights); err != nil || w != (Weights{RTT: 0.276}) {
		t.Errorf("partial: %+v, %v", w, err)
	}
	for _, bad := range []string{"rtt=x", "speed=1", "rtt=-1", "/nonexistent.json"} {
		if _, err := ParseWeights(bad, Weights{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
