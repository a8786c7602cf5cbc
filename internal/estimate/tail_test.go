package estimate

import "testing"

// A Tail's value is the nearest-rank quantile of its window, once a
// quarter of the window is in, and it forgets what left the window.
func TestTail(t *testing.T) {
	tl := NewTail(0.95, 100)
	for i := 1; i <= 24; i++ {
		tl.Observe(float64(i))
	}
	if _, ok := tl.Value(); ok {
		t.Error("ready with 24 of 100")
	}
	for i := 25; i <= 100; i++ {
		tl.Observe(float64(i))
	}
	if v, ok := tl.Value(); !ok || v != 95 {
		t.Errorf("1..100: %v %v, want 95", v, ok)
	}
	// 100 more, all 1000: the old ones leave the window. The value is
	// recomputed every eighth of a window, so it is exact after a full one.
	for range 100 {
		tl.Observe(1000)
	}
	if v, _ := tl.Value(); v != 1000 || tl.Samples() != 100 {
		t.Errorf("after 100 of 1000: %v over %d", v, tl.Samples())
	}
}

// A Margin learns each size of forecast apart: large forecasts that
// overrun by a lot do not widen the margin of small ones, and a bin that
// only ever comes in early needs none.
func TestMargin(t *testing.T) {
	m := NewMargin(0.9, 20)
	for i := range 20 {
		m.Observe(100, 100+float64(i))       // small: overrun by 0..19
		m.Observe(3000, 3000+100*float64(i)) // large: by 0..1900
		m.Observe(600, 500)                  // middling: always early
	}
	for _, c := range []struct {
		forecast, want float64
	}{{100, 17}, {3000, 1700}, {600, 0}} {
		if v, ok := m.Of(MarginBin(c.forecast)); !ok || v != c.want {
			t.Errorf("forecast %v: margin %v %v, want %v", c.forecast, v, ok, c.want)
		}
	}
	if _, ok := m.Of(MarginBin(20000)); ok {
		t.Error("an empty bin is ready")
	}
	for f, want := range map[float64]int{0: 0, 124: 0, 125: 1, 249: 1, 250: 2, 16000: 8, 1e9: 8} {
		if b := MarginBin(f); b != want {
			t.Errorf("MarginBin(%v) = %d, want %d", f, b, want)
		}
	}
}

// BenchmarkMarginObserve is what a first token adds to the router's work
// for the margin: one observation, with the quantile recomputed every
// eighth of a window.
func BenchmarkMarginObserve(b *testing.B) {
	m := NewMargin(0.95, 128)
	x := 0.0
	b.ReportAllocs()
	for b.Loop() {
		x = x*1.1 + 7
		if x > 3000 {
			x = 0
		}
		m.Observe(2000, 2000+x)
	}
}
