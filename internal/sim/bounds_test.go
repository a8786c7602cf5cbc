package sim

import (
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/trace"
)

// Probe and scrape intervals below MinInterval are refused: every scrape
// is kept for the run, and one every microsecond hung a two-request run
// and took gigabytes.
func TestTinyIntervalsAreRefused(t *testing.T) {
	reps := []Replica{{ID: "a", RTT: 40 * time.Millisecond, Profile: profile(t, "paper")}}
	reqs := []trace.Request{request(0, 1, 600, 10), request(20*time.Second, 2, 600, 10)}
	for _, sig := range []Signals{{ScrapeInterval: time.Microsecond}, {ProbeInterval: time.Nanosecond}} {
		if _, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "round-robin"), Signals: sig}); err == nil {
			t.Errorf("signals %+v accepted", sig)
		}
	}
}
