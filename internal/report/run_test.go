package report

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestRunModels(t *testing.T) {
	recs := []Record{
		{Replica: "a", TTFT: 10, E2E: 20, PromptTokens: 100},
		{Replica: "a", TTFT: 10, E2E: 20, PromptTokens: 100},
	}
	if r := NewRun("p", recs, []string{"a"}); r.Models != nil {
		t.Errorf("records without models: Models = %v, want nil", r.Models)
	}
	recs[0].Model = "m"
	r := NewRun("p", recs, []string{"a"})
	if want := map[string]int{"m": 1, "": 1}; !reflect.DeepEqual(r.Models, want) {
		t.Errorf("Models = %v, want %v", r.Models, want)
	}
}

func TestScoreAdapters(t *testing.T) {
	var r Run
	r.ScoreAdapters(0, 0)
	if r.AdapterHitRatio != nil || r.AdapterRequests != 0 {
		t.Errorf("no adapter requests: %+v", r)
	}
	r.ScoreAdapters(200, 50)
	if r.AdapterRequests != 200 || r.AdapterHitRatio == nil || *r.AdapterHitRatio != 0.75 {
		t.Errorf("200 requests, 50 loads: %d, %v", r.AdapterRequests, r.AdapterHitRatio)
	}
	r.ScoreAdapters(10, 12) // more loads than requests (a request loaded twice): no hit, not negative
	if *r.AdapterHitRatio != 0 {
		t.Errorf("more loads than requests: hit %v", *r.AdapterHitRatio)
	}
}

// TestWriteTableAdapterColumn: the adapter hit column shows only when a
// run had adapter requests, so tables of runs without adapters are as
// they were; the JSON of such runs has no adapter keys either.
func TestWriteTableAdapterColumn(t *testing.T) {
	recs := []Record{{Replica: "a", TTFT: 10, E2E: 20, PromptTokens: 100, CachedTokens: 50}}
	plain := NewRun("p", recs, []string{"a"})
	var b bytes.Buffer
	if err := WriteTable(&b, []Run{plain}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "adapter") {
		t.Errorf("a table without adapters shows them:\n%s", b.String())
	}
	js, _ := json.Marshal(plain)
	if strings.Contains(string(js), "adapter") || strings.Contains(string(js), "models") {
		t.Errorf("JSON of a run without adapters or models: %s", js)
	}
	lora := NewRun("q", recs, []string{"a"})
	lora.ScoreAdapters(4, 1)
	b.Reset()
	if err := WriteTable(&b, []Run{plain, lora}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "adapter hit") {
		t.Fatalf("table:\n%s", b.String())
	}
	if !strings.Contains(lines[1], " - ") || !strings.Contains(lines[2], "75.0%") {
		t.Errorf("rows: want - for the run without adapters and 75.0%% for the other:\n%s", b.String())
	}
}

func TestByTenant(t *testing.T) {
	recs := []Record{
		{Tenant: "a", PromptTokens: 100, OutputTokens: 50, TTFT: 100},
		{Tenant: "a", PromptTokens: 100, OutputTokens: 50, TTFT: 900},
		{Tenant: "b", PromptTokens: 90, OutputTokens: 10, TTFT: 200},
		{Tenant: "b", Failed: true, Rejected: true, PromptTokens: 1000},
		{PromptTokens: 100, TTFT: 50},
	}
	ts := ByTenant(recs, 500)
	if len(ts) != 3 || ts[0].Tenant != "a" || ts[1].Tenant != "b" || ts[2].Tenant != "default" {
		t.Fatalf("%+v", ts)
	}
	a, b := ts[0], ts[1]
	if a.Tokens != 300 || b.Tokens != 100 || b.Rejected != 1 || b.Completed != 1 || a.SLOMet != 1 || math.Abs(a.Share-0.6) > 1e-9 {
		t.Errorf("a %+v, b %+v", a, b)
	}
	var out strings.Builder
	if err := WriteTenants(&out, "p", ts, 500); err != nil || !strings.Contains(out.String(), "met SLO") || !strings.Contains(out.String(), "60.0%") {
		t.Errorf("%v\n%s", err, out.String())
	}
}

