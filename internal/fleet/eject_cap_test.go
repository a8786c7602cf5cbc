package fleet

import "testing"

// max_ejection_percent exists so that a wave of failures that is no
// replica's fault (a poison request retried across the fleet, an overload)
// cannot eject every replica requests could go to. The share is taken over
// the replicas that take requests, not draining or leaving ones
// (2026-12-05: all of them, so that during a rolling update (half of a DNS group's pods leaving,
// finishing their requests) or a manual drain, the same wave ejects every
// replica left to serve, and every request was a 503).
func TestEjectionCapIgnoresDrainingReplicas(t *testing.T) {
	f := upFleet(t, Config{}, "a", "b", "c", "d") // max_ejection_percent 50%
	for _, id := range []string{"c", "d"} {       // being rolled out
		if err := f.Drain(id); err != nil {
			t.Fatal(err)
		}
	}
	if n := available(f); n != 2 {
		t.Fatalf("%d available, want a and b", n)
	}
	for range 3 {
		for _, id := range []string{"a", "b"} { // each request tried on both
			f.Failure(id)
		}
	}
	for _, id := range []string{"a", "b"} {
		f.probed(f.Upstream(id)) // /health answers 200
	}
	if n := available(f); n == 0 {
		t.Errorf("requests' failures ejected every replica that takes requests (2 of 2 active; the cap of 50%% counted the 2 draining)")
	}
}
