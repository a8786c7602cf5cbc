package tune

import (
	"context"
	"maps"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/policy/policytest"
)

func newES(t *testing.T, cfg Config) *ES {
	t.Helper()
	es, err := NewES(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

func TestOneFifthRuleMovesTheStep(t *testing.T) {
	es := newES(t, Config{Seed: 1})
	s0 := es.Sigma()
	better, worse := Metrics{N: 1, TTFTP95: 100}, Metrics{N: 1, TTFTP95: 200}
	es.Judge(es.Propose(), better, worse)
	if s1 := es.Sigma(); !(s1 > s0) {
		t.Errorf("after a success sigma %v -> %v, want larger", s0, s1)
	}
	s1 := es.Sigma()
	es.Judge(es.Propose(), worse, better)
	if s2 := es.Sigma(); !(s2 < s1) {
		t.Errorf("after a failure sigma %v -> %v, want smaller", s1, s2)
	}
	// One success in five leaves the step where it was.
	s := es.Sigma()
	es.Judge(es.Propose(), better, worse)
	for range 4 {
		es.Judge(es.Propose(), worse, better)
	}
	if math.Abs(es.Sigma()-s) > 1e-12 {
		t.Errorf("1 success in 5: sigma %v -> %v, want unchanged", s, es.Sigma())
	}
	// The floor and the ceiling hold.
	for range 200 {
		es.Judge(es.Propose(), worse, better)
	}
	if es.Sigma() != es.Config().SigmaMin {
		t.Errorf("sigma %v after many failures, want the floor %v", es.Sigma(), es.Config().SigmaMin)
	}
	for range 200 {
		es.Judge(es.Propose(), better, worse)
	}
	if es.Sigma() != es.Config().SigmaMax {
		t.Errorf("sigma %v after many successes, want the ceiling %v", es.Sigma(), es.Config().SigmaMax)
	}
}

func TestWorseCandidateNeverAccepted(t *testing.T) {
	es := newES(t, Config{Seed: 2})
	inc := es.Incumbent()
	for i := range 100 {
		c := es.Propose()
		// Worse by any margin, or equal: rejected, incumbent unchanged.
		out := es.Judge(c, Metrics{N: 10, TTFTP95: 1000 + float64(i)}, Metrics{N: 10, TTFTP95: 1000})
		if out.Accepted || !reflect.DeepEqual(es.Incumbent(), inc) {
			t.Fatalf("candidate %v with a worse score was accepted", c)
		}
	}
	out := es.Judge(es.Propose(), Metrics{N: 10, TTFTP95: 1, Failed: 1}, Metrics{N: 10, TTFTP95: 1000})
	if out.Accepted {
		t.Error("a candidate that failed more requests was accepted")
	}
}

func TestBoundsHold(t *testing.T) {
	es := newES(t, Config{Seed: 3, Sigma: 1, SigmaMax: 1})
	for range 2000 {
		c := es.Propose()
		for i, p := range es.Config().Params {
			if c[i] < p.Min || c[i] > p.Max {
				t.Fatalf("%s = %v outside [%v, %v]", p.Name, c[i], p.Min, p.Max)
			}
		}
		es.Judge(c, Metrics{N: 1, TTFTP95: float64(len(c))}, Metrics{N: 1, TTFTP95: 100})
	}
}

func TestGuardRejectsTTFTWinThatWrecksE2E(t *testing.T) {
	g, err := ParseGuard("e2e-p95=1.05")
	if err != nil {
		t.Fatal(err)
	}
	hack := Metrics{N: 100, TTFTP95: 800, E2EP95: 12500} // all traffic to the nearest replica
	inc := Metrics{N: 100, TTFTP95: 1000, E2EP95: 4000}
	es := newES(t, Config{Seed: 4, Guards: []Guard{g}})
	if out := es.Judge(es.Propose(), hack, inc); out.Accepted || out.Reason != "guard e2e-p95=1.05" {
		t.Errorf("guarded: %+v", out)
	}
	// Within the guard's allowance the TTFT win counts.
	if out := es.Judge(es.Propose(), Metrics{N: 100, TTFTP95: 800, E2EP95: 4150}, inc); !out.Accepted {
		t.Errorf("E2E within 5%%: %+v", out)
	}
	// Steps within the allowance do not compound: after +4%, another +4%
	// (8.2% in all) is refused.
	drift := newES(t, Config{Seed: 4, Guards: []Guard{g}})
	a := Metrics{N: 100, TTFTP95: 900, E2EP95: 4160}
	if out := drift.Judge(drift.Propose(), a, inc); !out.Accepted {
		t.Fatalf("first +4%%: %+v", out)
	}
	if out := drift.Judge(drift.Propose(), Metrics{N: 100, TTFTP95: 800, E2EP95: 4326}, a); out.Accepted {
		t.Errorf("second +4%% accepted: E2E drift compounds past the guard")
	}
	// A step that gives E2E back makes room again.
	if out := drift.Judge(drift.Propose(), Metrics{N: 100, TTFTP95: 850, E2EP95: 3900}, a); !out.Accepted {
		t.Errorf("an E2E improvement was refused: %+v", out)
	}
	noGuard := newES(t, Config{Seed: 4})
	if out := noGuard.Judge(noGuard.Propose(), hack, inc); !out.Accepted {
		t.Errorf("unguarded tuner refused the TTFT win: %+v", out)
	}
	for _, bad := range []string{"e2e-p95", "e2e-p95=0.9", "ttft=1.1", "itl-mean=x"} {
		if _, err := ParseGuard(bad); err == nil {
			t.Errorf("guard %q accepted", bad)
		}
	}
}

// A candidate whose window measured none of a guarded metric (no streamed
// answer of several tokens: ITL 0) leaves the guard's drift as it was
// (found in review: the drift became 0, and the guard never refused again,
// not even a candidate with ten times the ITL).
func TestGuardWithoutEvidenceKeepsItsDrift(t *testing.T) {
	g, err := ParseGuard("itl-mean=1.05")
	if err != nil {
		t.Fatal(err)
	}
	es := newES(t, Config{Seed: 4, Guards: []Guard{g}})
	inc := Metrics{N: 100, TTFTP95: 1000, ITLMean: 20}
	if out := es.Judge(es.Propose(), Metrics{N: 100, TTFTP95: 900}, inc); !out.Accepted {
		t.Fatalf("a TTFT win without an ITL: %+v", out)
	}
	if out := es.Judge(es.Propose(), Metrics{N: 100, TTFTP95: 800, ITLMean: 200}, inc); out.Accepted || out.Reason != "guard itl-mean=1.05" {
		t.Errorf("ten times the ITL: %+v", out)
	}
}

// bowl is a noise-free objective with its minimum at rtt=0.3, queue=0.2.
func bowl(_ context.Context, p Point) (Metrics, error) {
	d := math.Pow(math.Log(p[0]/0.3), 2) + math.Pow(math.Log(p[1]/0.2), 2)
	return Metrics{N: 1, TTFTP95: 1000 * (1 + d), E2EP95: 1000}, nil
}

func TestOfflineFindsTheMinimumAndIsReproducible(t *testing.T) {
	run := func(seed uint64) *OfflineResult {
		res, err := Offline(context.Background(), OfflineConfig{ES: Config{Seed: seed}, Generations: 60, Workers: 2}, bowl, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a, b := run(7), run(7)
	if !reflect.DeepEqual(a, b) {
		t.Error("same seed, different runs")
	}
	if math.Abs(a.Best[0]-0.3) > 0.03 || math.Abs(a.Best[1]-0.2) > 0.02 {
		t.Errorf("best %v, want near [0.3 0.2]", a.Best)
	}
	for i := 1; i < len(a.Steps); i++ {
		if a.Steps[i].Accepted && a.Steps[i].Score >= a.Steps[i].Incumbent {
			t.Fatalf("step %d accepted a candidate no better than the incumbent: %+v", i, a.Steps[i])
		}
	}
	if c := run(8); reflect.DeepEqual(a.Steps, c.Steps) {
		t.Error("different seeds, identical runs")
	}
}

// The online tuner judges each candidate only on the outcomes of requests
// its own weights routed.
func TestOnlineJudgesEachArmOnItsOwnOutcomes(t *testing.T) {
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1}, Window: 4, Hop: 2})
	if err != nil {
		t.Fatal(err)
	}
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	var tags []int
	var d policy.Decision
	for range 8 {
		if err := o.Decide(&d, &policy.Request{PromptTokens: 10}, reps, rand.New(rand.NewPCG(1, 1))); err != nil {
			t.Fatal(err)
		}
		tags = append(tags, d.Tag)
	}
	// Arms alternate every Hop decisions.
	if tags[0] != tags[1] || tags[1] == tags[2] || tags[0] != tags[4] {
		t.Fatalf("tags %v: want pairs alternating between two arms", tags)
	}
	// The candidate's requests are fast, the incumbent's slow: accepted.
	for _, tag := range tags {
		ttft := 2 * time.Second
		if tag%2 == 1 {
			ttft = time.Second
		}
		o.Learn(tag, policy.Outcome{TTFT: ttft, E2E: 3 * time.Second})
	}
	o.Learn(999, policy.Outcome{TTFT: time.Hour}) // stale: ignored
	steps := o.Steps()
	if len(steps) != 1 || !steps[0].Accepted || steps[0].Score != 1000 || steps[0].Incumbent != 2000 {
		t.Fatalf("steps %+v", steps)
	}
	gorgo, _ := policy.Lookup("gorgo")
	if w := o.Incumbent(); !maps.Equal(w, Apply(o.ES(), steps[0].Candidate, gorgo.Defaults())) {
		t.Errorf("incumbent %v, want the accepted candidate %v", w, steps[0].Candidate)
	}
}

// The online tuner keeps a bounded history, and pausing routes with the
// incumbent only, judging nothing.
func TestOnlineHistoryAndPause(t *testing.T) {
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1}, Window: 1, Hop: 1, History: 3})
	if err != nil {
		t.Fatal(err)
	}
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	var d policy.Decision
	rng := rand.New(rand.NewPCG(1, 1))
	round := func() {
		for range 2 {
			if err := o.Decide(&d, &policy.Request{PromptTokens: 10}, reps, rng); err != nil {
				t.Fatal(err)
			}
			o.Learn(d.Tag, policy.Outcome{TTFT: time.Second, E2E: time.Second})
		}
	}
	for range 10 {
		round()
	}
	if judged, _ := o.Counts(); judged != 10 || len(o.Steps()) != 3 {
		t.Fatalf("%d judged, %d kept; want 10 and 3", judged, len(o.Steps()))
	}
	o.Pause()
	inc := o.Incumbent()
	for range 5 {
		round()
		if d.Tag != -1 {
			t.Fatalf("tag %d while paused", d.Tag)
		}
	}
	if judged, _ := o.Counts(); judged != 10 || !maps.Equal(o.Incumbent(), inc) {
		t.Errorf("judged %d while paused", judged)
	}
	if err := o.Resume(); err != nil || o.Paused() {
		t.Fatal(err)
	}
	round()
	if judged, _ := o.Counts(); judged != 11 {
		t.Errorf("%d judged after resuming", judged)
	}
	p, err := o.IncumbentPolicy()
	if err != nil || p.Name() != "gorgo" {
		t.Errorf("incumbent policy %v %v", p, err)
	}
}

