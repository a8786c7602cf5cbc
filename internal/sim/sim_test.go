package sim

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

func profile(t testing.TB, name string) engine.Profile {
	t.Helper()
	p, err := engine.LookupProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newPolicy(t testing.TB, name string) policy.Policy {
	t.Helper()
	p, err := policy.New(name, policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// request builds a trace request whose blocks are unique to base.
func request(at time.Duration, base uint64, input, output int) trace.Request {
	ids := make([]uint64, (input+trace.BlockTokens-1)/trace.BlockTokens)
	for i := range ids {
		ids[i] = base<<24 | uint64(i)
	}
	return trace.Request{Time: at, InputTokens: input, OutputTokens: output, HashIDs: ids}
}

// poisson is a simple synthetic workload: Poisson arrivals at rate req/s,
// sessions of growing context, for load tests that need no trace file.
func poisson(n int, rate float64, seed uint64) []trace.Request {
	rng := rand.New(rand.NewPCG(seed, 7))
	var reqs []trace.Request
	var t time.Duration
	for i := range n {
		t += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		in := 500 + rng.IntN(8000)
		reqs = append(reqs, request(t, uint64(i+1), in, 20+rng.IntN(200)))
	}
	return reqs
}

func TestLoneRequestTTFTIsRTTPlusPrefill(t *testing.T) {
	p := profile(t, "paper")
	reps := []Replica{{ID: "a", RTT: 40 * time.Millisecond, Profile: p}}
	res, err := Run(Config{Replicas: reps, Requests: []trace.Request{request(time.Second, 1, 6000, 10)}, Policy: newPolicy(t, "round-robin")})
	if err != nil {
		t.Fatal(err)
	}
	rec := res.Records[0]
	want := 40*time.Millisecond + p.PrefillTime(6000)
	if got := time.Duration(rec.TTFT * float64(time.Millisecond)); got != want {
		t.Errorf("TTFT = %v, want RTT + prefill = %v", got, want)
	}
	if rec.Failed || rec.OutputTokens != 10 || rec.Replica != "a" || rec.Slip != 0 {
		t.Errorf("record %+v", rec)
	}
}

func TestLowLoadTTFTIsRTTPlusPrefill(t *testing.T) {
	p := profile(t, "paper")
	reps := []Replica{
		{ID: "near", RTT: 30 * time.Millisecond, Profile: p},
		{ID: "far", RTT: 300 * time.Millisecond, Profile: p},
	}
	// One request every 10 s: nothing ever queues.
	var reqs []trace.Request
	for i := range 40 {
		reqs = append(reqs, request(time.Duration(i)*10*time.Second, uint64(i+1), 1000+100*i, 50))
	}
	res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "random"), Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range res.Records {
		rtt := 30 * time.Millisecond
		if rec.Replica == "far" {
			rtt = 300 * time.Millisecond
		}
		want := rtt + p.PrefillTime(rec.PromptTokens)
		if got := time.Duration(rec.TTFT * float64(time.Millisecond)); got != want {
			t.Errorf("request %d on %s: TTFT %v, want %v", rec.Index, rec.Replica, got, want)
		}
	}
}

func TestSameSeedSameRun(t *testing.T) {
	reps := paperFleet(t)
	reqs := poisson(400, 4, 1)
	run := func(seed uint64) *Result {
		res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "random"), Seed: seed, MaxInflight: 16})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a, b, c := run(5), run(5), run(6)
	if !reflect.DeepEqual(a.Records, b.Records) || !reflect.DeepEqual(a.Run, b.Run) {
		t.Error("two runs with the same seed differ")
	}
	if reflect.DeepEqual(a.Records, c.Records) {
		t.Error("runs with different seeds are identical")
	}
}

func TestMaxInflightRecordsSlip(t *testing.T) {
	p := profile(t, "paper")
	reps := []Replica{{ID: "a", RTT: 10 * time.Millisecond, Profile: p}}
	reqs := []trace.Request{request(0, 1, 1000, 5), request(0, 2, 1000, 5)}
	res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "round-robin"), MaxInflight: 1})
	if err != nil {
		t.Fatal(err)
	}
	first, second := res.Records[0], res.Records[1]
	if first.Slip != 0 || second.Slip != first.E2E {
		t.Errorf("slips %v, %v; want 0 and the first request's E2E %v", first.Slip, second.Slip, first.E2E)
	}
}

func TestTailsGrowAsTimeScaleShrinks(t *testing.T) {
	top, _ := LoadTopology("paper")
	reps, err := top.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	base := poisson(1500, 6, 2)
	var p95 []float64
	for _, scale := range []float64{3, 1.5, 1} {
		reqs := trace.Apply(base, trace.Window{}, scale)
		res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "round-robin"), Seed: 1, MaxInflight: 64})
		if err != nil {
			t.Fatal(err)
		}
		p95 = append(p95, res.Run.TTFT.P95)
	}
	for i := 1; i < len(p95); i++ {
		if p95[i] <= p95[i-1] {
			t.Errorf("p95 TTFT at time scales 3, 1.5, 1: %v; want increasing", p95)
		}
	}
}

