package serve

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
)

// Replicas added, drained, undrained and removed through the admin API
// while a replay runs: no request fails, the new replica takes traffic
// without waiting for a periodic probe, the drained one takes none, the
// removed one leaves once idle.
func TestFleetChangesWhileServing(t *testing.T) {
	a, b, c := startReplica(t, 10*time.Millisecond, emulator.Faults{}), startReplica(t, 20*time.Millisecond, emulator.Faults{}),
		startReplica(t, 15*time.Millisecond, emulator.Faults{})
	s := startRouter(t, Config{Config: fleet.Config{ProbeInterval: time.Hour, Policy: "round-robin"}}, Options{}, a, b)
	url, admin := s.client, s.admin
	reqs := workload(6)
	done := replayInBackground(t, url, reqs)

	eventually(t, "a fifth of the replay", func() bool { return a.Served()+b.Served() > int64(len(reqs)/5) })
	if code, body := do(t, "POST", admin+"/admin/replicas", fmt.Sprintf(`{"id":"c","url":%q,"region":"rc","profile":"paper"}`, c.URL)); code != 201 {
		t.Fatalf("add: %d %s", code, body)
	}
	// The periodic probe is an hour away: only the probe at the add can
	// make it routable.
	eventually(t, "traffic to the added replica", func() bool { return c.Served() > 0 })

	if code, body := do(t, "POST", admin+"/admin/replicas/a/drain", ""); code != 200 || !strings.Contains(body, `"state": "draining"`) {
		t.Fatalf("drain: %d %s", code, body)
	}
	bound := a.Served() + int64(replicaState(t, s, "a").InFlight) // what was already on its way
	eventually(t, "half of the replay", func() bool { return a.Served()+b.Served()+c.Served() > int64(len(reqs)/2) })
	if got := a.Served(); got > bound {
		t.Errorf("the drained replica took %d new requests", got-bound)
	}
	if code, _ := do(t, "POST", admin+"/admin/replicas/a/undrain", ""); code != 200 {
		t.Fatalf("undrain: %d", code)
	}
	if code, _ := do(t, "DELETE", admin+"/admin/replicas/b", ""); code != 200 {
		t.Fatalf("delete: %d", code)
	}
	afterRemove := b.Served() + int64(max(0, stateOr(s, "b").InFlight))
	res := <-done
	if res == nil {
		t.Fatal("no replay result")
	}
	failed := 0
	for _, r := range res.Records {
		if r.Failed {
			failed++
			if failed < 4 {
				t.Errorf("request %d failed: %s", r.Index, r.Error)
			}
		}
	}
	if failed > 0 || len(res.Records) != len(reqs) {
		t.Fatalf("%d of %d requests failed", failed, len(res.Records))
	}
	if b.Served() > afterRemove {
		t.Errorf("the removed replica took %d new requests", b.Served()-afterRemove)
	}
	eventually(t, "the removed replica to leave", func() bool { return !s.Fleet.Router().Has("b") })
	if code, _ := do(t, "POST", admin+"/admin/replicas/b/drain", ""); code != 404 {
		t.Errorf("drain of a removed replica: %d, want 404", code)
	}
}
