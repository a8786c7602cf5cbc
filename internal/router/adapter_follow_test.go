package router

import (
	"fmt"
	"testing"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// A request its replica's adapter table left unfollowed (64 adapters busy
// there) takes no count away from its adapter when it finishes: had its
// adapter got an entry meanwhile, the adapter would look idle (evictable,
// no slot held) while a request used it.
func TestUnfollowedAdapterEnd(t *testing.T) {
	r := newRouter(t, "gorgo", 1, false)
	m, _ := r.member("a")
	req := &policy.Request{PromptTokens: 10}
	send := func(adapter string) Ticket {
		tk, ok := r.enter(&Candidate{ID: "a", m: m, Adapter: adapter}, req, OutputKeys{})
		if !ok {
			t.Fatal("not entered")
		}
		return tk
	}
	var busy []Ticket
	for i := range maxAdapterUses {
		busy = append(busy, send(fmt.Sprint("a", i)))
	}
	x1 := send("x") // every entry busy: unfollowed
	r.Finish(&busy[0])
	x2 := send("x") // followed now
	r.Finish(&x1)
	if i := m.adapters.find("x"); i < 0 || m.adapters.uses[i].inflight != 1 {
		t.Errorf("%s has 1 request in flight, the table says %+v", x2.Adapter, m.adapters.uses[max(i, 0)])
	}
}