// Round shows the round under way: the candidate's values (the base's
// other parameters as configured), and each arm's outcomes of its window.
func TestOnlineRound(t *testing.T) {
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1, Guards: []Guard{{Metric: "e2e-p95", MaxRatio: 1.05}}}, Base: policy.DefaultName, Window: 4, Hop: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := o.Round()
	if _, rtt := r.Candidate["rtt"]; r.Window != 4 || r.Scored != [2]int{} || r.Confirming || rtt || len(r.Candidate) != 2 || r.Candidate["decode"] == 0.2 && r.Candidate["itl"] == 0.2 {
		t.Fatalf("first round %+v: want the tuned decode and itl, one of them moved, nothing scored", r)
	}
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	var d policy.Decision
	rng := rand.New(rand.NewPCG(1, 1))
	for range 3 {
		if err := o.Decide(&d, &policy.Request{PromptTokens: 10}, reps, rng); err != nil {
			t.Fatal(err)
		}
		o.Learn(d.Tag, policy.Outcome{TTFT: time.Second, E2E: time.Second})
	}
	if got := o.Round().Scored; got != [2]int{2, 1} {
		t.Errorf("scored %v after 3 outcomes alternating from the incumbent, want [2 1]", got)
	}
	if got := o.Objective(); got != "p95-ttft, guards e2e-p95=1.05" {
		t.Errorf("objective %q", got)
	}
}

