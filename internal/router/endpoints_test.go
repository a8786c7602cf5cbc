package router

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// A fleet of SGLang and vLLM replicas: a replica that answered it has no
// /generate is passed over for /generate, and only for it, until
// LackingFor has passed; it stays the last fallback.
func TestLackingReplicaIsPassedOverForItsEndpoint(t *testing.T) {
	r := newRouter(t, "round-robin", 2, false)
	rng := rand.New(rand.NewPCG(1, 1))
	dispatch := func(now time.Duration, endpoint string) (string, []Candidate) {
		t.Helper()
		req := policy.Request{PromptTokens: 16, Endpoint: endpoint}
		tk, fb, err := r.Dispatch(now, &req, rng, make([]Candidate, 0, 2))
		if err != nil {
			t.Fatal(err)
		}
		r.Finish(&tk)
		return tk.ID, fb
	}
	if err := r.Lacks("a", "/generate", time.Second); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for now := time.Second; now < time.Second+LackingFor; now += 10 * time.Second {
		if id, fb := dispatch(now, "/generate"); id != "b" || len(fb) != 1 || fb[0].ID != "a" {
			t.Fatalf("at %v: %s, fallbacks %+v; want b, a the last fallback", now, id, fb)
		}
		for range 2 {
			id, _ := dispatch(now, "/v1/chat/completions")
			seen[id] = true
		}
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("other endpoints went to %v, want both replicas", seen)
	}
	seen = map[string]bool{}
	for range 4 {
		id, _ := dispatch(time.Second+LackingFor, "/generate")
		seen[id] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("after LackingFor: /generate went to %v, want both (asked again)", seen)
	}
	// Both without it: both candidates still (their 404 is the answer).
	now := time.Hour
	r.Lacks("a", "/pooling", now)
	r.Lacks("b", "/pooling", now)
	if _, fb := dispatch(now, "/pooling"); len(fb) != 1 {
		t.Errorf("neither has it: fallbacks %+v, want both candidates", fb)
	}
	if err := r.Lacks("nope", "/pooling", now); err == nil {
		t.Error("an unknown replica: no error")
	}
}

// A client that posts to made-up paths does not grow the router: a
// replica's endpoints are bounded, the soonest due forgotten first, and
// one past MaxEndpoint is not kept.
func TestLackingIsBounded(t *testing.T) {
	r := newRouter(t, "round-robin", 2, false)
	for i := range 10 * MaxLacking {
		r.Lacks("a", fmt.Sprintf("/v1/made-up-%d", i), time.Duration(i)*time.Millisecond)
	}
	r.Lacks("a", "/"+string(make([]byte, MaxEndpoint)), time.Second)
	st := state(t, r, "a")
	if len(st.Lacking) != MaxLacking {
		t.Fatalf("%d endpoints kept, want %d", len(st.Lacking), MaxLacking)
	}
	if _, ok := st.Lacking[fmt.Sprintf("/v1/made-up-%d", 10*MaxLacking-1)]; !ok {
		t.Errorf("the latest endpoint was forgotten: %v", st.Lacking)
	}
	// Expired ones go first.
	r.Lacks("a", "/generate", time.Hour)
	if st := state(t, r, "a"); len(st.Lacking) != 1 || st.Lacking["/generate"] != time.Hour+LackingFor {
		t.Errorf("after the others expired: %v, want /generate alone", st.Lacking)
	}
}
