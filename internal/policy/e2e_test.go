package policy

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestGorgoE2ETerms(t *testing.T) {
	w := Weights{RTT: 1, Queue: 1, Decode: 0.5, ITL: 0.1}
	reps := with(fleet(40, 300), func(r []Replica) {
		r[0].Decoding, r[0].InFlight, r[0].BacklogTokens = 10, 12, 1000
		r[0].ITLBaseMS, r[0].ITLSlopeMS = 10, 0.5
		r[1].CachedTokens = 1000
		r[1].ITLBaseMS, r[1].ITLSlopeMS = 12, 0
	})
	req := Request{PromptTokens: 2000, ExpectedOutputTokens: 100}
	_, d := decide(t, "gorgo-e2e", Options{E2EWeights: w}, exact, req, reps, 1)
	// a: prefill 2000·0.06 = 120; queue 1000·0.06 = 60; stall 0.5·10·120 = 600;
	//    own 0.1·100·(10 + 0.5·13) = 165.
	// b: prefill 1000·0.06 = 60; no queue; no stall; own 0.1·100·12 = 120.
	want := []Terms{
		{RTT: 40, Prefill: 120, Queue: 60, Decode: 765, Total: 985},
		{RTT: 300, Prefill: 60, Queue: 0, Decode: 120, Total: 480},
	}
	for i := range want {
		g := d.Scores[i]
		for _, pair := range [][2]float64{{g.RTT, want[i].RTT}, {g.Prefill, want[i].Prefill}, {g.Queue, want[i].Queue}, {g.Decode, want[i].Decode}, {g.Total, want[i].Total}} {
			if math.Abs(pair[0]-pair[1]) > 1e-9 {
				t.Errorf("replica %d: terms %+v, want %+v", i, g, want[i])
				break
			}
		}
	}
	// With zero decode weights it is gorgo-ms.
	ms := Weights{RTT: 1, Queue: 1}
	for seed := range uint64(20) {
		req := Request{PromptTokens: int(seed) * 500, ExpectedOutputTokens: 300}
		a, _ := decide(t, "gorgo-e2e", Options{E2EWeights: ms}, exact, req, reps, seed)
		b, _ := decide(t, "gorgo-ms", Options{MSWeights: ms}, exact, req, reps, seed)
		if a != b {
			t.Fatalf("seed %d: gorgo-e2e without decode weights chose %d, gorgo-ms %d", seed, a, b)
		}
	}
}

func TestDefaultAlias(t *testing.T) {
	p, err := New("default", Options{})
	if err != nil || p.Name() != DefaultName {
		t.Fatalf("default: %v, %v", p, err)
	}
	if i, ok := Lookup("default"); !ok || i.Name != DefaultName {
		t.Errorf("Lookup(default) = %+v, %v", i, ok)
	}
	if Canonical("gorgo") != "gorgo" || Canonical("default") != DefaultName {
		t.Error("Canonical")
	}
	if w := p.(interface{ Weights() Weights }).Weights(); w != DefaultE2EWeights {
		t.Errorf("default weights %v, want %v", w, DefaultE2EWeights)
	}
}

func TestParseE2EWeights(t *testing.T) {
	w, err := ParseWeights("decode=0.3,itl=0.01", DefaultE2EWeights)
	if err != nil || w != (Weights{RTT: 1, Queue: 1, Decode: 0.3, ITL: 0.01}) {
		t.Fatalf("got %+v, %v", w, err)
	}
	if back, err := ParseWeights(w.String(), Weights{}); err != nil || back != w {
		t.Errorf("String %q reads back as %+v, %v", w.String(), back, err)
	}
	if PaperWeights.String() != "rtt=0.276,queue=0.5" {
		t.Errorf("paper weights print as %q", PaperWeights.String())
	}
	if _, err := ParseWeights("itl=-1", Weights{}); err == nil {
		t.Error("negative itl accepted")
	}
}

// A score that is not a number (a policy's bug) never wins, and never
// makes the decision fail.
func TestPickSurvivesNaN(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	d := Decision{Replica: ByScore, Scores: []Terms{{Total: math.NaN()}, {Total: 5}, {Total: 7}}}
	for range 50 {
		if i := Pick(&d, 0.01, rng); i != 1 {
			t.Fatalf("picked %d", i)
		}
	}
	d.Scores = []Terms{{Total: math.NaN()}, {Total: math.Inf(1)}}
	for range 50 {
		if i := Pick(&d, 0.01, rng); i < 0 || i > 1 {
			t.Fatalf("picked %d of 2", i)
		}
	}
}