// gorgo-online comes from the registry like any policy, its base's
// untuned parameters from its config.
func TestOnlineIsRegistered(t *testing.T) {
	p, err := policy.New(OnlineName, policy.Options{Config: OnlineConfig{Base: "gorgo-ms", BaseParams: policy.Values{"rtt": 2, "queue": 3},
		ES: Config{Seed: 1, Params: []Param{{Name: "rtt", Min: 0.1, Max: 5, Init: 1}}}}})
	if err != nil {
		t.Fatal(err)
	}
	o := p.(*Online)
	if w := o.Incumbent(); w["queue"] != 3 || w["rtt"] != 1 || o.Base() != "gorgo-ms" {
		t.Errorf("incumbent %v, base %s", w, o.Base())
	}
	if pol, _ := o.IncumbentPolicy(); pol.Name() != "gorgo-ms" {
		t.Errorf("explained with %s", pol.Name())
	}
	if _, err := policy.New(OnlineName, policy.Options{Config: 7}); err == nil {
		t.Error("options of the wrong type accepted")
	}
}

// A policy with a tunable parameter of its own, registered in one file
// (policytest), is tuned like gorgo's weights: the tuner's defaults, its
// bounds and the values it tries come from the registry.
func TestTuneAPolicyOfOneFile(t *testing.T) {
	params := DefaultParams(policytest.Name)
	if len(params) != 1 || params[0].Name != "gain" {
		t.Fatalf("default parameters %+v", params)
	}
	// The metric: how far the gain the policy itself reports is from 3.
	var es *ES
	eval := func(_ context.Context, p Point) (Metrics, error) {
		pol, err := policy.New(policytest.Name, policy.Options{Params: Apply(es, p, nil)})
		if err != nil {
			return Metrics{}, err
		}
		g := pol.(policy.Tunable).Params()["gain"]
		return Metrics{N: 100, TTFTP95: 1000 * math.Abs(math.Log(g/3)), E2EP95: 1}, nil
	}
	cfg := Config{Params: params, Seed: 1}
	var err error
	if es, err = NewES(cfg); err != nil {
		t.Fatal(err)
	}
	res, err := Offline(context.Background(), OfflineConfig{ES: cfg, Generations: 30, Workers: 1}, eval, nil)
	if err != nil {
		t.Fatal(err)
	}
	best := es.Named(res.Best)["gain"]
	if math.Abs(math.Log(best/3)) > math.Abs(math.Log(1.0/3))/2 {
		t.Errorf("tuned gain %v, want closer to 3 than its start at 1", best)
	}
	o, err := NewOnline(OnlineConfig{Base: policytest.Name, ES: Config{Seed: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if v := o.Incumbent(); len(v) != 1 || v["gain"] != 1 {
		t.Errorf("the online tuner over it starts at %v", v)
	}
	if err := CheckParams(policytest.Name, []Param{{Name: "rtt", Min: 1, Max: 2, Init: 1}}); err == nil {
		t.Error("a parameter the policy does not have was accepted")
	}
}

// In block mode the arms alternate by router time: a decision in a
// block's burn-in, or before the round's first whole block, is routed but
// not scored, so each arm is judged on requests that met the load it made.
func TestOnlineBlocksScoreAfterTheBurnIn(t *testing.T) {
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1}, Base: policy.DefaultName, Window: 2, Block: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	rng := rand.New(rand.NewPCG(1, 1))
	tagAt := func(at time.Duration) int {
		var d policy.Decision
		if err := o.Decide(&d, &policy.Request{PromptTokens: 10, Now: at}, reps, rng); err != nil {
			t.Fatal(err)
		}
		return d.Tag
	}
	// The round starts at 3 s: its first whole block starts at 10 s.
	for _, c := range []struct {
		at   time.Duration
		want int
	}{
		{3 * time.Second, -1},  // before the first whole block
		{8 * time.Second, -1},  // still before it, past a burn-in
		{12 * time.Second, -1}, // arm 1's block, burn-in (default half)
		{16 * time.Second, 3},  // arm 1, scored: round 1
		{21 * time.Second, -1}, // arm 0's block, burn-in
		{25 * time.Second, 2},  // arm 0, scored
		{36 * time.Second, 3},
	} {
		if got := tagAt(c.at); got != c.want {
			t.Errorf("tag at %v = %d, want %d", c.at, got, c.want)
		}
	}
	// Two outcomes per arm judge the candidate; the next round scores
	// from the block after its first decision.
	for _, tag := range []int{2, 2, 3, 3} {
		o.Learn(tag, policy.Outcome{TTFT: time.Second, E2E: time.Second})
	}
	if judged, _ := o.Counts(); judged != 1 {
		t.Fatalf("%d judged, want 1", judged)
	}
	if got := tagAt(46 * time.Second); got != -1 {
		t.Errorf("first decision of round 2 tagged %d, want unscored", got)
	}
	if got := tagAt(56 * time.Second); got != 5 {
		t.Errorf("round 2 in its first whole block tagged %d, want 5", got)
	}
	if _, err := NewOnline(OnlineConfig{Block: time.Second, Burn: time.Second}); err == nil {
		t.Error("a burn-in as long as the block was accepted")
	}
}

// A change of the fleet sends the tuner back to its starting weights and
// step size, and starts a new round; one that finds it there already is
// not counted as a fallback.
func TestOnlineFallsBackWhenTheFleetChanges(t *testing.T) {
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 3}, Base: policy.DefaultName, Window: 1, Hop: 1})
	if err != nil {
		t.Fatal(err)
	}
	start := o.Incumbent()
	sigma := o.Sigma()
	o.FleetChanged(policy.FleetChange{Why: "replica x added"})
	if n, _ := o.Resets(); n != 0 {
		t.Fatalf("a fallback from the starting weights counted: %d", n)
	}
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	rng := rand.New(rand.NewPCG(1, 1))
	var d policy.Decision
	// The candidate (arm 1) always wins until one is accepted.
	for i := 0; ; i++ {
		if _, won := o.Counts(); won > 0 {
			break
		}
		if i > 100 {
			t.Fatal("no candidate accepted")
		}
		if err := o.Decide(&d, &policy.Request{PromptTokens: 10}, reps, rng); err != nil {
			t.Fatal(err)
		}
		ttft := 2 * time.Second
		if d.Tag%2 == 1 {
			ttft = time.Second
		}
		o.Learn(d.Tag, policy.Outcome{TTFT: ttft, E2E: time.Second})
	}
	if maps.Equal(o.Incumbent(), start) {
		t.Fatal("the accepted candidate did not move the incumbent")
	}
	round := o.round
	o.FleetChanged(policy.FleetChange{Why: "replica b left"})
	if n, why := o.Resets(); n != 1 || why != "replica b left" {
		t.Errorf("resets %d (%q), want 1 (replica b left)", n, why)
	}
	if !maps.Equal(o.Incumbent(), start) || o.Sigma() != sigma || o.round != round+1 {
		t.Errorf("after the fallback: incumbent %v sigma %v round %d; want %v, %v, %d", o.Incumbent(), o.Sigma(), o.round, start, sigma, round+1)
	}
}

