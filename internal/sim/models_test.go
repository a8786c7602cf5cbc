package sim

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/prefix"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

func resolve(t *testing.T, nameOrFile string) []Replica {
	t.Helper()
	_, reps := loadTopology(t, nameOrFile)
	return reps
}

// loadTopology loads a topology (a preset's name or a file) and resolves
// its replicas.
func loadTopology(t testing.TB, nameOrFile string) (Topology, []Replica) {
	t.Helper()
	top, err := LoadTopology(nameOrFile)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := top.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	return top, reps
}

// mixed is the embedded workload with each session naming a model.
func mixed(t *testing.T, d time.Duration, mix string) []trace.Request {
	t.Helper()
	reqs, err := trace.Generate(trace.GenConfig{Preset: "artchat", Seed: 1, Duration: d})
	if err != nil {
		t.Fatal(err)
	}
	ws, err := trace.ParseModelWeights(mix)
	if err != nil {
		t.Fatal(err)
	}
	trace.AssignModels(reqs, ws, 1)
	return reqs
}

// checkServed fails the test for a record served by a replica that does
// not serve its model, or not served at all.
func checkServed(t *testing.T, label string, res *Result, reps []Replica, reqs []trace.Request) {
	t.Helper()
	byID := map[string]Replica{}
	for _, r := range reps {
		byID[r.ID] = r
	}
	for i, rec := range res.Records {
		if rec.Failed {
			t.Fatalf("%s: request %d (%s) failed: %s", label, i, reqs[i].Model, rec.Error)
		}
		if rec.Model != reqs[i].Model {
			t.Fatalf("%s: record %d has model %q, its request %q", label, i, rec.Model, reqs[i].Model)
		}
		if _, ok := byID[rec.Replica].Models.Lookup(reqs[i].Model); !ok {
			t.Fatalf("%s: request %d for %s went to %s, which serves %s", label, i, reqs[i].Model, rec.Replica, byID[rec.Replica].Models)
		}
	}
}

// Across a mixed-model run no request goes to a replica that does not
// serve its model, whatever the policy (the clairvoyant's what-ifs
// included), and every request is served.
func TestRequestsGoOnlyToTheirModelsReplicas(t *testing.T) {
	reps := resolve(t, "../../examples/topologies/two-models.yaml")
	reqs := mixed(t, 5*time.Minute, "model-a:0.5,model-b:0.5")
	before := make([][]uint64, len(reqs))
	for i := range reqs {
		before[i] = slices.Clone(reqs[i].HashIDs)
	}
	for _, name := range []string{policy.DefaultName, "round-robin", "least-request", "simple-session-affinity", "prefix-cache", ClairvoyantName} {
		res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, name), MaxInflight: DefaultMaxInflight, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		checkServed(t, name, res, reps, reqs)
		if got := res.Run.Models; got["model-a"]+got["model-b"] != len(reqs) {
			t.Errorf("%s: models counted %v, want %d requests", name, got, len(reqs))
		}
		if res.Run.AdapterHitRatio != nil {
			t.Errorf("%s: an adapter hit ratio without adapters", name)
		}
	}
	for i := range reqs {
		if !slices.Equal(reqs[i].HashIDs, before[i]) {
			t.Fatalf("request %d's hash ids were changed by the runs", i)
		}
	}
}

// The same in a mesh: each region's router (two replicas per region, one
// per model) sends a request only to its model's replicas.
func TestMeshRespectsModels(t *testing.T) {
	top, err := LoadTopology("paper-mesh-2")
	if err != nil {
		t.Fatal(err)
	}
	reps, err := top.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	for i := range reps {
		name := "model-a"
		if strings.HasSuffix(reps[i].ID, "-2") {
			name = "model-b"
		}
		if reps[i].Models, err = models.Names(name); err != nil {
			t.Fatal(err)
		}
	}
	reqs := mixed(t, 5*time.Minute, "model-a,model-b")
	for _, arr := range []string{ArrangeCentral, ArrangeRegionLocal, "gorgo-e2e"} {
		for _, sharing := range []Sharing{ShareNone, ShareDelayed} {
			m := arrange(t, top, reps, arr, sharing)
			res, err := Run(Config{Replicas: reps, Requests: reqs, Mesh: m, Seed: 1, MaxInflight: DefaultMaxInflight})
			if err != nil {
				t.Fatal(err)
			}
			checkServed(t, arr+"/"+sharing.String(), res, reps, reqs)
		}
	}
}

