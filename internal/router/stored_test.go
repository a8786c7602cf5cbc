package router

import (
	"fmt"
	"strings"
	"testing"
)

func TestStoredResponses(t *testing.T) {
	r := newRouter(t, "gorgo", 3, false)
	ids := []string{id(0), id(1), id(2)}
	r.Stored("resp_1", ids[1])
	if got, ok := r.Holder("resp_1"); !ok || got != ids[1] {
		t.Errorf("holder %q %v, want %s", got, ok, ids[1])
	}
	// Not kept: an unknown replica, an id too long, an empty one.
	r.Stored("resp_2", "nowhere")
	r.Stored(strings.Repeat("x", maxStoredID+1), ids[0])
	r.Stored("", ids[0])
	for _, id := range []string{"resp_2", strings.Repeat("x", maxStoredID+1), "", "resp_unknown"} {
		if got, ok := r.Holder(id); ok {
			t.Errorf("%.20q: holder %s", id, got)
		}
	}
	// A holder that is down holds nothing the router can send to.
	if err := r.SetHealthy(ids[1], false); err != nil {
		t.Fatal(err)
	}
	if got, ok := r.Holder("resp_1"); ok {
		t.Errorf("holder %s while down", got)
	}
	r.SetHealthy(ids[1], true)

	// Bounded: the oldest go, the one asked for stays.
	for i := range 2 * maxStored {
		r.Stored(fmt.Sprintf("resp_x%d", i), ids[i%3])
		if i%1000 == 0 {
			if _, ok := r.Holder("resp_1"); !ok {
				t.Fatalf("resp_1 forgotten after %d more, though asked for", i)
			}
		}
	}
	if n := len(r.stored.cur) + len(r.stored.old); n > maxStored {
		t.Errorf("%d ids kept, want at most %d", n, maxStored)
	}
	if _, ok := r.Holder("resp_x0"); ok {
		t.Error("the oldest id is still kept")
	}
	if got, ok := r.Holder(fmt.Sprintf("resp_x%d", 2*maxStored-1)); !ok || got != ids[(2*maxStored-1)%3] {
		t.Errorf("the newest id: %q %v", got, ok)
	}
}