// A candidate that won its first round on the old fleet must win twice on
// the new one (found in review: its win was kept across the change, and
// one window of the new fleet accepted it).
func TestFleetChangeForgetsAWinToConfirm(t *testing.T) {
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1}, Base: policy.DefaultName, Window: 2, Hop: 1, Confirm: true})
	if err != nil {
		t.Fatal(err)
	}
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	rng := rand.New(rand.NewPCG(1, 1))
	var d policy.Decision
	for i := 0; !o.confirming; i++ {
		if i > 1000 {
			t.Fatal("no candidate won its first round")
		}
		if err := o.Decide(&d, &policy.Request{PromptTokens: 10}, reps, rng); err != nil {
			t.Fatal(err)
		}
		ttft := 2 * time.Second
		if d.Tag%2 == 1 {
			ttft = time.Second // the candidate wins
		}
		o.Learn(d.Tag, policy.Outcome{TTFT: ttft, E2E: time.Second})
	}
	o.FleetChanged(policy.FleetChange{Why: "replica x added"})
	if o.confirming {
		t.Error("a win on the old fleet is still to be confirmed on the new one")
	}
}

// With Confirm, a candidate that wins its round is measured again and
// accepted only if it wins that round too; one lucky window moves nothing.
func TestOnlineConfirmsAWin(t *testing.T) {
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1}, Base: policy.DefaultName, Window: 2, Hop: 1, Confirm: true})
	if err != nil {
		t.Fatal(err)
	}
	start := o.Incumbent()
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	rng := rand.New(rand.NewPCG(1, 1))
	// round plays one round: the candidate's TTFT is cand, the incumbent's 2 s.
	round := func(cand time.Duration) {
		var d policy.Decision
		for range 4 {
			if err := o.Decide(&d, &policy.Request{PromptTokens: 10}, reps, rng); err != nil {
				t.Fatal(err)
			}
			ttft := 2 * time.Second
			if d.Tag%2 == 1 {
				ttft = cand
			}
			o.Learn(d.Tag, policy.Outcome{TTFT: ttft, E2E: time.Second})
		}
	}
	round(time.Second) // wins once
	if judged, _ := o.Counts(); judged != 0 || !maps.Equal(o.Incumbent(), start) {
		t.Fatalf("after one win: %d judged, incumbent %v; want none judged, the start", judged, o.Incumbent())
	}
	round(3 * time.Second) // loses the confirmation
	if judged, won := o.Counts(); judged != 1 || won != 0 || !maps.Equal(o.Incumbent(), start) {
		t.Fatalf("after a failed confirmation: %d judged, %d accepted", judged, won)
	}
	round(time.Second) // a new candidate wins twice
	round(time.Second)
	if judged, won := o.Counts(); judged != 2 || won != 1 || maps.Equal(o.Incumbent(), start) {
		t.Errorf("after two wins: %d judged, %d accepted, incumbent %v", judged, won, o.Incumbent())
	}
}

