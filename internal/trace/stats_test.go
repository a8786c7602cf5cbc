package trace

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// statsTrace is a small hand-built trace whose statistics are worked out
// by hand in TestComputeStats.
func statsTrace() []Request {
	return []Request{
		// a/U turn 1: two full blocks.
		{Time: 0, Session: "a", User: "U", InputTokens: 1024, OutputTokens: 10, HashIDs: []uint64{1, 2}},
		// b/V: shares block 1 (a system prompt) with a: 512 cross tokens.
		{Time: time.Second, Session: "b", User: "V", InputTokens: 600, OutputTokens: 20, HashIDs: []uint64{1, 3}},
		// a/U turn 2: reuses a's two blocks: 1024 intra tokens.
		{Time: 2 * time.Second, Session: "a", User: "U", InputTokens: 1600, OutputTokens: 30, HashIDs: []uint64{1, 2, 5, 6}},
		// c/U: block 1 again, partial here (300 tokens): cross-session but
		// intra-user.
		{Time: 4 * time.Second, Session: "c", User: "U", InputTokens: 300, OutputTokens: 40, HashIDs: []uint64{1}},
	}
}

func TestComputeStats(t *testing.T) {
	got := ComputeStats(statsTrace())
	const total = 1024 + 600 + 1600 + 300
	want := Stats{
		Requests:        4,
		DurationSeconds: 4,
		RatePerSecond:   1,
		// Sorted inputs 300, 600, 1024, 1600: p90 sits at rank 2.7.
		InputTokens:           Dist{P50: 812, P90: 1024 + 0.7*576, P95: 1024 + 0.85*576, P99: 1024 + 0.97*576, Mean: 881, Max: 1600},
		OutputTokens:          Dist{P50: 25, P90: 37, P95: 38.5, P99: 39.7, Mean: 25, Max: 40},
		TotalInputTokens:      total,
		Sessions:              3,
		RequestsPerSession:    4.0 / 3,
		RequestsPerSessionP50: 1,
		MultiTurnSessions:     1,
		// Turn is unknown (0): a's second request is its turn 2.
		TurnsPerMultiTurnSession: 2,
		MultiTurnShare:           0.25,
		Users:                    2,
		RequestsPerUser:          2,
		RequestsPerUserP50:       2,
		Reuse: Reuse{
			Global:       (512 + 1024 + 300) / float64(total),
			IntraSession: 1024 / float64(total),
			CrossSession: (512 + 300) / float64(total),
			IntraUser:    (1024 + 300) / float64(total),
			CrossUser:    512 / float64(total),
		},
	}
	if !statsClose(got, want) {
		t.Errorf("ComputeStats =\n%+v\nwant\n%+v", got, want)
	}
}

// statsClose compares Stats allowing float rounding.
func statsClose(a, b Stats) bool {
	eq := func(x, y float64) bool { return math.Abs(x-y) <= 1e-9*math.Max(1, math.Abs(y)) }
	dist := func(x, y Dist) bool {
		return eq(x.P50, y.P50) && eq(x.P90, y.P90) && eq(x.P95, y.P95) && eq(x.P99, y.P99) && eq(x.Mean, y.Mean) && x.Max == y.Max
	}
	return a.Requests == b.Requests && eq(a.DurationSeconds, b.DurationSeconds) && eq(a.RatePerSecond, b.RatePerSecond) &&
		dist(a.InputTokens, b.InputTokens) && dist(a.OutputTokens, b.OutputTokens) && a.TotalInputTokens == b.TotalInputTokens &&
		a.Sessions == b.Sessions && eq(a.RequestsPerSession, b.RequestsPerSession) && eq(a.RequestsPerSessionP50, b.RequestsPerSessionP50) &&
		a.MultiTurnSessions == b.MultiTurnSessions && eq(a.TurnsPerMultiTurnSession, b.TurnsPerMultiTurnSession) &&
		eq(a.MultiTurnShare, b.MultiTurnShare) && a.Users == b.Users && eq(a.RequestsPerUser, b.RequestsPerUser) &&
		eq(a.RequestsPerUserP50, b.RequestsPerUserP50) && eq(a.Reuse.Global, b.Reuse.Global) &&
		eq(a.Reuse.IntraSession, b.Reuse.IntraSession) && eq(a.Reuse.CrossSession, b.Reuse.CrossSession) &&
		eq(a.Reuse.IntraUser, b.Reuse.IntraUser) && eq(a.Reuse.CrossUser, b.Reuse.CrossUser)
}

