package fleet

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// fakeTuner is a tuner whose fallbacks the test counts.
type fakeTuner struct {
	policy.Policy
	resets int
	why    string
}

func (f *fakeTuner) Base() string                    { return policy.DefaultName }
func (f *fakeTuner) Incumbent() policy.Values        { return policy.Values{"decode": 0.2} }
func (f *fakeTuner) Resets() (n int, why string)     { return f.resets, f.why }
func (f *fakeTuner) FleetChanged(policy.FleetChange) {}
func (f *fakeTuner) StartFrom(policy.Values) error   { return nil }

// A change of the fleet is logged, with what a tuner did about it: a
// fallback to its starting weights a warning (2026-12-06, a user's test:
// the tuner's measurement thrown away, or its weights put back, without a
// word in the log).
func TestFleetChangesAreLogged(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	p, _ := policy.New("round-robin", policy.Options{})
	fleetChangedLog(log, p)("replica c added")
	tu := &fakeTuner{Policy: p}
	changed := fleetChangedLog(log, tu)
	changed("replica d added")
	tu.resets, tu.why = tu.resets+1, "replica a left"
	changed("replica a left")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], `msg="fleet changed" why="replica c added"`) ||
		!strings.Contains(lines[1], "level=INFO") || !strings.Contains(lines[1], "starts its round afresh") || !strings.Contains(lines[1], "replica d added") ||
		!strings.Contains(lines[2], "level=WARN") || !strings.Contains(lines[2], "fell back to its starting weights") || !strings.Contains(lines[2], "replica a left") {
		t.Errorf("log:\n%s", buf.String())
	}
}

// watcherPolicy records the changes of the fleet it hears of.
type watcherPolicy struct {
	policy.Policy
	mu    sync.Mutex
	heard []string
}

func (w *watcherPolicy) FleetChanged(c policy.FleetChange) {
	w.mu.Lock()
	w.heard = append(w.heard, c.Why)
	w.mu.Unlock()
}

// The config's replicas at start join before any decision: no news to a
// learner and no line in the log (a review, 2026-12-06: each one's first
// probe was news, a tuner's round restarted and a line logged per
// replica).
func TestInitialFleetIsNotNews(t *testing.T) {
	rr, _ := policy.New("round-robin", policy.Options{})
	w := &watcherPolicy{Policy: rr}
	var buf bytes.Buffer
	cfg := Config{Policy: "round-robin", ProbeInterval: time.Hour, ScrapeInterval: time.Hour}
	for _, id := range []string{"a", "b", "c", "d"} {
		cfg.Replicas = append(cfg.Replicas, rc(id, "http://"+id+":1", "us"))
	}
	f, err := New(cfg, Options{Policy: w, Log: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, id := range []string{"a", "b", "c", "d"} {
		f.Router().ObserveRTT(id, time.Millisecond)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.heard) != 0 || strings.Contains(buf.String(), "fleet changed") {
		t.Errorf("the policy heard %q of the initial fleet; log:\n%s", w.heard, buf.String())
	}
}