// An arm whose blocks get all the traffic keeps only its latest window of
// outcomes while the other arm's blocks get none.
func TestOnlineSamplesStayBounded(t *testing.T) {
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1}, Base: policy.DefaultName, Window: 4, Block: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	rng := rand.New(rand.NewPCG(1, 1))
	var d policy.Decision
	for i := range 1000 {
		// Traffic only in the scored half of even minutes: arm 0's.
		now := time.Duration(2*i+2)*time.Minute + 45*time.Second
		if err := o.Decide(&d, &policy.Request{PromptTokens: 10, Now: now}, reps, rng); err != nil {
			t.Fatal(err)
		}
		o.Learn(d.Tag, policy.Outcome{TTFT: time.Second, E2E: time.Second})
	}
	if n := len(o.samples[0]); n > 8 || n < 4 {
		t.Errorf("arm 0 holds %d outcomes, want its latest window (4) to twice that", n)
	}
	if judged, _ := o.Counts(); judged != 0 {
		t.Errorf("%d judged without the other arm's outcomes", judged)
	}
}

// With EarlyStop, a candidate already far worse than the incumbent on a
// quarter of its window is dropped then, as a failure for the step size;
// one that is worse by less runs its whole window.
func TestOnlineDropsAClearLoserEarly(t *testing.T) {
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	// play routes n requests, the incumbent's TTFT 2 s, the candidate's
	// cand, and returns how many the tuner had judged.
	play := func(o *Online, n int, cand time.Duration) int {
		rng := rand.New(rand.NewPCG(1, 1))
		var d policy.Decision
		for range n {
			if err := o.Decide(&d, &policy.Request{PromptTokens: 10}, reps, rng); err != nil {
				t.Fatal(err)
			}
			ttft := 2 * time.Second
			if d.Tag%2 == 1 {
				ttft = cand
			}
			o.Learn(d.Tag, policy.Outcome{TTFT: ttft, E2E: 5 * time.Second})
		}
		judged, _ := o.Counts()
		return judged
	}
	newOnline := func() *Online {
		o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1}, Base: policy.DefaultName, Window: 40, Hop: 1, EarlyStop: 1.5})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	// A quarter of a window is 10 outcomes per arm: 20 requests, hops of 1.
	o := newOnline()
	sigma := o.Sigma()
	if n := play(o, 19, 4*time.Second); n != 0 {
		t.Fatalf("judged %d before a quarter window on each arm", n)
	}
	if n := play(o, 1, 4*time.Second); n != 1 {
		t.Fatalf("a candidate at twice the incumbent's TTFT: %d judged after a quarter window, want 1", n)
	}
	if step := o.Steps()[0]; step.Accepted || !strings.HasPrefix(step.Reason, "dropped early: p95-ttft") || o.Sigma() >= sigma {
		t.Errorf("verdict %+v, step size %v (was %v); want dropped early, a smaller step", step, o.Sigma(), sigma)
	}
	o = newOnline()
	if n := play(o, 79, 2500*time.Millisecond); n != 0 {
		t.Errorf("a candidate 25%% worse was judged before its window was full (%d)", n)
	}
	if n := play(o, 1, 2500*time.Millisecond); n != 1 {
		t.Errorf("after a full window: %d judged, want 1", n)
	}
}