// A request naming a model no replica serves fails as one with no replica
// does; the others are served. A replica of unknown models (no models:)
// serves any model.
func TestUnservedModelFails(t *testing.T) {
	p := profile(t, "paper")
	a, err := models.Names("model-a")
	if err != nil {
		t.Fatal(err)
	}
	reqs := []trace.Request{request(0, 1, 1000, 5), request(time.Second, 2, 1000, 5), request(2*time.Second, 3, 1000, 5)}
	reqs[0].Model, reqs[1].Model = "model-a", "model-z"
	reps := []Replica{{ID: "a", RTT: 10 * time.Millisecond, Profile: p, Models: a}}
	res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, policy.DefaultName)})
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Records; r[0].Failed || !r[1].Failed || r[2].Failed {
		t.Fatalf("records %+v", r)
	}
	if e := res.Records[1].Error; !strings.Contains(e, policy.ErrNoReplica.Error()) {
		t.Errorf("error %q, want %q", e, policy.ErrNoReplica)
	}
	reps = append(reps, Replica{ID: "any", RTT: 50 * time.Millisecond, Profile: p})
	res, err = Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, policy.DefaultName)})
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Records[1]; r.Failed || r.Replica != "any" {
		t.Errorf("with a replica of unknown models: %+v", r)
	}
}

// Engines key their caches by model: a prompt cached for one model is no
// hit for another; a request naming no model keeps the trace's blocks.
func TestCacheIsPerModel(t *testing.T) {
	p := profile(t, "paper")
	reps := []Replica{{ID: "a", RTT: 10 * time.Millisecond, Profile: p}}
	var reqs []trace.Request
	for k, m := range []string{"x", "y", "x", "", ""} {
		r := request(time.Duration(k)*10*time.Second, 1, 2048, 5)
		r.Model = m
		reqs = append(reqs, r)
	}
	res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "round-robin")})
	if err != nil {
		t.Fatal(err)
	}
	var cached []int
	for _, r := range res.Records {
		cached = append(cached, r.CachedTokens)
	}
	// 2,048 tokens: four full blocks, all but the last token cached.
	if want := []int{0, 0, 2047, 0, 2047}; !reflect.DeepEqual(cached, want) {
		t.Errorf("cached tokens %v, want %v (x, y, x again, none, none again)", cached, want)
	}
	if est := res.Records[2].EstCachedTokens; est != 2048 {
		t.Errorf("the router's estimate for x's second request: %d, want 2048", est)
	}
	if est := res.Records[1].EstCachedTokens; est != 0 {
		t.Errorf("the router credited y with x's prefix: %d", est)
	}
}

func fmtRatio(h *float64) string {
	if h == nil {
		return "none"
	}
	return fmt.Sprint(*h)
}

