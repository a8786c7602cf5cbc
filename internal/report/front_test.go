package report

import (
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestFront(t *testing.T) {
	runs := []Tails{
		{Policy: "fast-first", TTFT: 200, E2E: 900},
		{Policy: "fast-end", TTFT: 400, E2E: 500},
		{Policy: "between", TTFT: 300, E2E: 700},
		{Policy: "beaten", TTFT: 450, E2E: 800},                  // by between and fast-end
		{Policy: "tied", TTFT: 400, E2E: 600},                    // fast-end's TTFT: not beaten on both
		{Policy: "oracle", TTFT: 100, E2E: 400, Yardstick: true}, // beats all, yet no router
	}
	var got []string
	for _, r := range Front(runs) {
		got = append(got, r.Policy)
	}
	want := []string{"fast-first", "between", "tied", "fast-end"}
	if len(got) != len(want) {
		t.Fatalf("front %v, want %v (by TTFT, then E2E down; the yardstick and the beaten left out)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("front %v, want %v", got, want)
		}
	}
}

func TestView(t *testing.T) {
	c := Cell{Runs: []Tails{
		{Policy: "ttft-best", TTFT: 200, E2E: 1000},
		{Policy: "e2e-best", TTFT: 300, E2E: 800},
		{Policy: "marked", TTFT: 600, E2E: 1200}, // far behind, but the panel's subject
		{Policy: "far", TTFT: 2000, E2E: 5000},
		{Policy: "oracle", TTFT: 150, E2E: 900, Yardstick: true},
	}}
	v, ok := view(c, "marked")
	if !ok {
		t.Fatal("no view")
	}
	if v.bestT != 200 || v.bestE != 800 {
		t.Errorf("bests %v, %v; want 200 (not the yardstick's) and 800", v.bestT, v.bestE)
	}
	var shown []string
	for _, r := range v.shown {
		shown = append(shown, r.Policy)
	}
	if len(shown) != 4 || slices.Contains(shown, "far") {
		t.Errorf("shown %v: want all but far", shown)
	}
	if v.minT > 150 || v.maxT < 600 || v.minE > 800 || v.maxE < 1200 || v.maxT >= 2000 {
		t.Errorf("view [%v, %v] × [%v, %v]: want the yardstick, the marked policy and the corner in it, far out", v.minT, v.maxT, v.minE, v.maxE)
	}
	if _, ok := view(Cell{Runs: []Tails{{Policy: "oracle", TTFT: 1, E2E: 1, Yardstick: true}}}, ""); ok {
		t.Error("a cell of yardsticks alone has no bests to draw")
	}
}

func TestPlotFronts(t *testing.T) {
	cells := []Cell{
		{Title: "a ×1", Runs: []Tails{{Policy: "p", TTFT: 200, E2E: 900}, {Policy: "q", TTFT: 400, E2E: 500}, {Policy: "oracle", TTFT: 150, E2E: 480, Yardstick: true}}},
		{Title: "a ×2", Runs: []Tails{{Policy: "p", TTFT: 120, E2E: 300}, {Policy: "q", TTFT: 120, E2E: 300}}}, // all alike
		{Title: "a ×3"}, // no comparable run: an empty panel, not an error
	}
	path := filepath.Join(t.TempDir(), "front.png")
	if err := PlotFronts(path, "a", 2, "q", cells); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	// Two rows of two panels and the legend's column, 3.6 by 3.4 inches each.
	if cfg.Width <= cfg.Height {
		t.Errorf("image %dx%d: want three tiles wide, two high", cfg.Width, cfg.Height)
	}
	if err := PlotFronts(path, "a", 2, "q", nil); err == nil {
		t.Error("no cells: want an error")
	}
}