// A request's SLO ratio is the nearer of its SLOs to being missed; one
// without SLOs, or failed, has none.
func TestSLORatio(t *testing.T) {
	for _, c := range []struct {
		o    policy.Outcome
		want float64
		ok   bool
	}{
		{policy.Outcome{TTFT: time.Second}, 0, false},
		{policy.Outcome{TTFT: time.Second, TTFTSLO: 2 * time.Second}, 0.5, true},
		{policy.Outcome{TTFT: time.Second, Queued: 500 * time.Millisecond, TTFTSLO: 2 * time.Second}, 0.75, true}, // its SLO runs from arrival
		{policy.Outcome{TTFT: time.Second, TTFTSLO: 2 * time.Second, ITL: 60 * time.Millisecond, TPOTSLO: 50 * time.Millisecond}, 1.2, true},
		{policy.Outcome{ITL: 25 * time.Millisecond, TPOTSLO: 50 * time.Millisecond}, 0.5, true},
		{policy.Outcome{Failed: true, TTFTSLO: time.Second}, 0, false},
		// Bounded: a client's TPOT ask no engine gives cannot make the
		// p95 of the ratios its own (found in review: 0.001 ms made it
		// 20,000 whatever everyone's TTFT).
		{policy.Outcome{TTFT: time.Second, TTFTSLO: 2 * time.Second, ITL: 20 * time.Millisecond, TPOTSLO: time.Microsecond}, policy.MaxSLORatio, true},
	} {
		got, ok := c.o.SLORatio()
		if ok != c.ok || math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%+v: ratio %v, %v; want %v, %v", c.o, got, ok, c.want, c.ok)
		}
	}
}

