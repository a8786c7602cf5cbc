package fleet

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// fakeTuner is a tuner whose fallbacks the test counts.
type fakeTuner struct {
	policy.Policy
	resets int
}

func (f *fakeTuner) Base() string                { return policy.DefaultName }
func (f *fakeTuner) Incumbent() policy.Values    { return policy.Values{"decode": 0.2} }
func (f *fakeTuner) Resets() (n int, why string) { return f.resets, "" }
func (f *fakeTuner) FleetChanged(why string)     {}

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
	tu.resets++
	changed("replica a left")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], `msg="fleet changed" why="replica c added"`) ||
		!strings.Contains(lines[1], "level=INFO") || !strings.Contains(lines[1], "starts its round afresh") || !strings.Contains(lines[1], "replica d added") ||
		!strings.Contains(lines[2], "level=WARN") || !strings.Contains(lines[2], "fell back to its starting weights") || !strings.Contains(lines[2], "replica a left") {
		t.Errorf("log:\n%s", buf.String())
	}
}
