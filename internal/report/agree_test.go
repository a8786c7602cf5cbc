package report

import (
	"bytes"
	"strings"
	"testing"
)

// A spread takes in every value; a live figure is within it, or outside by
// its distance to the nearer end, relative to that end; the agreement is
// against the spread's median.
func TestSpreadAndAgreement(t *testing.T) {
	var s Spread
	if s.Lo() != 0 || s.Hi() != 0 || s.Median() != 0 || s.Outside(5) != 0 {
		t.Fatalf("empty spread %v %v %v %v", s.Lo(), s.Hi(), s.Median(), s.Outside(5))
	}
	for _, v := range []float64{2000, 1800, 2400} {
		s = s.Add(v)
	}
	if s.Lo() != 1800 || s.Hi() != 2400 || s.N() != 3 || s.Median() != 2000 {
		t.Fatalf("spread %v–%v of %d, median %v", s.Lo(), s.Hi(), s.N(), s.Median())
	}
	if even := s.Add(2200); even.Median() != 2100 || s.N() != 3 {
		t.Fatalf("median of four %v (want 2100); the original has %d values", even.Median(), s.N())
	}
	for v, want := range map[float64]float64{2000: 0, 1800: 0, 2640: 0.1, 1620: -0.1} {
		if got := s.Outside(v); got < want-1e-9 || got > want+1e-9 {
			t.Errorf("Outside(%v) = %v, want %v", v, got, want)
		}
	}
	var b bytes.Buffer
	live := []Run{{Policy: "a"}, {Policy: "b"}}
	live[0].TTFT.P95, live[1].TTFT.P95 = 2100, 2640
	sim := []Run{{Policy: "a"}, {Policy: "b"}}
	sim[0].TTFT.P95, sim[1].TTFT.P95 = 2400, 2400
	if err := WriteAgreement(&b, live, sim, []Spread{s, s}); err != nil {
		t.Fatal(err)
	}
	var zero Spread
	zero = zero.Add(0)
	if err := WriteAgreement(&b, live[:1], sim[:1], []Spread{zero}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "Inf") || strings.Contains(out, "NaN") {
		t.Errorf("a spread of zeros gave\n%s", out)
	}
	// As far from the median (2,000) as the live run, either side: 2,100
	// has 1,800 and 2,400; 2,640 none; 2,000 all three.
	for v, want := range map[float64]int{2100: 2, 2640: 0, 2000: 3, 1700: 1} {
		if got := s.AsFar(v); got != want {
			t.Errorf("AsFar(%v) = %d, want %d", v, got, want)
		}
	}
	for _, want := range []string{"2,400", "2,000", "1,800–2,400", "+5.0%", "within", "+32.0%", "+10.0%", "2 of 3", "0 of 3"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}