func TestFailedRequestsAreCounted(t *testing.T) {
	p := profile(t, "paper")
	p.MaxContextTokens = 8000
	reps := []Replica{{ID: "a", RTT: 20 * time.Millisecond, Profile: p}}
	reqs := []trace.Request{request(0, 1, 1000, 5), request(time.Second, 2, 9000, 5)}
	res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "round-robin")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Run.Completed != 1 || res.Run.Failed != 1 || !res.Records[1].Failed || res.Records[1].Error == "" {
		t.Errorf("run %+v, record %+v", res.Run, res.Records[1])
	}
}

// A router that knows nothing of its fleet's hardware learns which replica
// is fast and which slow from the TTFTs it observes.
func TestBlindRouterLearnsHeterogeneousRates(t *testing.T) {
	top, err := LoadTopology("../../examples/topologies/hetero.yaml")
	if err != nil {
		t.Fatal(err)
	}
	reps, err := top.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := trace.Generate(trace.GenConfig{Preset: "artchat", Seed: 1, Duration: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "gorgo-ms"), MaxInflight: 64, Seed: 1,
		Signals: Signals{OnlineRates: true, BlindPrior: true}})
	if err != nil {
		t.Fatal(err)
	}
	pp := profile(t, "paper")
	paper := pp.PrefillMSPerToken()
	ash, fra := res.Rates[0][0], res.Rates[1][0]
	t.Logf("learned prefill ms/token: %v (prior %.4f)", res.Rates, paper)
	// Frankfurt is 2.5x as fast: its learned rate must be well below the
	// prior and below Ashburn's (which is the prior's hardware).
	if !(fra < 0.7*paper && fra < 0.7*ash) {
		t.Errorf("Frankfurt prefill %.4f ms/token, Ashburn %.4f, prior %.4f: the fast replica was not recognised", fra, ash, paper)
	}
}

// Requests whose answers are not streamed show the router no first token:
// told of them, it releases their prefill when it is due and routes about
// as well as with every first token seen; untold, it keeps their prefill
// in the backlog until they end and sends load away from the busy near
// replica long after its queue has drained.
func TestUnstreamedAnswers(t *testing.T) {
	p := profile(t, "paper")
	reps := []Replica{{ID: "a", RTT: 20 * time.Millisecond, Profile: p}, {ID: "b", RTT: 200 * time.Millisecond, Profile: p}}
	reqs := poisson(3000, 4, 1)
	run := func(share float64, untold bool) *Result {
		res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "gorgo-ms"), MaxInflight: 64, Seed: 1, Unstreamed: share, UnstreamedUntold: untold})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	streamed, told, untold := run(0, false), run(0.5, false), run(0.5, true)
	t.Logf("p95 TTFT: all streamed %.0f, half unstreamed told %.0f, untold %.0f", streamed.Run.TTFT.P95, told.Run.TTFT.P95, untold.Run.TTFT.P95)
	if !(told.Run.TTFT.P95 < untold.Run.TTFT.P95) {
		t.Errorf("told p95 TTFT %.0f, untold %.0f: want told better", told.Run.TTFT.P95, untold.Run.TTFT.P95)
	}
	for _, r := range []*Result{told, untold} {
		if r.Run.Failed != 0 || r.Run.Completed != len(reqs) {
			t.Errorf("%d failed, %d completed", r.Run.Failed, r.Run.Completed)
		}
	}
}

// The simulated router keys a trace's chat by its system prompt, as the
// live one keys the bodies the replayer sends: new conversations of an
// application with a one-line system prompt are expected at that
// application's length (each request's record says what was expected).
func TestExpectsAnApplicationsLength(t *testing.T) {
	reqs := appsTrace(300, 2*time.Second)
	res, err := Run(Config{Replicas: []Replica{{ID: "a", RTT: 10 * time.Millisecond, Profile: profile(t, "paper")}},
		Requests: reqs, Policy: newPolicy(t, policy.DefaultName), Seed: 1, HideMaxTokens: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range res.Records[200:] {
		if e := rec.ExpectedOutputTokens; rec.OutputTokens == 40 && e > 100 || rec.OutputTokens == 800 && e < 600 {
			t.Fatalf("request %d (answer %d tokens) expected at %d: want its application's length", rec.Index, rec.OutputTokens, e)
		}
	}
}

// appsTrace is n chats, gap apart, of two applications with one-line system
// prompts, each a new conversation without a session: tool calls answered
// in 40 tokens and reports in 800, alternately.
func appsTrace(n int, gap time.Duration) []trace.Request {
	var reqs []trace.Request
	for i := range n {
		out, system := 40, "You call tools."
		if i%2 == 1 {
			out, system = 800, "You write reports."
		}
		r := request(time.Duration(i)*gap, uint64(i+1), 200, out)
		r.Messages = []trace.Message{{Role: "system", Content: system}, {Role: "user", Content: fmt.Sprint("question ", i)}}
		reqs = append(reqs, r)
	}
	return reqs
}