// With the slo-p95 objective the tuner ranks arms by how near their
// requests came to their SLOs, not by raw TTFT: requests held to
// different SLOs (a tenant's tight one, another's loose) weigh by their
// own, and a time per output token past its SLO counts as much as a late
// first token.
func TestSLOObjective(t *testing.T) {
	tight, loose := time.Second, 30*time.Second
	// The incumbent serves the tight tenant at 900 ms and the loose one at
	// 10 s; the candidate the tight one at 1.5 s (missing its SLO) and the
	// loose one at 5 s. Raw p95 TTFT prefers the candidate; the SLOs do not.
	arm := func(tightTTFT, looseTTFT time.Duration) []Sample {
		var s []Sample
		for i := range 100 {
			if i%2 == 0 {
				s = append(s, policy.Outcome{TTFT: tightTTFT, E2E: tightTTFT, TTFTSLO: tight})
			} else {
				s = append(s, policy.Outcome{TTFT: looseTTFT, E2E: looseTTFT, TTFTSLO: loose})
			}
		}
		return s
	}
	inc, cand := Measure(arm(900*time.Millisecond, 10*time.Second)), Measure(arm(1500*time.Millisecond, 5*time.Second))
	if inc.SLON != 100 || math.Abs(inc.SLOP95-0.9) > 1e-9 || math.Abs(cand.SLOP95-1.5) > 1e-9 {
		t.Fatalf("SLO ratios: incumbent %d at p95 %v, candidate p95 %v; want 100, 0.9 and 1.5", inc.SLON, inc.SLOP95, cand.SLOP95)
	}
	for _, c := range []struct {
		obj    Objective
		accept bool
	}{{P95TTFT, true}, {SLOP95, false}} {
		es := newES(t, Config{Objective: c.obj, Params: []Param{{Name: "rtt", Min: 0.1, Max: 10, Init: 1}}})
		if got := es.Verdict(es.Propose(), cand, inc).Accepted; got != c.accept {
			t.Errorf("%s: accepted %v, want %v", c.obj, got, c.accept)
		}
	}
	// Measured as the samples arrive (early stop's tally), the same.
	var tl tally
	for _, s := range arm(1500*time.Millisecond, 5*time.Second) {
		tl.add(s)
	}
	if m := tl.metrics(); m.SLON != cand.SLON || m.SLOP95 != cand.SLOP95 {
		t.Errorf("tally: %d at %v, want %d at %v", m.SLON, m.SLOP95, cand.SLON, cand.SLOP95)
	}
	// Rebuilt from other samples, the tally forgets the ratios it had.
	tl.rebuild([]Sample{{TTFT: time.Second, E2E: time.Second}})
	if m := tl.metrics(); m.SLON != 0 || m.N != 1 {
		t.Errorf("rebuilt tally: %d ratios of %d requests, want 0 of 1", m.SLON, m.N)
	}
	// A window without SLOs has no slo-p95: no candidate wins on it.
	none := Measure([]Sample{{TTFT: time.Second, E2E: time.Second}})
	if v, err := SLOP95.Of(none); err != nil || !math.IsNaN(v) {
		t.Errorf("slo-p95 of requests without SLOs: %v, %v; want NaN", v, err)
	}
	if got := SLOP95.Format(0.8); got != "0.800" {
		t.Errorf("a ratio formatted as %q", got)
	}
	if _, err := Offline(context.Background(), OfflineConfig{ES: Config{Objective: SLOP95, Params: []Param{{Name: "rtt", Min: 0.1, Max: 10, Init: 1}}}},
		func(context.Context, Point) (Metrics, error) { return Metrics{}, nil }, nil); err == nil {
		t.Error("offline tuning on slo-p95, which whole runs cannot measure: no error")
	}
}

// Under slo-p95 the online tuner judges windows of requests with SLOs:
// requests without them neither fill a window nor cost the step size.
func TestOnlineJudgesRequestsWithSLOs(t *testing.T) {
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1, Objective: SLOP95}, Window: 4, Hop: 1})
	if err != nil {
		t.Fatal(err)
	}
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	var d policy.Decision
	learn := func(n int, slo time.Duration) {
		for range n {
			if err := o.Decide(&d, &policy.Request{PromptTokens: 10, HasSLO: slo > 0}, reps, rand.New(rand.NewPCG(1, 1))); err != nil {
				t.Fatal(err)
			}
			o.Learn(d.Tag, policy.Outcome{TTFT: time.Second, E2E: time.Second, TTFTSLO: slo})
		}
	}
	sigma := o.Sigma()
	learn(100, 0)
	if judged, _ := o.Counts(); judged != 0 || o.Sigma() != sigma || o.Round().Scored != [2]int{} {
		t.Fatalf("after requests without SLOs: %d judged, sigma %v, round %+v; want none, %v, nothing scored", judged, o.Sigma(), o.Round(), sigma)
	}
	learn(8, 2*time.Second)
	if judged, _ := o.Counts(); judged != 1 {
		t.Errorf("after a window of requests with SLOs each: %d judged, want 1", judged)
	}
}

// Whole answers (their first token not seen) fill an arm's window when
// the objective is an E2E's (p95-e2e, p95-e2e-per-token: 1 s over 10
// tokens is 100 ms a token), which they measure as streams do, and are
// passed over when it is a TTFT's: a fleet whose clients never stream is
// tuned on its end-to-end latency (2026-12-07: nothing was learned from
// it, whatever the objective).
func TestOnlineLearnsWholeAnswersForE2E(t *testing.T) {
	for _, c := range []struct {
		objective Objective
		judged    int
		score     float64
	}{{P95TTFT, 0, 0}, {P95E2E, 1, 1000}, {P95E2EPerToken, 1, 100}} {
		o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1, Objective: c.objective}, Window: 4, Hop: 2})
		if err != nil {
			t.Fatal(err)
		}
		reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
		var d policy.Decision
		for range 8 {
			if err := o.Decide(&d, &policy.Request{PromptTokens: 10}, reps, rand.New(rand.NewPCG(1, 1))); err != nil {
				t.Fatal(err)
			}
			e2e := 2 * time.Second
			if d.Tag%2 == 1 {
				e2e = time.Second // the candidate's are faster
			}
			o.Learn(d.Tag, policy.Outcome{Unstreamed: true, E2E: e2e, Tokens: 10})
		}
		judged, _ := o.Counts()
		if judged != c.judged {
			t.Errorf("%s: %d judged after 8 whole answers, want %d", c.objective, judged, c.judged)
			continue
		}
		if steps := o.Steps(); judged == 1 && (!steps[0].Accepted || steps[0].Score != c.score) {
			t.Errorf("%s: %+v, want the candidate's faster answers accepted", c.objective, steps[0])
		}
	}
}

