package router

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
)

func set(t testing.TB, bases []string, adapters ...string) *models.Set {
	t.Helper()
	s, err := models.WithAdapters(bases, adapters)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A decision sees only the replicas that serve the request's model (a
// replica whose models are unknown serves any); the catalog is every
// name served.
func TestDecisionsSeeOnlyReplicasOfTheModel(t *testing.T) {
	r := newRouter(t, "round-robin", 4, false)
	r.SetModels("a", set(t, []string{"m1"}))
	r.SetModels("b", set(t, []string{"m2"}, "x"))
	r.SetModels("c", set(t, []string{"m1", "m1-alias"}))
	// d: unknown.
	rng := rand.New(rand.NewPCG(1, 1))
	for model, want := range map[string][]string{
		"m1": {"a", "c", "d"}, "m1-alias": {"c", "d"}, "m2": {"b", "d"}, "x": {"b", "d"}, "m2:x": {"b", "d"}, "nope": {"d"}, "": {"a", "b", "c", "d"},
	} {
		seen := map[string]int{}
		for range 40 {
			req := policy.Request{PromptTokens: 16, Blocks: blocks(1, 1), Model: model}
			tk, err := r.Route(0, &req, rng)
			if err != nil {
				t.Fatalf("%s: %v", model, err)
			}
			seen[tk.ID]++
			r.Finish(&tk)
		}
		if len(seen) != len(want) {
			t.Errorf("%q went to %v, want %v", model, seen, want)
		}
		for _, id := range want {
			if seen[id] == 0 {
				t.Errorf("%q never went to %s: %v", model, id, seen)
			}
		}
	}
	served, unknown := r.Catalog()
	if served.String() != "m1,m1-alias,m2,x@m2" || unknown != 1 {
		t.Errorf("catalog %s, %d unknown", served, unknown)
	}
	if only, n := r.DefaultModel(); only != "" || n != 3 {
		t.Errorf("default %q of %d", only, n)
	}
	// Without the replica of unknown models, a model no replica serves has
	// nowhere to go.
	r.SetModels("d", set(t, []string{"m1"}))
	req := policy.Request{PromptTokens: 16, Blocks: blocks(1, 1), Model: "nope"}
	if _, err := r.Route(0, &req, rng); !errors.Is(err, policy.ErrNoReplica) {
		t.Errorf("a model nobody serves: %v", err)
	}
	if _, err := r.Predict(0, &req); !errors.Is(err, policy.ErrNoReplica) {
		t.Errorf("predicted a model nobody serves: %v", err)
	}
	// A replica that said 404 for a model loses it (and its adapters).
	if !r.DropModel("b", "m2") || r.DropModel("b", "m2") {
		t.Error("DropModel")
	}
	if st := state(t, r, "b"); st.Models.Len() != 0 {
		t.Errorf("b still serves %s", st.Models)
	}
	if _, unknown := r.Catalog(); unknown != 0 {
		t.Errorf("%d unknown", unknown)
	}
	if only, n := r.DefaultModel(); only != "" || n != 2 {
		t.Errorf("default %q of %d (m1-alias is c's)", only, n)
	}
	// The catalog follows the fleet: c leaves.
	r.Remove("c")
	served, _ = r.Catalog()
	if served.String() != "m1" {
		t.Errorf("catalog after c left: %s", served)
	}
	if only, n := r.DefaultModel(); only != "m1" || n != 1 {
		t.Errorf("default %q of %d", only, n)
	}
}

// adapterRouter is a gorgo-ms router over two replicas of one base model
// with adapters x and y, b 20 ms further than a, one adapter slot each.
func adapterRouter(t testing.TB) *Router {
	t.Helper()
	p, _ := policy.New("gorgo-ms", policy.Options{})
	reps := []ReplicaConfig{replicaConfig(0), replicaConfig(1)}
	for i := range reps {
		reps[i].Models = set(t, []string{"base"}, "x", "y")
		reps[i].MaxLoRAs = 1
	}
	r, err := New(Config{Replicas: reps, Policy: p, BlockTokens: 16, TieMargin: -1, AdapterLoad: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r.ObserveRTT("a", 10*time.Millisecond)
	r.ObserveRTT("b", 30*time.Millisecond)
	return r
}

// An adapter costs its load where it is not resident, and the wait for a
// slot where every slot is held; requests for it go where it is resident.
func TestAdapterAffinity(t *testing.T) {
	r := adapterRouter(t)
	rng := rand.New(rand.NewPCG(1, 1))
	route := func(model string, prompt uint64) Ticket {
		t.Helper()
		req := policy.Request{PromptTokens: 16, Blocks: blocks(prompt, 1), Model: model}
		tk, err := r.Route(0, &req, rng)
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	// Nothing resident: x's load is the same everywhere, a is nearer.
	x1 := route("x", 1)
	if x1.ID != "a" || x1.Adapter != "x" || x1.AdapterLoadMS != 500 || x1.WeightsWaitMS != 0 {
		t.Fatalf("first x: %+v", x1)
	}
	// x is resident at a (in flight there): the next x goes there free.
	x2 := route("x", 2)
	if x2.ID != "a" || x2.AdapterLoadMS != 0 {
		t.Errorf("second x: %+v", x2)
	}
	// y at a would wait for its one slot: it goes to b, loading there.
	y1 := route("y", 3)
	if y1.ID != "b" || y1.AdapterLoadMS != 500 || y1.WeightsWaitMS != 0 {
		t.Errorf("y: %+v", y1)
	}
	// A base-model request costs no adapter anywhere.
	if b := route("base", 4); b.Adapter != "" || b.AdapterLoadMS != 0 || b.ID != "a" {
		t.Errorf("base: %+v", b)
	}
	// x ends at a: still resident there (its slot's last user), not at b.
	r.Finish(&x1)
	r.Finish(&x2)
	if st := state(t, r, "a"); len(st.Adapters.Resident) != 1 || st.Adapters.Resident[0] != "x" || st.Adapters.Slots != 1 {
		t.Errorf("a's adapters %+v", st.Adapters)
	}
	// With y still busy at b, y at a costs a load (x holds the slot but is
	// idle: no wait), x at b a load and a wait.
	req := policy.Request{PromptTokens: 16, Blocks: blocks(5, 1), Model: "x"}
	c, scored, err := r.Explain(0, &req, r.cfg.Policy, rng)
	if err != nil || c.ID != "a" {
		t.Fatalf("x again: %+v %v", c, err)
	}
	for _, s := range scored {
		switch s.ID {
		case "a":
			if s.Terms.Adapter != 0 {
				t.Errorf("x at a costs %v", s.Terms.Adapter)
			}
		case "b":
			if s.Terms.Adapter <= 500 {
				t.Errorf("x at b (y holds its slot) costs %v, want the load and a wait", s.Terms.Adapter)
			}
		}
	}
	// The engine says b runs x: x is resident there.
	r.ObserveAdapters("b", AdapterGauges{MaxLoRAs: 2, Running: []string{"x"}})
	if st := state(t, r, "b"); st.Adapters.Slots != 1 { // the config's max_loras wins
		t.Errorf("b's slots %d", st.Adapters.Slots)
	}
	_, scored, _ = r.Explain(0, &req, r.cfg.Policy, rng)
	for _, s := range scored {
		if s.ID == "b" && s.Terms.Adapter != 0 {
			t.Errorf("x at b, running there, costs %v", s.Terms.Adapter)
		}
	}
}

// The load time is learned from first tokens that had to load the adapter.
func TestAdapterLoadIsLearned(t *testing.T) {
	r := adapterRouter(t)
	r.Remove("b")
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 20 {
		// Alternate x and y on a's one slot so that each loads again.
		model := []string{"x", "y"}[i%2]
		req := policy.Request{PromptTokens: 16, Blocks: blocks(uint64(i), 1), Model: model}
		tk, err := r.Route(time.Duration(i)*time.Second, &req, rng)
		if err != nil {
			t.Fatal(err)
		}
		if tk.AdapterLoadMS > 0 && tk.WeightsWaitMS == 0 {
			// The load took 100 ms past the model's prediction without it.
			r.FirstToken(&tk, time.Duration((tk.Predicted-tk.AdapterLoadMS+100)*1e6))
		}
		r.Finish(&tk)
	}
	for _, a := range []string{"x", "y"} {
		if got := r.AdapterLoad(a); math.Abs(got-100) > 20 {
			t.Errorf("%s's load learned as %.1f ms, want about 100", a, got)
		}
	}
	if got := r.AdapterLoad("z"); got != 500 {
		t.Errorf("an adapter never measured: %v, want the prior", got)
	}
}

// With models and adapters in play a decision still allocates nothing.
func TestDecideWithAdaptersDoesNotAllocate(t *testing.T) {
	r := adapterRouter(t)
	rng := rand.New(rand.NewPCG(1, 1))
	for _, model := range []string{"base", "x", "base:y"} {
		req := &policy.Request{PromptTokens: 160, Blocks: blocks(1, 10), Model: model}
		tk, err := r.Route(0, req, rng)
		if err != nil {
			t.Fatal(err)
		}
		r.Finish(&tk)
		checkNoAllocs(t, model, r, req, rng, 1)
	}
}

// A fallback ranked when the request was dispatched may, by the time it is
// tried (after a header or first-byte timeout: up to minutes), no longer
// serve the request's model: its list was read again without it, or it
// answered 404 for it to another request. Redispatch skips it, as it skips
// one no longer available.
func TestRedispatchSkipsAFallbackThatLostTheModel(t *testing.T) {
	r := newRouter(t, "round-robin", 3, false)
	for _, id := range []string{"a", "b", "c"} {
		r.SetModels(id, set(t, []string{"m1"}))
	}
	rng := rand.New(rand.NewPCG(1, 1))
	req := policy.Request{PromptTokens: 16, Blocks: blocks(1, 1), Model: "m1"}
	tk, fbs, err := r.Dispatch(0, &req, rng, make([]Candidate, 0, 2))
	if err != nil || len(fbs) != 2 {
		t.Fatalf("dispatch: %v, %d fallbacks", err, len(fbs))
	}
	r.Finish(&tk) // the first attempt failed
	for i := range fbs {
		r.SetModels(fbs[i].ID, set(t, []string{"m2"}))
	}
	for i := range fbs {
		if t2, ok := r.Redispatch(0, &fbs[i], &req); ok {
			t.Errorf("m1 redispatched to %s, which the router knows serves only m2", t2.ID)
			r.Finish(&t2)
		}
	}
}

// One base served under two names (vLLM's --served-model-name m m-alias,
// each listed with the same root) is one base: a request naming no model
// gets the name the most replicas serve. Names with different roots, or
// none (a config's), are different bases.
func TestOneBaseUnderTwoNames(t *testing.T) {
	r := newRouter(t, "round-robin", 2, false)
	ab, b := rooted(t, "/w", "m", "m-alias"), rooted(t, "/w", "m-alias")
	r.SetModels("a", ab)
	r.SetModels("b", b)
	if name, bases := r.DefaultModel(); name != "m-alias" || bases != 1 {
		t.Errorf("default model %q of %d bases, want m-alias of 1", name, bases)
	}
	r.SetModels("b", ab)
	if name, bases := r.DefaultModel(); name != "m" || bases != 1 {
		t.Errorf("default model %q of %d bases, want m of 1", name, bases)
	}
	if got := r.BaseName("m-alias"); got != "m" {
		t.Errorf("BaseName(m-alias) = %q, want m: one cache key for a base's names", got)
	}
	if got := r.BaseName("other"); got != "other" {
		t.Errorf("BaseName(other) = %q, want itself", got)
	}
	r.SetModels("b", set(t, []string{"m2"}))
	if name, bases := r.DefaultModel(); name != "" || bases != 2 {
		t.Errorf("default model %q of %d bases, want none of 2", name, bases)
	}
	// Different models mounted at one path on different replicas (as
	// KServe and many charts do) are different bases.
	r.SetModels("a", rooted(t, "/mnt/models", "llama-8b"))
	r.SetModels("b", rooted(t, "/mnt/models", "qwen-7b"))
	if name, bases := r.DefaultModel(); name != "" || bases != 2 {
		t.Errorf("two models at one path on two replicas: default %q of %d bases, want none of 2", name, bases)
	}
}

// rooted is a set of base models listed with one root, as an engine lists
// the names it serves one model under.
func rooted(t *testing.T, root string, names ...string) *models.Set {
	t.Helper()
	ms := make([]models.Model, len(names))
	for i, n := range names {
		ms[i] = models.Model{ID: n, Root: root}
	}
	s, err := models.NewSet(ms)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Predict's floor (what a replica would give idle) leaves out the wait for
// an adapter's slot that requests in flight hold: it is load, and a request
// refused for its floor is told no wait can help (a review, 2026-12-07: the
// floor rose from 0.5 s to 3.1 s with the slot held).
func TestFloorLeavesOutTheSlotWait(t *testing.T) {
	r := adapterRouter(t)
	if err := r.Remove("b"); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	y := policy.Request{PromptTokens: 16, Blocks: blocks(9, 1), Model: "y"}
	idle, err := r.Predict(0, &y)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		x := policy.Request{PromptTokens: 16, Blocks: blocks(uint64(i+1), 1), Model: "x", ExpectedOutputTokens: 500}
		if _, err := r.Route(0, &x, rng); err != nil {
			t.Fatal(err)
		}
	}
	busy, err := r.Predict(0, &y)
	if err != nil {
		t.Fatal(err)
	}
	if busy.Floor != idle.Floor || busy.Best <= idle.Best {
		t.Errorf("with the slot held: floor %v (idle %v), best %v (idle %v); want the floor alike, the best later", busy.Floor, idle.Floor, busy.Best, idle.Best)
	}
}
