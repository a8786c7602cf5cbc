package router

import (
	"fmt"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// Another router's dispatches this router has not heard of yet are in the
// backlog a request of its own would find at the replica, in the view the
// policies see and in the forecast: the origin's recent rate of uncached
// tokens there times the window leg(S,R) + d(R,X) − d(S,X).
func TestUnheardDispatchesJoinTheBacklog(t *testing.T) {
	r := newRouter(t, "round-robin", 1, false) // a: 10 ms, so 5 ms one way
	m, err := r.member("a")
	if err != nil {
		t.Fatal(err)
	}
	unheard := func(now time.Duration) int { return m.view(now, 0).BacklogTokens - int(m.backlog.Load()) }
	far := Origin{Name: "far", Leg: 45 * time.Millisecond, RTT: 0}                   // window 45 + 5 − 0 = 50 ms
	near := Origin{Name: "near", Leg: time.Millisecond, RTT: 100 * time.Millisecond} // 1 + 5 − 50 < 0: none
	for i := range 10 {
		for _, from := range []Origin{far, near, {}} {
			if _, ok := r.Enter(0, "a", &policy.Request{PromptTokens: 1000, Blocks: blocks(uint64(1+i), 4)}, OutputKeys{}, from); !ok {
				t.Fatal("not entered")
			}
		}
	}
	// far: 10 × 1,000 uncached tokens heard at 0 (none was Accepted, so
	// the index credits no prefix), a rate of 1,000 tokens/s over
	// flowTau: 50 ms of it is 50 tokens.
	if got := unheard(0); got != 50 {
		t.Fatalf("unheard at 0: %d tokens, want 50", got)
	}
	if got := unheard(flowTau); got != 18 { // 50/e, as the rate fades
		t.Fatalf("unheard a time constant later: %d tokens, want 18", got)
	}
	_, mean, _ := m.forecast(0, 0, 0, 0)
	if want := float64(m.backlog.Load()+50) * 0.06; mean < want-1e-9 || mean > want+1e-9 {
		t.Fatalf("forecast's wait %.3f ms, want %.3f (the ledger's backlog and the unheard)", mean, want)
	}
	// The origins a replica keeps are bounded: the least busy make room.
	for i := range 2 * maxFlows {
		r.Enter(0, "a", &policy.Request{PromptTokens: 1}, OutputKeys{}, Origin{Name: fmt.Sprint("o", i), Leg: time.Second})
	}
	kept := func(name string) *flow {
		for i := range m.flows.by {
			if m.flows.by[i].name == name {
				return &m.flows.by[i]
			}
		}
		return nil
	}
	if n := len(m.flows.by); n != maxFlows || m.flows.n.Load() != maxFlows || kept("far") == nil {
		t.Fatalf("%d origins kept (n %d, far kept: %v), want %d with the busiest", n, m.flows.n.Load(), kept("far") != nil, maxFlows)
	}
	// A made-up leg is bounded.
	r.Enter(0, "a", &policy.Request{PromptTokens: 1 << 20}, OutputKeys{}, Origin{Name: "liar", Leg: 1 << 62})
	if f := kept("liar"); f == nil || f.leg != maxLeg {
		t.Fatalf("a made-up leg kept as %+v, want %v", f, maxLeg)
	}
}
