package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gorgo-llm/gorgo/internal/report"
)

// gorgo tune scores its candidates on the requests after --score-from, as
// gorgo sim does: the initial weights' p95 TTFT is sim's on that window.
func TestTuneHonoursScoreFrom(t *testing.T) {
	dir := t.TempDir()
	initial := regexp.MustCompile(`initial [^:]*: p95 TTFT ([0-9.]+) ms`)
	code, out, errs := gorgo(t, "tune", "--duration", "5m", "--generations", "1", "--workers", "1", "--score-from", "4m", "--out", filepath.Join(dir, "w.json"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	got := initial.FindStringSubmatch(out)[1]
	js := filepath.Join(dir, "sim.json")
	if code, _, errs := gorgo(t, "sim", "--duration", "5m", "--policy", "gorgo", "--weights", "rtt=0.5,queue=0.1", "--score-from", "4m", "--quiet", "--json", js); code != 0 {
		t.Fatalf("sim: exit %d: %s", code, errs)
	}
	data, _ := os.ReadFile(js)
	var runs struct{ Runs []report.Run }
	if err := json.Unmarshal(data, &runs); err != nil {
		t.Fatal(err)
	}
	if want := strconv.FormatFloat(runs.Runs[0].TTFT.P95, 'f', 1, 64); got != want {
		t.Errorf("tune --score-from 4m: initial p95 TTFT %s ms; sim --score-from 4m, same weights: %s", got, want)
	}
}

// gorgo sim's table by tenant counts the requests its main table does:
// those after --score-from.
func TestSimTenantTableHonoursScoreFrom(t *testing.T) {
	code, out, errs := gorgo(t, "sim", "--duration", "5m", "--policy", "gorgo-e2e", "--quiet",
		"--tenants", "chat:interactive:0.5,batch:batch:0.5", "--ttft-slo", "2s", "--score-from", "4m")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	head, tenants, _ := strings.Cut(out, "by tenant")
	f := strings.Fields(strings.Split(strings.TrimSpace(head), "\n")[1])
	done, _ := strconv.Atoi(f[1])
	fail, _ := strconv.Atoi(f[2])
	met, _ := strconv.Atoi(f[len(f)-2])
	var treq, tmet int
	for _, l := range strings.Split(tenants, "\n") {
		if g := strings.Fields(l); len(g) >= 12 && strings.HasPrefix(g[0], "gorgo-e2e") {
			n, _ := strconv.Atoi(g[2])
			m, _ := strconv.Atoi(g[len(g)-1])
			treq, tmet = treq+n, tmet+m
		}
	}
	if treq != done+fail || tmet != met {
		t.Errorf("scored: %d requests, %d met the SLO; by tenant: %d requests, %d met", done+fail, met, treq, tmet)
	}
}