// A request whose outcome the objective cannot use (a whole answer under
// a TTFT objective, one without SLOs under slo-p95) is routed by the
// incumbent, untagged: a candidate
// that nothing judges must not route it (2026-12-07: a fleet whose
// clients never stream had half its requests routed by a candidate drawn
// at start, for ever, and 2% of its p95 E2E lost to it).
func TestOnlineRoutesWhatItCannotJudgeWithTheIncumbent(t *testing.T) {
	for _, c := range []struct {
		objective Objective
		tagged    bool
	}{{P95TTFT, false}, {SLOP95, false}, {P95E2E, true}, {P95E2EPerToken, true}} {
		o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1, Objective: c.objective}, Window: 4, Hop: 1})
		if err != nil {
			t.Fatal(err)
		}
		reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
		var d policy.Decision
		var tags []int
		for range 4 {
			if err := o.Decide(&d, &policy.Request{PromptTokens: 10, Unstreamed: true}, reps, rand.New(rand.NewPCG(1, 1))); err != nil {
				t.Fatal(err)
			}
			tags = append(tags, d.Tag)
		}
		if tagged := tags[0] >= 0 && tags[1] >= 0 && tags[0] != tags[1]; tagged != c.tagged {
			t.Errorf("%s: whole answers' tags %v, want both arms: %v", c.objective, tags, c.tagged)
		}
		if !c.tagged && slices.ContainsFunc(tags, func(tag int) bool { return tag >= 0 }) {
			t.Errorf("%s: a whole answer was tagged for an arm (%v)", c.objective, tags)
		}
		// They are counted, so that a fleet that learns nothing sees why.
		if want := map[bool]int{false: 4, true: 0}[c.tagged]; o.Unjudged() != want {
			t.Errorf("%s: %d decisions counted unjudged, want %d", c.objective, o.Unjudged(), want)
		}
	}
	// Under slo-p95, a request without SLOs is not judged either: the
	// incumbent routes it; one with SLOs goes by the arms.
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1, Objective: SLOP95}, Window: 4, Hop: 1})
	if err != nil {
		t.Fatal(err)
	}
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	var d policy.Decision
	for _, has := range []bool{false, false, true, true} {
		if err := o.Decide(&d, &policy.Request{PromptTokens: 10, HasSLO: has}, reps, rand.New(rand.NewPCG(1, 1))); err != nil {
			t.Fatal(err)
		}
		if (d.Tag >= 0) != has {
			t.Errorf("slo-p95, a request with SLOs %v: tag %d", has, d.Tag)
		}
	}
}

// Under p95-e2e-per-token an answer of a length not known measures
// nothing: it fills no window, and a window without lengths scores no
// number (a review: an arm with none scored 0 and won); a request that
// generates no text goes by the incumbent under any objective.
func TestPerTokenNeedsLengths(t *testing.T) {
	o, err := NewOnline(OnlineConfig{ES: Config{Seed: 1, Objective: P95E2EPerToken}, Window: 4, Hop: 1})
	if err != nil {
		t.Fatal(err)
	}
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	var d policy.Decision
	for range 16 {
		if err := o.Decide(&d, &policy.Request{PromptTokens: 10, Unstreamed: true}, reps, rand.New(rand.NewPCG(1, 1))); err != nil {
			t.Fatal(err)
		}
		o.Learn(d.Tag, policy.Outcome{Unstreamed: true, E2E: time.Second}) // no length
	}
	if judged, _ := o.Counts(); judged != 0 || o.Round().Scored != [2]int{} {
		t.Errorf("answers without lengths: %d judged, round %+v", judged, o.Round())
	}
	if v, err := P95E2EPerToken.Of(Measure([]Sample{{Unstreamed: true, E2E: time.Second}})); err != nil || !math.IsNaN(v) {
		t.Errorf("a window without lengths scores %v (%v), want NaN", v, err)
	}
	if err := o.Decide(&d, &policy.Request{PromptTokens: 10, Unjudged: true}, reps, rand.New(rand.NewPCG(1, 1))); err != nil || d.Tag >= 0 {
		t.Errorf("a request that generates no text: tag %d (%v), want the incumbent's, untagged", d.Tag, err)
	}
}
