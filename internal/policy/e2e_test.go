package policy

import (
	"maps"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestGorgoE2ETerms(t *testing.T) {
	w := Values{"rtt": 1, "queue": 1, "decode": 0.5, "itl": 0.1}
	reps := with(fleet(40, 300), func(r []Replica) {
		r[0].Decoding, r[0].InFlight, r[0].BacklogTokens = 10, 12, 1000
		r[0].ITLBaseMS, r[0].ITLSlopeMS = 10, 0.5
		r[1].CachedTokens = 1000
		r[1].ITLBaseMS, r[1].ITLSlopeMS = 12, 0
	})
	req := Request{PromptTokens: 2000, ExpectedOutputTokens: 100}
	_, d := decide(t, "gorgo-e2e", Options{Params: w}, exact, req, reps, 1)
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
	// A request for four answers decodes them beside the 12 in flight:
	// own 0.1·100·(10 + 0.5·16) = 180 at a.
	four := req
	four.Choices = 4
	if _, d := decide(t, "gorgo-e2e", Options{Params: w}, exact, four, reps, 1); math.Abs(d.Scores[0].Decode-780) > 1e-9 {
		t.Errorf("four answers at a: decode term %v, want 780", d.Scores[0].Decode)
	}
	// With zero decode weights it is gorgo-ms.
	ms := Values{"rtt": 1, "queue": 1}
	zeroDecode := Values{"rtt": 1, "queue": 1, "decode": 0, "itl": 0}
	for seed := range uint64(20) {
		req := Request{PromptTokens: int(seed) * 500, ExpectedOutputTokens: 300}
		a, _ := decide(t, "gorgo-e2e", Options{Params: zeroDecode}, exact, req, reps, seed)
		b, _ := decide(t, "gorgo-ms", Options{Params: ms}, exact, req, reps, seed)
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
	want := Values{"rtt": DefaultE2EWeights.RTT, "queue": DefaultE2EWeights.Queue, "decode": DefaultE2EWeights.Decode, "itl": DefaultE2EWeights.ITL}
	if v := p.(Tunable).Params(); !maps.Equal(v, want) {
		t.Errorf("default weights %v, want %v", v, want)
	}
}

func TestParseE2EWeights(t *testing.T) {
	e2e, _ := Lookup(DefaultName)
	w, err := e2e.Parse("decode=0.3,itl=0.01", e2e.Defaults())
	if err != nil || !maps.Equal(w, Values{"rtt": 1, "queue": 1, "decode": 0.3, "itl": 0.01}) {
		t.Fatalf("got %+v, %v", w, err)
	}
	if back, err := e2e.Parse(e2e.Format(w), nil); err != nil || !maps.Equal(back, w) {
		t.Errorf("Format %q reads back as %+v, %v", e2e.Format(w), back, err)
	}
	if e2e.Format(w) != "rtt=1,queue=1,decode=0.3,itl=0.01" {
		t.Errorf("prints as %q", e2e.Format(w))
	}
	gorgo, _ := Lookup("gorgo")
	if s := gorgo.Format(gorgo.Defaults()); s != "rtt=0.276,queue=0.5" {
		t.Errorf("paper weights print as %q", s)
	}
	if _, err := e2e.Parse("itl=-1", nil); err == nil {
		t.Error("negative itl accepted")
	}
	if _, err := gorgo.Parse("decode=1", nil); err == nil || !strings.Contains(err.Error(), "valid: rtt, queue") {
		t.Errorf("gorgo took a decode weight: %v", err)
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

// A replica whose KV cache cannot hold the request beside those in flight
// makes it wait for sequences to finish: the wait is priced in the queue
// term, and the request goes where it fits.
func TestGorgoE2EWaitsForMemory(t *testing.T) {
	reps := with(fleet(40, 40), func(r []Replica) {
		for i := range r {
			r[i].UnfinishedTokens, r[i].Decoding, r[i].InFlight = 8000, 4, 5
			r[i].ITLBaseMS, r[i].ITLSlopeMS = 10, 0.5
		}
		r[0].KVCapacityTokens = 10000
		r[1].KVCapacityTokens = 100000
	})
	req := Request{PromptTokens: 2000, ExpectedOutputTokens: 500, MeanOutputTokens: 500}
	reps[0].CachedTokens = 500
	// a holds 8000 + 4·250 = 9000 tokens and needs 1500 + 500 more: 1000
	// too many, freed at 9000 tokens per 500·(10 + 0.5·6) = 6500 ms.
	want := 1000 * 6500.0 / 9000
	if got := kvWait(&reps[0], &req); math.Abs(got-want) > 1e-9 {
		t.Errorf("wait for memory %v ms, want %v", got, want)
	}
	// A short answer needs less room, but the others free it no sooner:
	// 600 too many, at the same rate.
	short := Request{PromptTokens: 2000, ExpectedOutputTokens: 100, MeanOutputTokens: 500}
	if got, want := kvWait(&reps[0], &short), 600*6500.0/9000; math.Abs(got-want) > 1e-9 {
		t.Errorf("wait for memory of a short answer %v ms, want %v", got, want)
	}
	// Two answers of a short length each need their room: 700 too many,
	// and both decode beside the others, whose ITL becomes 10 + 0.5·7.
	two := Request{PromptTokens: 2000, ExpectedOutputTokens: 100, MeanOutputTokens: 500, Choices: 2}
	if got, want := kvWait(&reps[0], &two), 700*6750.0/9000; math.Abs(got-want) > 1e-9 {
		t.Errorf("wait for memory of two short answers %v ms, want %v", got, want)
	}
	if got := kvWait(&reps[1], &req); got != 0 {
		t.Errorf("wait where it fits: %v ms", got)
	}
	reps[0].KVCapacityTokens = 0
	if got := kvWait(&reps[0], &req); got != 0 {
		t.Errorf("wait where the capacity is unknown: %v ms", got)
	}
	reps[0].KVCapacityTokens = 10000
	i, d := decide(t, "gorgo-e2e", Options{}, exact, req, reps, 1)
	if i != 1 {
		t.Errorf("chose %d (scores %+v), want the replica with room", i, d.Scores)
	}
	if q := d.Scores[0].Queue - d.Scores[1].Queue; math.Abs(q-want) > 1e-9 {
		t.Errorf("queue terms differ by %v, want the wait %v", q, want)
	}
}
