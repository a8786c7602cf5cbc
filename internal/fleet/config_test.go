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

// The online tuner runs over the default policy unless tune: false, over
// another policy only when asked, and never over one without parameters.
func TestTuned(t *testing.T) {
	on, off := true, false
	for _, c := range []struct {
		cfg  Config
		want bool
	}{
		{Config{}, true},
		{Config{Policy: "default"}, true},
		{Config{Policy: "gorgo-e2e", Tune: &off}, false},
		{Config{Policy: "gorgo-ms"}, false},
		{Config{Policy: "gorgo-ms", Tune: &on}, true},
	} {
		if got := c.cfg.Defaults().Tuned(); got != c.want {
			t.Errorf("%q tune %v: tuned %v, want %v", c.cfg.Policy, c.cfg.Tune, got, c.want)
		}
	}
	bad := Config{Policy: "round-robin", Tune: &on, Replicas: []ReplicaConfig{{URL: "http://x"}}}
	if err := bad.Defaults().Validate(); err == nil {
		t.Error("tune: true over round-robin accepted")
	}
}

// A replica's URL is the engine's address: an OpenAI client's base URL
// (ending in /v1) would send every request to /v1/v1/...; a prefix of a
// gateway in front of the engine is kept.
func TestReplicaURL(t *testing.T) {
	for _, c := range []struct {
		url string
		ok  bool
	}{
		{"http://h:8000", true},
		{"http://h:8000/", true},
		{"https://gateway/llama", true},
		{"http://h:8000/v1", false},
		{"http://h:8000/v1/", false},
		{"https://gateway/llama/v1", false},
		{"h:8000", false},
	} {
		err := ReplicaConfig{URL: c.url}.Defaults().Validate()
		if (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %v", c.url, err, c.ok)
		}
	}
}
