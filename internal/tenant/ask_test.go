package tenant

import (
	"testing"
	"time"
)

// A tenant given no TTFT SLO, on a router whose ttft_slo is unset, may not
// ask with X-Gorgo-Ttft-Slo-Ms for one tighter than its loosest unless
// min_ttft_slo says: a header never upgrades a tenant, its SLO as its
// priority (2026-12-05: its MinTTFTSLO defaulted to its SLO, zero, so it
// could claim a tighter SLO than the tenant the operator gave 500 ms, and
// reserve the fleet's queues against the others, admit.ReserveFor).
func TestNoSLOTenantCannotAskTighterThanAnyone(t *testing.T) {
	s, err := New(map[string]Config{
		"gold": {TTFTSLO: 500 * time.Millisecond},
		"free": {},
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Lookup("gold").Class(Ask{TTFTSLO: "100"}, 1); err == nil {
		t.Fatal("gold may ask tighter than its 500 ms")
	}
	for _, name := range []string{"free", "nobody"} { // a tenant without an SLO; the default tenant
		if c, _, err := s.Lookup(name).Class(Ask{TTFTSLO: "1"}, 1); err == nil {
			t.Errorf("%s, given no SLO, asked for a 1 ms TTFT SLO and got %v", name, c.SLO)
		}
	}
}
