package sim

import (
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/trace"
)

// clairvoyant knows each request's draw of the network's jitter;
// clairvoyant-engines knows only the mean round trips, as a router does.
// On an idle fleet of a near replica with a jittery link and a steady one
// a little farther, the first takes the steady one whenever this
// request's draw makes the near one slower, the second never does.
func TestClairvoyantEnginesIsBlindToJitter(t *testing.T) {
	p := profile(t, "paper")
	reps := []Replica{
		{ID: "near", Region: "a", RTT: 100 * time.Millisecond, Jitter: 60 * time.Millisecond, Profile: p},
		{ID: "steady", Region: "b", RTT: 110 * time.Millisecond, Profile: p},
	}
	var reqs []trace.Request
	for i := range 100 {
		reqs = append(reqs, request(time.Duration(i)*10*time.Second, uint64(i+1), 500, 4))
	}
	run := func(name string) *Result {
		res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, name), Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	seer, blind := run(ClairvoyantName), run(ClairvoyantEnginesName)
	steady := 0
	for i := range reqs {
		s, b := seer.Records[i], blind.Records[i]
		if b.Replica != "near" {
			t.Fatalf("request %d: clairvoyant-engines chose %s, want the replica of least mean round trip", i, b.Replica)
		}
		if s.Replica == "steady" {
			steady++
		}
		if s.TTFT > b.TTFT+1e-9 {
			t.Errorf("request %d: clairvoyant %.1f ms, slower than blind to the jitter (%.1f)", i, s.TTFT, b.TTFT)
		}
	}
	if steady < 20 || steady > 80 {
		t.Errorf("clairvoyant sent %d of 100 to the steady replica, want those whose draw slows the near one (about half)", steady)
	}
}
