package wire

import (
	"testing"
	"time"
)

func TestRetryWait(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		h    string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"7", 7 * time.Second},
		{"Sat, 05 Dec 2026 10:00:30 GMT", 30 * time.Second},
		{"Sat, 05 Dec 2026 09:00:00 GMT", 0}, // past
		{"-3", 0},
		{"1.5", 0},
		{"soon", 0},
		{"99999999999999999999", 0},
	} {
		if got := RetryWait(c.h, now); got != c.want {
			t.Errorf("RetryWait(%q) = %v, want %v", c.h, got, c.want)
		}
	}
}
