package fleet

import (
	"testing"
	"time"
)

// Admission's mode is read case-insensitively, and needs an SLO.
func TestAdmissionConfig(t *testing.T) {
	ok := Config{TTFTSLO: time.Second, Admission: "Reject", Replicas: []ReplicaConfig{{URL: "http://x"}}}
	ok = ok.Defaults()
	if a, err := ok.admission(nil); err != nil || a.Mode != "reject" {
		t.Errorf("admission: Reject: %+v %v", a, err)
	}
	for _, bad := range []Config{{TTFTSLO: time.Second, Admission: "later"}, {Admission: "queue"}, {TTFTSLO: -time.Second}} {
		bad.Replicas = []ReplicaConfig{{URL: "http://x"}}
		if err := bad.Defaults().Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
