package report

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// With an SLO, a run's slo_met and goodput_rps are written even at 0 (a
// script reading them broke on the worst policy alone); without one they
// are absent; and a run that completed nothing shows no latencies.
func TestRunJSONAndTableOfNothing(t *testing.T) {
	b, err := json.Marshal(Run{Policy: "rr", Requests: 3, Failed: 3, SLO: 1000})
	if err != nil || !strings.Contains(string(b), `"slo_met":0`) || !strings.Contains(string(b), `"goodput_rps":0`) {
		t.Errorf("with an SLO: %s %v", b, err)
	}
	var back Run
	if err := json.Unmarshal(b, &back); err != nil || back.Policy != "rr" || back.SLO != 1000 {
		t.Errorf("read back %+v %v", back, err)
	}
	if b, _ := json.Marshal(Run{Policy: "rr"}); strings.Contains(string(b), "slo_met") {
		t.Errorf("without an SLO: %s", b)
	}
	var sb strings.Builder
	if err := WriteTable(&sb, []Run{{Policy: "rr", Requests: 3, Failed: 3}}); err != nil {
		t.Fatal(err)
	}
	// policy, done, fail, then TTFT p50 p90 p95 p99 mean, E2E p50 p95 p99, ITL mean: no latency.
	if f := strings.Fields(strings.Split(sb.String(), "\n")[1]); len(f) < 12 || strings.Join(f[3:12], "") != "---------" {
		t.Errorf("a run that completed nothing: %q", f)
	}
}

// A CDF of no value is ErrNothingToPlot, and no file (gonum/plot's log
// axis panicked over it).
func TestPlotCDFOfNothing(t *testing.T) {
	path := t.TempDir() + "/cdf.png"
	if err := PlotCDF(path, "t", "x", []Series{{Name: "a"}, {Name: "b", Values: []float64{0}}}); err != ErrNothingToPlot {
		t.Errorf("%v, want ErrNothingToPlot", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Error("a file was written")
	}
}

// With an SLO the fields keep the struct's order (slo_met after
// tpot_slo_ms, as before MarshalJSON: a review).
func TestRunJSONOrder(t *testing.T) {
	h := 0.5
	b, err := json.Marshal(Run{Policy: "p", SLO: 1000, TPOTSLO: 50, SLOMet: 3, Goodput: 1, Models: map[string]int{"m": 1}, AdapterRequests: 2, AdapterHitRatio: &h})
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if i, j, k := strings.Index(s, `"tpot_slo_ms"`), strings.Index(s, `"slo_met"`), strings.Index(s, `"models"`); !(i < j && j < k) {
		t.Errorf("order: %s", s)
	}
}
