package router

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// A replica's scraped KV capacity sizes its share of the prefix index, but
// only up to maxIndexKVTokens: a gauge gone wrong (2^53 tokens, as an
// engine's /metrics may say) once made the share never evict, so the index
// grew with every request sent there. The capacity is still reported as
// the engine gave it, and a sane one still sizes the share.
func TestScrapedKVCapacityBoundsTheIndex(t *testing.T) {
	const bt = 1024 // large blocks: the bound is maxIndexKVTokens/bt blocks, quick to fill
	p, _ := policy.New(policy.DefaultName, policy.Options{})
	r, err := New(Config{Policy: p, BlockTokens: bt})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Add(ReplicaConfig{ID: "a", KVCapacityTokens: 1 << 20, PrefillMSPerToken: 0.06, QueueMSPerToken: 0.06}); err != nil {
		t.Fatal(err)
	}
	send := func(blocks int) { // blocks new distinct blocks, in prompts of 64
		for i := 0; i < blocks; i += 64 {
			req := policy.Request{Blocks: make([]uint64, 64)}
			for j := range req.Blocks {
				req.Blocks[j] = uint64(blocks)<<32 | uint64(i+j+1)
			}
			tk := Ticket{m: r.fleet.Load().byID["a"]}
			r.Accepted(&tk, &req)
		}
	}
	const bound = maxIndexKVTokens / bt
	if err := r.SetKVCapacity("a", 1<<53); err != nil {
		t.Fatal(err)
	}
	send(bound + bound/4)
	st, _ := r.Replica("a")
	if st.IndexBlocks != bound {
		t.Errorf("after a report of 2^53 tokens, the index holds %d blocks for the replica, want the bound %d", st.IndexBlocks, bound)
	}
	if st.KVCapacityTokens != 1<<53 {
		t.Errorf("the reported capacity became %d", st.KVCapacityTokens)
	}
	// A sane report still sizes the share, down as well as up.
	if err := r.SetKVCapacity("a", 64*bt); err != nil {
		t.Fatal(err)
	}
	send(256)
	if st, _ := r.Replica("a"); st.IndexBlocks != 64 {
		t.Errorf("after a report of %d tokens, the index holds %d blocks, want 64", 64*bt, st.IndexBlocks)
	}
}

// One answer whose length is no answer's (a replica's usage of 2^40
// tokens, or a peer's report of it) does not move the expected output: it
// once moved it from about 200 tokens to 10^10 for hundreds of requests.
func TestImpossibleAnswerLengthIsNotLearned(t *testing.T) {
	p, _ := policy.New(policy.DefaultName, policy.Options{})
	r, err := New(Config{Policy: p, BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	r.Add(ReplicaConfig{ID: "a", KVCapacityTokens: 1 << 20, PrefillMSPerToken: 0.06, QueueMSPerToken: 0.06})
	r.ObserveRTT("a", 10*time.Millisecond)
	rng := rand.New(rand.NewPCG(1, 1))
	end := func(out int) {
		req := policy.Request{PromptTokens: 100}
		tk, err := r.Route(0, &req, rng)
		if err != nil {
			t.Fatal(err)
		}
		r.Decoded(&tk, out, time.Second)
		r.Finish(&tk)
	}
	for range 200 {
		end(200)
	}
	before := r.ExpectedOutput(&policy.Request{})
	end(1 << 40)
	if after := r.ExpectedOutput(&policy.Request{}); after != before {
		t.Errorf("one answer of 2^40 tokens moved the expected output from %d to %d", before, after)
	}
}
