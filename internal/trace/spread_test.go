package trace

import (
	"slices"
	"testing"
	"time"
)

func at(ms ...int) []Request {
	reqs := make([]Request, len(ms))
	for i, t := range ms {
		reqs[i] = Request{Time: time.Duration(t) * time.Millisecond, InputTokens: i + 1, OutputTokens: 1}
	}
	return reqs
}

func TestSpreadMovesTicksApartInOrder(t *testing.T) {
	// Ticks of 3 s: four requests at 0, lone ones at 3 and 6 s, three at
	// 9 s (the last tick, spread over the median gap, 3 s).
	reqs := Spread(at(0, 0, 0, 0, 3000, 6000, 9000, 9000, 9000), 7)
	want := []struct{ lo, hi time.Duration }{
		{0, 0}, {0, 3 * time.Second}, {0, 3 * time.Second}, {0, 3 * time.Second},
		{3 * time.Second, 3 * time.Second}, {6 * time.Second, 6 * time.Second},
		{9 * time.Second, 9 * time.Second}, {9 * time.Second, 12 * time.Second}, {9 * time.Second, 12 * time.Second},
	}
	for i, r := range reqs {
		if r.InputTokens != i+1 {
			t.Fatalf("request %d moved: order %v", i, reqs)
		}
		if r.Time < want[i].lo || r.Time > want[i].hi || (want[i].lo != want[i].hi && r.Time == want[i].hi) {
			t.Errorf("request %d at %v, want in [%v, %v)", i, r.Time, want[i].lo, want[i].hi)
		}
	}
	if !slices.IsSortedFunc(reqs, func(a, b Request) int { return int(a.Time - b.Time) }) {
		t.Errorf("not in time order: %v", reqs)
	}
	if d, shared, _ := simultaneity(reqs); d != len(reqs) || shared != 0 {
		t.Errorf("after Spread %d distinct times, %d shared; want all distinct", d, shared)
	}
	again := Spread(at(0, 0, 0, 0, 3000, 6000, 9000, 9000, 9000), 7)
	if !slices.Equal(times(reqs), times(again)) {
		t.Errorf("same seed spread differently: %v and %v", times(reqs), times(again))
	}
	other := Spread(at(0, 0, 0, 0, 3000, 6000, 9000, 9000, 9000), 8)
	if slices.Equal(times(reqs), times(other)) {
		t.Errorf("another seed spread the same way: %v", times(other))
	}
}

func TestSpreadLeavesDistinctTimes(t *testing.T) {
	reqs := Spread(at(0, 10, 25, 40), 1)
	if got := times(reqs); !slices.Equal(got, times(at(0, 10, 25, 40))) {
		t.Errorf("distinct times moved: %v", got)
	}
	if got := Spread(at(5, 5, 5), 1); !slices.Equal(times(got), times(at(5, 5, 5))) {
		t.Errorf("a trace of one instant has no gap to spread over, got %v", times(got))
	}
	if got := Spread(nil, 1); len(got) != 0 {
		t.Errorf("Spread(nil) = %v", got)
	}
}

func TestStatsCountSimultaneousArrivals(t *testing.T) {
	st := ComputeStats(at(0, 0, 0, 3000, 6000, 6000))
	if st.DistinctArrivals != 3 || st.LargestSimultaneous != 3 || st.SimultaneousShare != 5.0/6 {
		t.Errorf("distinct %d, largest %d, share %v; want 3, 3, 5/6", st.DistinctArrivals, st.LargestSimultaneous, st.SimultaneousShare)
	}
}

func times(reqs []Request) []time.Duration {
	out := make([]time.Duration, len(reqs))
	for i, r := range reqs {
		out[i] = r.Time
	}
	return out
}

// Perturb moves every arrival by at most d, never before 0, returns the
// requests in their new time order (close ones swap), leaves its input
// alone, and does the same for the same seed.
func TestPerturb(t *testing.T) {
	var reqs []Request
	for i := range 200 {
		reqs = append(reqs, Request{Time: time.Duration(i) * 3 * time.Millisecond, InputTokens: i + 1})
	}
	const d = 5 * time.Millisecond
	out := Perturb(reqs, d, 7)
	same := func(a, b []Request) bool {
		return slices.EqualFunc(a, b, func(x, y Request) bool { return x.Time == y.Time && x.InputTokens == y.InputTokens })
	}
	if !same(Perturb(reqs, d, 7), out) {
		t.Error("the same seed moved them differently")
	}
	swapped := 0
	for i, r := range out {
		orig := reqs[r.InputTokens-1]
		if r.Time < 0 || r.Time < orig.Time-d || r.Time > orig.Time+d {
			t.Fatalf("request %d moved from %v to %v", r.InputTokens, orig.Time, r.Time)
		}
		if i > 0 && out[i-1].Time > r.Time {
			t.Fatal("not in time order")
		}
		if r.InputTokens != i+1 {
			swapped++
		}
	}
	if swapped == 0 {
		t.Error("no two requests 3 ms apart swapped under ±5 ms")
	}
	if reqs[10].Time != 30*time.Millisecond || len(out) != len(reqs) {
		t.Error("the input changed, or requests were lost")
	}
	if got := Perturb(reqs, 0, 7); !same(got, reqs) {
		t.Error("d = 0 moved requests")
	}
}