// Adapter requests run with their adapter on the replica's engine, and
// the run counts how many found it resident: one base, a, b, a again on
// one slot: b evicts a, so a loads again.
func TestAdapterHitRatio(t *testing.T) {
	p := profile(t, "paper")
	set, err := models.WithAdapters([]string{"base"}, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	reps := []Replica{{ID: "r", RTT: 10 * time.Millisecond, Profile: p, Models: set, MaxLoRAs: 1, LoRALoadTime: 300 * time.Millisecond}}
	var reqs []trace.Request
	for k, m := range []string{"base", "a", "a", "b", "a"} {
		r := request(time.Duration(k)*10*time.Second, uint64(k+1), 1000, 5)
		r.Model = m
		reqs = append(reqs, r)
	}
	res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "round-robin")})
	if err != nil {
		t.Fatal(err)
	}
	g := res.Engines[0]
	if g.AdapterRequests != 4 || g.AdapterLoads != 3 {
		t.Errorf("engine counted %d adapter requests, %d loads; want 4 and 3", g.AdapterRequests, g.AdapterLoads)
	}
	if h := res.Run.AdapterHitRatio; h == nil || *h != 0.25 || res.Run.AdapterRequests != 4 {
		t.Errorf("run: %d adapter requests, hit %v; want 4, 0.25", res.Run.AdapterRequests, h)
	}
	// Scored from the third request (the warm-up's first a, a load, not
	// counted): a resident, then b and a, both loads.
	scored, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "round-robin"), ScoreFrom: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if h := scored.Run.AdapterHitRatio; h == nil || math.Abs(*h-1.0/3) > 1e-9 || scored.Run.AdapterRequests != 3 {
		t.Errorf("scored from 20 s: %d adapter requests, hit %v; want 3, 1/3", scored.Run.AdapterRequests, fmtRatio(h))
	}
	// A warm-up request still waiting for the slot when the scored part
	// begins is the warm-up's, whenever it runs: a's long answer holds the
	// slot, b waits for it past 5 s, base requests alone are scored.
	var queued []trace.Request
	for k, c := range []struct {
		at     time.Duration
		model  string
		output int
	}{{0, "a", 3000}, {time.Second, "b", 5}, {5 * time.Second, "base", 5}, {6 * time.Second, "base", 5}} {
		r := request(c.at, uint64(k+1), 1000, c.output)
		r.Model = c.model
		queued = append(queued, r)
	}
	q, err := Run(Config{Replicas: reps, Requests: queued, Policy: newPolicy(t, "round-robin"), ScoreFrom: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if q.Run.AdapterRequests != 0 || q.Run.AdapterHitRatio != nil {
		t.Errorf("a queued warm-up: %d adapter requests scored (hit %s); want none", q.Run.AdapterRequests, fmtRatio(q.Run.AdapterHitRatio))
	}
	// A load adds its time to the first token: a's first request (a load)
	// against its second (resident).
	if d := res.Records[1].TTFT - res.Records[2].TTFT; d < 250 {
		t.Errorf("TTFT of a load %.0f ms, of a resident adapter %.0f ms: want the load's 300 ms between them",
			res.Records[1].TTFT, res.Records[2].TTFT)
	}
}

// The scrape tells the router what a real vLLM's /metrics would: the
// engine's slots and the adapters of its running requests, by name.
func TestScrapeReportsRunningAdapters(t *testing.T) {
	p := profile(t, "paper")
	set, err := models.WithAdapters([]string{"base"}, []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	reqs := []trace.Request{request(0, 1, 1000, 50), request(0, 2, 1000, 50), request(0, 3, 1000, 50), request(0, 4, 1000, 50)}
	for k, m := range []string{"a", "base", "base:c", "a"} {
		reqs[k].Model = m
	}
	eng, err := engine.New(engine.Config{Profile: p, PageTokens: trace.BlockTokens, MaxLoRAs: 3})
	if err != nil {
		t.Fatal(err)
	}
	s := &simulator{cfg: Config{Requests: reqs}}
	s.keyBlocks()
	s.reps = []replicaState{{cfg: Replica{ID: "r", Models: set}, eng: eng, lora: true}}
	for i := range reqs {
		er := s.engineRequest(i, 0)
		if want := map[int]uint64{0: prefix.ModelKey("a"), 1: 0, 2: prefix.ModelKey("c"), 3: prefix.ModelKey("a")}[i]; er.Adapter != want {
			t.Errorf("request %d (%s): adapter %x, want %x", i, reqs[i].Model, er.Adapter, want)
		}
		if err := eng.Submit(0, er); err != nil {
			t.Fatal(err)
		}
	}
	eng.Advance(time.Millisecond, nil) // admit them
	g := s.adapterGauges(0)
	if g == nil || g.MaxLoRAs != 3 || g.RunningCount != 2 {
		t.Fatalf("gauges %+v", g)
	}
	if got := slices.Sorted(slices.Values(g.Running)); !reflect.DeepEqual(got, []string{"a", "c"}) {
		t.Errorf("running adapters %v, want a and c", got)
	}
	s.reps[0].lora = false
	if g := s.adapterGauges(0); g != nil {
		t.Errorf("a replica without adapters reports %+v", g)
	}
}

// Adapter affinity: on the lora topology, with a workload mixing its eight
// adapters, the default policy (which prices an adapter load where the
// adapter is not believed resident) finds the adapter resident more often
// than round-robin does, and has a lower p95 TTFT.
func TestAdapterAffinityBeatsRoundRobin(t *testing.T) {
	reps := resolve(t, "../../examples/topologies/lora.yaml")
	reqs := mixed(t, 10*time.Minute, "base:1,lora-1:1,lora-2:1,lora-3:1,lora-4:1,lora-5:1,lora-6:1,lora-7:1,lora-8:1")
	run := func(name string) *Result {
		res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, name), MaxInflight: DefaultMaxInflight, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		checkServed(t, name, res, reps, reqs)
		if res.Run.AdapterHitRatio == nil || res.Run.AdapterRequests == 0 {
			t.Fatalf("%s: no adapter requests counted", name)
		}
		return res
	}
	def, rr := run(policy.DefaultName), run("round-robin")
	dh, rh := *def.Run.AdapterHitRatio, *rr.Run.AdapterHitRatio
	t.Logf("adapter hit: default %.3f, round-robin %.3f; p95 TTFT: default %.0f ms, round-robin %.0f ms",
		dh, rh, def.Run.TTFT.P95, rr.Run.TTFT.P95)
	if dh < rh+0.03 {
		t.Errorf("adapter hit: default %.3f, round-robin %.3f; want the default's higher", dh, rh)
	}
	if def.Run.TTFT.P95 > 0.8*rr.Run.TTFT.P95 {
		t.Errorf("p95 TTFT: default %.0f ms, round-robin %.0f ms; want the default's lower", def.Run.TTFT.P95, rr.Run.TTFT.P95)
	}
}

func TestTopologyModels(t *testing.T) {
	path := writeFile(t, "m.yaml", `
router_region: a
regions: [{name: a, rtt_ms: 1}]
replicas:
  - {name: any, region: a, profile: paper}
  - {name: two, region: a, profile: paper, models: [m1, m2]}
  - {name: lora, region: a, profile: paper, count: 2, models: [base], adapters: [x, y], max_loras: 1, lora_load_time: 250ms}
`)
	reps := resolve(t, path)
	if len(reps) != 4 {
		t.Fatalf("%d replicas", len(reps))
	}
	if reps[0].Models != nil {
		t.Errorf("a replica without models: %v, want nil (any model)", reps[0].Models)
	}
	if got := reps[1].Models.String(); got != "m1,m2" || reps[1].MaxLoRAs != 0 {
		t.Errorf("two models: %s, %d slots", got, reps[1].MaxLoRAs)
	}
	for _, r := range reps[2:] {
		if got := r.Models.String(); got != "base,x@base,y@base" || r.MaxLoRAs != 1 || r.LoRALoadTime != 250*time.Millisecond {
			t.Errorf("%s: %s, %d slots, load %v", r.ID, got, r.MaxLoRAs, r.LoRALoadTime)
		}
	}
	for _, c := range []struct{ spec, want string }{
		{"adapters: [x]", "adapters need a base model"},
		{"models: [m], adapters: [m]", "listed twice"},
		{"models: [m, m]", "listed twice"},
		{"models: ['']", "no name"},
		{"models: [m], adapters: [x], max_loras: -1", "max_loras must not be negative"},
		{"models: [m], adapters: [x], lora_load_time: -1s", "lora_load_time must not be negative"},
		{"models: [m], max_loras: 2", "need adapters"},
		{"models: [m], adapters: [x], lora_load_time: 500", "line 3: `500` is not a duration (e.g. 30s)"},
	} {
		path := writeFile(t, "bad.yaml", "router_region: a\nregions: [{name: a, rtt_ms: 1}]\nreplicas: [{region: a, profile: paper, "+c.spec+"}]\n")
		top, err := LoadTopology(path)
		if err == nil {
			_, err = top.Resolve()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.spec, err, c.want)
		}
	}
}

func TestParseEventSpecModels(t *testing.T) {
	e, err := ParseEventSpec("5m add n region=r models=b adapters=x,y max_loras=2 lora_load_time=300ms")
	if err != nil {
		t.Fatal(err)
	}
	a := e.Add
	if !slices.Equal(a.Models, []string{"b"}) || !slices.Equal(a.Adapters, []string{"x", "y"}) || a.MaxLoRAs != 2 || a.LoRALoadTime != 300*time.Millisecond {
		t.Errorf("spec %+v", *a)
	}
	for _, bad := range []string{"5m add n region=r max_loras=x", "5m add n region=r lora_load_time=5"} {
		if _, err := ParseEventSpec(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
