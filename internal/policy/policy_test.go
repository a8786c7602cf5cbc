package policy

import (
	"encoding/json"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fleet builds replica views: a..z in order, all healthy, with RTTs in ms.
func fleet(rtts ...int) []Replica {
	reps := make([]Replica, len(rtts))
	for i, ms := range rtts {
		reps[i] = Replica{ID: string(rune('a' + i)), RTT: time.Duration(ms) * time.Millisecond,
			PrefillMSPerToken: 0.06, QueueMSPerToken: 0.06}
	}
	return reps
}

func with(reps []Replica, f func(r []Replica)) []Replica { f(reps); return reps }

// exact is the tie margin of exact ties only.
const exact = -1.0

// decide runs a policy and resolves its decision as the router does, with
// the given tie margin.
func decide(t *testing.T, name string, opts Options, margin float64, req Request, reps []Replica, seed uint64) (int, Decision) {
	t.Helper()
	p, err := New(name, opts)
	if err != nil {
		t.Fatal(err)
	}
	var d Decision
	rng := rand.New(rand.NewPCG(seed, 1))
	if err := p.Decide(&d, &req, reps, rng); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if len(d.Scores) != len(reps) {
		t.Fatalf("%s: %d scores for %d replicas", name, len(d.Scores), len(reps))
	}
	return Pick(&d, margin, rng), d
}

func TestPolicies(t *testing.T) {
	cases := []struct {
		name   string
		policy string
		opts   Options
		req    Request
		reps   []Replica
		want   string // replica IDs any of which is right
	}{
		// gorgo: 0.276·rtt + uncached + 0.5·queued.
		{"gorgo prefers the near replica", "gorgo", Options{}, Request{PromptTokens: 1000}, fleet(37, 279, 456), "a"},
		{"gorgo follows the cache", "gorgo", Options{}, Request{PromptTokens: 1000},
			with(fleet(37, 279, 456), func(r []Replica) { r[1].CachedTokens = 900 }), "b"}, // a: 1010, b: 177
		{"gorgo avoids the queue", "gorgo", Options{}, Request{PromptTokens: 1000},
			with(fleet(37, 279, 456), func(r []Replica) { r[0].UnfinishedTokens = 1000 }), "b"}, // a: 1510, b: 1077
		{"gorgo weights", "gorgo", Options{Params: Values{"rtt": 0.05, "queue": 0.05}}, Request{PromptTokens: 1000},
			with(fleet(37, 279, 456), func(r []Replica) { r[0].UnfinishedTokens = 2000; r[1].UnfinishedTokens = 3000 }), "c"}, // a 101.85, b 163.95, c 22.8
		{"gorgo-ms prices by replica", "gorgo-ms", Options{}, Request{PromptTokens: 10000},
			with(fleet(37, 100, 456), func(r []Replica) { r[1].PrefillMSPerToken = 0.03 }), "b"}, // a 637, b 400
		{"gorgo-ms backlog", "gorgo-ms", Options{}, Request{PromptTokens: 1000},
			with(fleet(37, 100, 456), func(r []Replica) { r[0].BacklogTokens = 5000 }), "b"},
		{"least-request", "least-request", Options{}, Request{},
			with(fleet(1, 1, 1), func(r []Replica) { r[0].InFlight = 3; r[1].InFlight = 1; r[2].InFlight = 2 }), "b"},
		{"least-request counts scraped running", "least-request", Options{}, Request{},
			with(fleet(1, 1, 1), func(r []Replica) { r[0].InFlight = 3; r[1].Engine.Running = 5; r[2].InFlight = 4 }), "a"},
		{"least-request tie", "least-request", Options{}, Request{}, fleet(1, 1, 1), "abc"},
		{"least-load", "least-load", Options{}, Request{},
			with(fleet(1, 1), func(r []Replica) {
				r[0].Engine = EngineGauges{Running: 1, Waiting: 1, KVUsedTokens: 5000}
				r[1].Engine = EngineGauges{Running: 9, Waiting: 9, KVUsedTokens: 3000}
				r[1].UnfinishedTokens = 1000
			}), "b"}, // a 5002, b 4018
		{"prefix-cache longest prefix", "prefix-cache", Options{}, Request{PromptTokens: 4000},
			with(fleet(1, 1, 1), func(r []Replica) { r[1].CachedTokens = 2048; r[2].CachedTokens = 1024 }), "b"},
		{"prefix-cache least running among longest", "prefix-cache", Options{}, Request{PromptTokens: 4000},
			with(fleet(1, 1, 1), func(r []Replica) {
				r[0].CachedTokens, r[1].CachedTokens = 2048, 2048
				r[0].Engine.Running, r[1].Engine.Running, r[2].Engine.Running = 5, 3, 0
			}), "b"},
		{"prefix-cache imbalance falls back", "prefix-cache", Options{}, Request{PromptTokens: 4000},
			with(fleet(1, 1, 1), func(r []Replica) {
				r[0].CachedTokens = 4000
				r[0].Engine.Running, r[1].Engine.Running, r[2].Engine.Running = 12, 3, 2
			}), "c"},
		{"prefix-cache no match falls back", "prefix-cache", Options{}, Request{PromptTokens: 4000},
			with(fleet(1, 1, 1), func(r []Replica) { r[0].InFlight, r[1].InFlight = 2, 1 }), "c"},
		{"simple affinity", "simple-session-affinity", Options{}, Request{PrefixKey: 7}, fleet(1, 1, 1), "b"},                     // 7 % 3
		{"simple affinity over what is available", "simple-session-affinity", Options{}, Request{PrefixKey: 7}, fleet(1, 1), "b"}, // 7 % 2
		{"power-of-two with one replica", "power-of-two", Options{}, Request{}, fleet(1), "a"},
	}
	for _, c := range cases {
		for seed := range uint64(5) {
			i, _ := decide(t, c.policy, c.opts, exact, c.req, c.reps, seed)
			if !strings.Contains(c.want, c.reps[i].ID) {
				t.Errorf("%s (seed %d): picked %s, want one of %q", c.name, seed, c.reps[i].ID, c.want)
			}
		}
	}
}

func TestGorgoExplainsEveryReplica(t *testing.T) {
	reps := with(fleet(37, 279), func(r []Replica) { r[1].CachedTokens = 500; r[0].UnfinishedTokens = 100 })
	_, d := decide(t, "gorgo", Options{}, DefaultTieMargin, Request{PromptTokens: 1000}, reps, 1)
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

// Within the tie margin Pick spreads gorgo's load; with exact ties only it still
// draws among exactly equal replicas rather than taking the first.
func TestGorgoTieMargin(t *testing.T) {
	reps := fleet(37, 38, 200) // a and b within 1% (1010.2 vs 1010.5), c not
	count := map[string]int{}
	for seed := range uint64(400) {
		i, _ := decide(t, "gorgo", Options{}, DefaultTieMargin, Request{PromptTokens: 1000}, reps, seed)
		count[reps[i].ID]++
	}
	if count["a"] < 150 || count["b"] < 150 || count["c"] != 0 {
		t.Errorf("picks %v: want a and b about evenly, never c", count)
	}
	count = map[string]int{}
	for seed := range uint64(100) {
		i, _ := decide(t, "gorgo", Options{}, exact, Request{PromptTokens: 1000}, reps, seed)
		count[reps[i].ID]++
	}
	if count["a"] != 100 {
		t.Errorf("exact ties only: picks %v, want always a", count)
	}
	equal := fleet(50, 50)
	count = map[string]int{}
	for seed := range uint64(200) {
		i, _ := decide(t, "gorgo", Options{}, exact, Request{PromptTokens: 1000}, equal, seed)
		count[equal[i].ID]++
	}
	if count["a"] < 60 || count["b"] < 60 {
		t.Errorf("exact tie: picks %v, want both", count)
	}
}

func TestSessionAffinityIsStickyAndMinimalOnFailure(t *testing.T) {
	reps := fleet(1, 1, 1, 1, 1)
	home := map[string]string{}
	for s := range 200 {
		key := "session-" + string(rune('A'+s%26)) + string(rune('a'+s/26))
		i, _ := decide(t, "session-affinity", Options{}, DefaultTieMargin, Request{SessionKey: key}, reps, uint64(s))
		j, _ := decide(t, "session-affinity", Options{}, DefaultTieMargin, Request{SessionKey: key}, reps, uint64(s+1000))
		if i != j {
			t.Fatalf("session %s moved from %d to %d", key, i, j)
		}
		home[key] = reps[i].ID
	}
	// Replica c leaves the views (down or drained): only its sessions move.
	left := append(append([]Replica(nil), reps[:2]...), reps[3:]...)
	moved := 0
	for key, h := range home {
		i, d := decide(t, "session-affinity", Options{}, DefaultTieMargin, Request{SessionKey: key}, left, 1)
		if got := left[i].ID; got != h {
			moved++
			if h != "c" {
				t.Errorf("session %s moved from %s, which is still there", key, h)
			}
		}
		// Its fallback is where it goes when its home leaves.
		if h != "c" {
			if second := rankSecond(d, i); second >= 0 {
				j, _ := decide(t, "session-affinity", Options{}, DefaultTieMargin, Request{SessionKey: key}, without(left, i), 1)
				if without(left, i)[j].ID != left[second].ID {
					t.Errorf("session %s: fallback %s, but without its home it goes to %s", key, left[second].ID, without(left, i)[j].ID)
				}
			}
		}
	}
	if moved == 0 {
		t.Error("no session lived on replica c")
	}
}

// rankSecond returns the index of the best score other than chosen.
func rankSecond(d Decision, chosen int) int {
	best := -1
	for i, s := range d.Scores {
		if i != chosen && (best < 0 || s.Total < d.Scores[best].Total) {
			best = i
		}
	}
	return best
}

func without(reps []Replica, i int) []Replica {
	return append(append([]Replica(nil), reps[:i]...), reps[i+1:]...)
}

// TestEveryPolicyRanksEveryReplica: every registered policy scores every
// replica, and its choice (or the least score) is a replica of the views.
func TestEveryPolicyRanksEveryReplica(t *testing.T) {
	for _, name := range Names() {
		for n := 1; n <= 4; n++ {
			i, _ := decide(t, name, Options{}, DefaultTieMargin, Request{PromptTokens: 10, PrefixKey: 3, SessionKey: "s"}, fleet(make([]int, n)...), 1)
			if i < 0 || i >= n {
				t.Errorf("%s with %d replicas picked %d", name, n, i)
			}
		}
	}
}

func TestParseWeights(t *testing.T) {
	g, _ := Lookup("gorgo")
	w, err := g.Parse("rtt=0.3, queue=0.1", nil)
	if err != nil || !maps.Equal(w, Values{"rtt": 0.3, "queue": 0.1}) {
		t.Errorf("got %+v, %v", w, err)
	}
	if w, err := g.Parse("queue=0", g.Defaults()); err != nil || !maps.Equal(w, Values{"rtt": 0.276, "queue": 0}) {
		t.Errorf("partial: %+v, %v", w, err)
	}
	for _, bad := range []string{"rtt=x", "speed=1", "rtt=-1", "/nonexistent.json"} {
		if _, err := g.Parse(bad, nil); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Simple session affinity counts the replicas in the order of their ids,
// whatever order the router holds them in (the simulator and the proxy
// hold them differently): a prompt goes to the same replica either way.
func TestSimpleAffinityIgnoresOrder(t *testing.T) {
	p, err := New("simple-session-affinity", Options{})
	if err != nil {
		t.Fatal(err)
	}
	fwd := fleet(1, 1, 1, 1)
	rev := []Replica{fwd[3], fwd[2], fwd[1], fwd[0]}
	for key := range uint64(20) {
		var a, b Decision
		req := Request{PrefixKey: key}
		if p.Decide(&a, &req, fwd, nil) != nil || p.Decide(&b, &req, rev, nil) != nil {
			t.Fatal("decide")
		}
		if fwd[a.Replica].ID != rev[b.Replica].ID {
			t.Errorf("key %d: %s in one order, %s in the other", key, fwd[a.Replica].ID, rev[b.Replica].ID)
		}
	}
}

// Terms are JSON under their names, a term that is not finite as null:
// encoding/json refused the whole answer over one (an /admin/decide of
// huge weights answered an empty 200, and the live view's stream closed).
func TestTermsJSON(t *testing.T) {
	b, err := json.Marshal([]Terms{{RTT: 12.5, Prefill: 1e-7, Queue: math.Inf(1), Decode: math.NaN(), Adapter: 0, Total: 3e21}})
	if err != nil {
		t.Fatal(err)
	}
	const want = `[{"RTT":12.5,"Prefill":1e-07,"Queue":null,"Decode":null,"Adapter":0,"Total":3e+21}]`
	if string(b) != want {
		t.Errorf("got %s, want %s", b, want)
	}
	var back []map[string]*float64
	if err := json.Unmarshal(b, &back); err != nil || *back[0]["RTT"] != 12.5 || back[0]["Queue"] != nil {
		t.Errorf("read back %v, %v", back, err)
	}
}

// A parameters file says what is wrong with it in its own terms, and one
// that names another policy is refused (gorgo's and gorgo-ms's have the
// same names: a researcher's test, 2026-12-06).
func TestParseParametersFile(t *testing.T) {
	i, _ := Lookup("gorgo-ms")
	dir := t.TempDir()
	for _, c := range []struct{ body, want string }{
		{`{"rtt":"1","queue":0.2}`, `rtt: "1" is not a number`},
		{`[1,2]`, `want a JSON object {"rtt": X, ...}`},
		{``, `want a JSON object`},
		{`{"policy":"gorgo","rtt":1}`, `holds the parameters of "gorgo", not gorgo-ms`},
		{`{"policy":"gorgo-ms","rtt":1.5}`, ""},
		{`{"rtt":1.5}`, ""},
	} {
		path := filepath.Join(dir, "w.json")
		if err := os.WriteFile(path, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		v, err := i.Parse(path, i.Defaults())
		switch {
		case c.want == "" && (err != nil || v["rtt"] != 1.5):
			t.Errorf("%s: %v, %v", c.body, v, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", c.body, err, c.want)
		}
	}
}
