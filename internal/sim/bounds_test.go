package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/trace"
)

func loadTopologyText(t *testing.T, yaml string) Topology {
	t.Helper()
	p := filepath.Join(t.TempDir(), "t.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	top, err := LoadTopology(p)
	if err != nil {
		t.Fatal(err)
	}
	return top
}

// A round trip past an hour is refused, not converted to a Duration that
// wraps negative (runs of negative TTFTs that looked valid); so is a
// count of replicas more than a router holds, before any is built (300
// million ran the machine out of memory).
func TestTopologyBounds(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"name: far\nrouter_region: r\nregions:\n  - {name: r, rtt_ms: 10, jitter_ms: 1}\n  - {name: far, rtt_ms: 1e300, jitter_ms: 1}\nreplicas:\n  - {region: r, profile: paper}\n  - {region: far, profile: paper}\n",
			"round trip and jitter must be non-negative and at most"},
		{"name: big\nrouter_region: r\nregions:\n  - {name: r, rtt_ms: 10, jitter_ms: 1}\nreplicas:\n  - {region: r, profile: paper, count: 300000000}\n",
			"more than 4096 replicas"},
		{"name: big\nrouter_region: r\nregions:\n  - {name: r, rtt_ms: 10, jitter_ms: 1}\nreplicas:\n  - {region: r, name: a, profile: paper, count: 4000}\n  - {region: r, name: b, profile: paper, count: 97}\n",
			"more than 4096 replicas"},
		{"name: big\nrouter_region: r\nregions:\n  - {name: r, rtt_ms: 10, jitter_ms: 1}\nreplicas:\n  - {region: r, name: a, profile: paper}\n  - {region: r, name: b, profile: paper, count: 9223372036854775807}\n",
			"more than 4096 replicas"},
	} {
		_, err := loadTopologyText(t, c.yaml).Resolve()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Resolve: %v, want %q", err, c.want)
		}
	}
}

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
