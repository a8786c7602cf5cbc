package report

import (
	"bytes"
	"strings"
	"testing"
)

// A spread takes in every value; a live figure is within it, or outside by
// its distance to the nearer end, relative to that end.
func TestSpreadAndAgreement(t *testing.T) {
	var s Spread
	for _, v := range []float64{2000, 1800, 2400} {
		s = s.Add(v)
	}
	if s.Lo != 1800 || s.Hi != 2400 || s.N != 3 {
		t.Fatalf("spread %+v", s)
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
	sim[0].TTFT.P95, sim[1].TTFT.P95 = 2000, 2000
	if err := WriteAgreement(&b, live, sim, []Spread{s, s}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"1,800–2,400", "+5.0%", "within", "+32.0%", "+10.0%"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}