// Goodput counts a request that met the TTFT SLO from when the client
// meant to send it and, with a TPOT SLO, kept its mean gap between tokens
// within it (a one-token answer has none to miss).
func TestScoreSLOWithTPOT(t *testing.T) {
	recs := []Record{
		{TTFT: 900, ITL: 40, OutputTokens: 100},               // meets both
		{TTFT: 900, ITL: 60, OutputTokens: 100},               // too slow a decode
		{TTFT: 600, Slip: 500, ITL: 10, OutputTokens: 100},    // sent late: TTFT missed
		{TTFT: 800, ITL: 0, OutputTokens: 1},                  // one token: no TPOT
		{TTFT: 100, ITL: 10, OutputTokens: 100, Failed: true}, // failed
	}
	var r Run
	r.ScoreSLO(recs, 1000, 0, 10)
	if r.SLOMet != 3 || r.Goodput != 0.3 || r.TPOTSLO != 0 {
		t.Errorf("TTFT only: met %d, goodput %v, TPOT SLO %v; want 3, 0.3, 0", r.SLOMet, r.Goodput, r.TPOTSLO)
	}
	r.ScoreSLO(recs, 1000, 50, 10)
	if r.SLOMet != 2 || r.Goodput != 0.2 || r.TPOTSLO != 50 {
		t.Errorf("TTFT and TPOT: met %d, goodput %v, TPOT SLO %v; want 2, 0.2, 50", r.SLOMet, r.Goodput, r.TPOTSLO)
	}
}

// A record held to its tenant's own TTFT SLO is scored against it, in the
// run's goodput and its tenant's table alike.
func TestScoreSLOOfItsOwn(t *testing.T) {
	recs := []Record{
		{Tenant: "chat", TTFT: 800, TTFTSLO: 500},    // misses its own, though within the run's
		{Tenant: "chat", TTFT: 400, TTFTSLO: 500},    // meets it
		{Tenant: "batch", TTFT: 5000, TTFTSLO: 8000}, // meets its own, past the run's
		{Tenant: "batch", TTFT: 900},                 // the run's
	}
	var r Run
	r.ScoreSLO(recs, 1000, 0, 10)
	if r.SLOMet != 3 {
		t.Errorf("met %d, want 3", r.SLOMet)
	}
	ts := ByTenant(recs, 1000)
	if len(ts) != 2 || ts[0].Tenant != "batch" || ts[0].SLOMet != 2 || ts[1].SLOMet != 1 {
		t.Errorf("by tenant %+v: want batch 2 met, chat 1", ts)
	}
}

// A record whose ITL was not measured (a whole answer: its client sees no
// gaps between tokens) is left out of the ITL, not counted as 0.
func TestUnmeasuredITLIsLeftOut(t *testing.T) {
	r := NewRun("p", []Record{{OutputTokens: 5, ITL: 20, TTFT: 1, E2E: 2}, {OutputTokens: 5, TTFT: 3, E2E: 3}}, nil)
	if r.ITL.Mean != 20 || r.Completed != 2 || r.ITLRequests != 1 {
		t.Errorf("ITL mean %v over %d completed, want 20 (the whole answer left out)", r.ITL.Mean, r.Completed)
	}
	// With none measured the table says so, not 0.0 ms.
	whole := NewRun("whole", []Record{{OutputTokens: 5, TTFT: 3, E2E: 3}}, nil)
	var out strings.Builder
	if err := WriteTable(&out, []Run{whole}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// policy, done, fail, TTFT p50 p90 p95 p99 mean, E2E p50 p95 p99, ITL mean
	if row := strings.Fields(lines[1]); len(row) < 12 || row[11] != "-" || row[10] != "3.0" {
		t.Errorf("every answer whole, the table's ITL column: %s", out.String())
	}
}