func TestComputeStatsTurns(t *testing.T) {
	tests := []struct {
		name       string
		reqs       []Request
		share      float64
		multi      int
		turns      float64
		sessions   int
		users      int
		perSession float64
	}{
		{
			name: "Turn field wins: a conversation already in progress",
			reqs: []Request{
				{Session: "x", Turn: 5, InputTokens: 1, HashIDs: []uint64{1}},
				{Session: "y", Turn: 1, InputTokens: 1, HashIDs: []uint64{2}},
				{Session: "x", Turn: 6, InputTokens: 1, HashIDs: []uint64{3}},
			},
			share: 2.0 / 3, multi: 1, turns: 6, sessions: 2, users: 2, perSession: 1.5,
		},
		{
			name: "empty sessions are sessions of their own",
			reqs: []Request{
				{InputTokens: 1, HashIDs: []uint64{1}},
				{InputTokens: 1, HashIDs: []uint64{1}},
			},
			share: 0, multi: 0, turns: 0, sessions: 2, users: 2, perSession: 1,
		},
		{
			name: "one user, two sessions",
			reqs: []Request{
				{Session: "x", User: "u", InputTokens: 1, HashIDs: []uint64{1}},
				{Session: "y", User: "u", InputTokens: 1, HashIDs: []uint64{2}},
			},
			share: 0, multi: 0, turns: 0, sessions: 2, users: 1, perSession: 1,
		},
	}
	for _, tt := range tests {
		st := ComputeStats(tt.reqs)
		if st.MultiTurnShare != tt.share || st.MultiTurnSessions != tt.multi || st.TurnsPerMultiTurnSession != tt.turns ||
			st.Sessions != tt.sessions || st.Users != tt.users || st.RequestsPerSession != tt.perSession {
			t.Errorf("%s: share %v multi %d turns %v sessions %d users %d per-session %v; want %v %d %v %d %d %v", tt.name,
				st.MultiTurnShare, st.MultiTurnSessions, st.TurnsPerMultiTurnSession, st.Sessions, st.Users, st.RequestsPerSession,
				tt.share, tt.multi, tt.turns, tt.sessions, tt.users, tt.perSession)
		}
	}
	if st := ComputeStats(nil); !reflect.DeepEqual(st, Stats{}) {
		t.Errorf("ComputeStats(nil) = %+v, want zero", st)
	}
}

// WriteText prints the statistics, and the estimate errors when filled
// (sim.OutputError computes them).
func TestWriteText(t *testing.T) {
	var b bytes.Buffer
	st := ComputeStats(statsTrace())
	st.OutputError = OutputError{Global: 224, Keyed: 181}
	if err := st.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	want := `requests               4
duration               4.0 s (first to last arrival)
mean rate              1.00 req/s
input tokens           p50 812  p90 1427  p95 1514  p99 1583  mean 881  max 1600
output tokens          p50 25   p90 37    p95 38    p99 40    mean 25   max 40
  estimate error       ±224 from the running mean, ±181 keyed by application and conversation
sessions               3 (requests per session: mean 1.33, p50 1)
multi-turn sessions    1 (highest turn: mean 2.0)
multi-turn requests    25.00% (turn >= 2)
users                  2 (requests per user: mean 2.00, p50 2)
prefix reuse           52.10% of input tokens
  intra/cross session  29.06% / 23.04%
  intra/cross user     37.57% / 14.53%
`
	if b.String() != want {
		t.Errorf("WriteText =\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	st.OutputError = OutputError{}
	if err := st.WriteText(&b); err != nil || strings.Contains(b.String(), "estimate error") {
		t.Errorf("without the estimate errors: %v\n%s", err, b.String())
	}
}

// TestStatsMooncake checks the figures of the real Mooncake trace,
// including its global block reuse of 37.4% (computed independently).
func TestStatsMooncake(t *testing.T) {
	reqs := readMooncake(t)
	st := ComputeStats(reqs)
	var b bytes.Buffer
	st.WriteText(&b)
	t.Logf("Mooncake conversation trace:\n%s", b.String())
	if st.Requests != 12031 {
		t.Errorf("requests = %d, want 12031", st.Requests)
	}
	if math.Abs(st.Reuse.Global-0.374) > 0.005 {
		t.Errorf("global reuse = %.4f, want 0.374 ± 0.005", st.Reuse.Global)
	}
	if st.DurationSeconds != 3536.999 {
		t.Errorf("duration = %v s, want 3536.999", st.DurationSeconds)
	}
	// Its arrivals are 3 s ticks: every request shares its instant.
	if st.DistinctArrivals != 1180 || st.SimultaneousShare != 1 || st.LargestSimultaneous != 28 {
		t.Errorf("arrivals: %d distinct, %.4f shared, at most %d at once; want 1180, 1, 28",
			st.DistinctArrivals, st.SimultaneousShare, st.LargestSimultaneous)
	}
	spread := ComputeStats(Spread(reqs, 1))
	if spread.DistinctArrivals != st.Requests || spread.Reuse != st.Reuse || spread.Sessions != st.Sessions {
		t.Errorf("spread: %d distinct arrivals (want %d), reuse %+v (want %+v), %d sessions (want %d)",
			spread.DistinctArrivals, st.Requests, spread.Reuse, st.Reuse, spread.Sessions, st.Sessions)
	}
}

func BenchmarkStatsMooncake(b *testing.B) {
	reqs := readMooncake(b)
	b.ReportAllocs()
	for b.Loop() {
		ComputeStats(reqs)
	}
}
