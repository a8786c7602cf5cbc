package trace

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Window selects a time range of a trace: requests with
// Start <= Time < Start+Duration. The zero Window selects the whole trace.
type Window struct {
	// Start is the offset of the window from the start of the trace; >= 0.
	Start time.Duration
	// Duration is the length of the window; 0 means to the end of the trace.
	Duration time.Duration
}

// Contains reports whether a request arriving at t lies in the window.
func (w Window) Contains(t time.Duration) bool {
	if t < w.Start {
		return false
	}
	return w.Duration == 0 || t-w.Start < w.Duration
}

// String returns the window in the form ParseWindow reads, e.g. "500s,30m0s".
func (w Window) String() string {
	return w.Start.String() + "," + w.Duration.String()
}

// ParseWindow parses "START,DURATION", both Go durations (e.g. "0s,30m",
// "500s,500s"); DURATION 0 means to the end of the trace, and the empty
// string is the zero Window (the whole trace).
func ParseWindow(s string) (Window, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Window{}, nil
	}
	start, dur, ok := strings.Cut(s, ",")
	if !ok {
		return Window{}, fmt.Errorf("window %q: want START,DURATION as Go durations, e.g. 0s,30m", s)
	}
	var w Window
	var err error
	if w.Start, err = time.ParseDuration(strings.TrimSpace(start)); err != nil {
		return Window{}, fmt.Errorf("window %q: start: %w", s, err)
	}
	if w.Duration, err = time.ParseDuration(strings.TrimSpace(dur)); err != nil {
		return Window{}, fmt.Errorf("window %q: duration: %w", s, err)
	}
	if w.Start < 0 {
		return Window{}, fmt.Errorf("window %q: start must be non-negative", s)
	}
	if w.Duration < 0 {
		return Window{}, fmt.Errorf("window %q: duration must be non-negative (0 = to the end)", s)
	}
	return w, nil
}

// ValidateScale reports whether timeScale is a valid Apply time scale:
// from MinScale to MaxScale (a trace stretched a million-fold is centuries
// of probes for the simulator, and past about 10^12 its times saturate).
func ValidateScale(timeScale float64) error {
	if !(timeScale >= MinScale && timeScale <= MaxScale) {
		return fmt.Errorf("time scale must be from %v to %v, got %v", MinScale, MaxScale, timeScale)
	}
	return nil
}

// The bounds of a time scale.
const (
	MinScale = 0.001
	MaxScale = 1000
)

// Apply returns the requests of reqs (time-ordered) that lie in w, with their
// times rebased to the window start (Time-Start) and then multiplied by
// timeScale: 2.0 doubles every inter-arrival gap, halving the rate. The
// Requests are copies, but they share HashIDs and Messages with reqs.
// Apply panics if ValidateScale(timeScale) fails; check it first.
func Apply(reqs []Request, w Window, timeScale float64) []Request {
	if err := ValidateScale(timeScale); err != nil {
		panic("trace.Apply: " + err.Error())
	}
	out := make([]Request, 0, len(reqs))
	for _, r := range reqs {
		if !w.Contains(r.Time) {
			continue
		}
		t := r.Time - w.Start
		if timeScale != 1 {
			scaled := math.Round(float64(t) * timeScale)
			if scaled >= math.MaxInt64 {
				t = math.MaxInt64
			} else {
				t = time.Duration(scaled)
			}
		}
		r.Time = t
		out = append(out, r)
	}
	return out
}
