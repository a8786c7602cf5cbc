package mesh

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// A dispatch event carries the prompt's first maxMirrorBlocks blocks, all
// a receiver keeps (2026-12-05: every block, so that a long prompt, 1M
// tokens in 16-token blocks, vLLM's block size, about 4 MiB of text under
// max_body_bytes, made an event of more than NATS's default max_payload,
// 1 MiB: Publish failed, the dispatch was never mirrored, and the bus was
// marked as having lost events, so that its next reconnect made every
// router forget all its mirrors).
func TestLongPromptIsMirrored(t *testing.T) {
	url := natsServer(t)
	rB := newRouter(t)
	us, eu := join(t, url, "us", newRouter(t)), join(t, url, "eu", rB)
	var charges atomic.Int64
	eu.OnCharge(func(string, float64, float64) { charges.Add(1) })
	blocks := make([]uint64, 1<<16)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range blocks {
		blocks[i] = rng.Uint64()
	}
	us.Dispatched(1, "a", 0, &policy.Request{PromptTokens: 16 << 16, Blocks: blocks})
	us.Charged("team", 1, 0) // after the dispatch: once eu has it, it has the dispatch
	eventually(t, "eu to hear us's charge", func() bool { return charges.Load() == 1 })
	if n, _ := inFlight(t, rB, "a"); n != 1 {
		t.Errorf("a 1M-token prompt's dispatch was not mirrored: %d in flight at a", n)
	}
	if us.lost.Load() {
		t.Errorf("the bus believes it lost events: its next reconnect resets every mirror of its requests")
	}
}
