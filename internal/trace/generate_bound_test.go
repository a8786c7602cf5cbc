package trace

import (
	"strings"
	"testing"
	"time"
)

// A rate whose warm-up alone is more than Generate simulates is refused at
// once (a researcher's test, 2026-12-06: --rate 100000 --duration 1s ran
// out of memory in the preset's two-hour warm-up, without a word).
func TestGenerateIsBounded(t *testing.T) {
	if _, err := Generate(GenConfig{Preset: "artchat", Rate: 1e5, Duration: time.Second}); err == nil || !strings.Contains(err.Error(), "requests to simulate") {
		t.Errorf("%v, want refused", err)
	}
}
