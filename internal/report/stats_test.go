package report

import "testing"

func TestPercentile(t *testing.T) {
	s := []float64{10, 20, 30, 40, 50}
	cases := []struct{ q, want float64 }{
		{0, 10}, {0.5, 30}, {0.9, 46}, {0.95, 48}, {1, 50}, {0.125, 15},
	}
	for _, c := range cases {
		if got := Percentile(s, c.q); got != c.want {
			t.Errorf("Percentile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := Percentile(nil, 0.5); got != 0 {
		t.Errorf("empty: %v", got)
	}
}

func TestSummarize(t *testing.T) {
	d := Summarize([]float64{4, 1, 3, 2})
	want := Dist{P50: 2.5, P90: 3.7, P95: 3.85, P99: 3.97, Mean: 2.5}
	const eps = 1e-9
	for _, p := range [][2]float64{{d.P50, want.P50}, {d.P90, want.P90}, {d.P95, want.P95}, {d.P99, want.P99}, {d.Mean, want.Mean}} {
		if p[0]-p[1] > eps || p[1]-p[0] > eps {
			t.Errorf("Summarize = %+v, want %+v", d, want)
			break
		}
	}
}

func TestPercentileOfOne(t *testing.T) {
	if got := Percentile([]float64{7}, 0.99); got != 7 {
		t.Errorf("percentile of one value = %v", got)
	}
}
