package main

import (
	"math"
	"strings"
	"testing"
)

func cell(ts float64, runs ...run) evalFile {
	return evalFile{Windows: []window{{ts, runs}}}
}

func tails(policy string, ttft, e2e, slip float64, requests, met int) run {
	r := run{Policy: policy, Requests: requests, SLOMet: met, SLO: 1000, Goodput: float64(met) / 100}
	r.TTFT.P95, r.E2E.P95, r.Slip.P95 = ttft, e2e, slip
	return r
}

func TestPool(t *testing.T) {
	paths := []string{"s1/chat-paper-eval.json", "s1/agent-paper-eval.json", "s2/chat-paper-eval.json", "s2/agent-paper-eval.json"}
	files := []evalFile{
		cell(1, tails("a", 100, 1000, 0, 50, 40), tails("b", 200, 900, 0, 50, 50)),
		cell(1, tails("a", 10, 10, 0, 1, 1)),
		// b's client held requests back at the second seed (slip above TTFT).
		cell(1, tails("b", 300, 1100, 400, 50, 45), tails("a", 120, 1200, 0, 50, 44)),
		cell(1, tails("a", 30, 20, 0, 1, 0)),
	}
	got, pooled, err := pool(paths, files)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != paths[0] || got[1] != paths[1] {
		t.Fatalf("paths %v, want the first of each name in order", got)
	}
	runs := pooled[0].Windows[0].Runs
	a, b := runs[0], runs[1]
	if a.Policy != "a" || a.TTFT.P95 != 110 || a.E2E.P95 != 1100 || a.Requests != 100 || a.SLOMet != 84 || math.Abs(a.Goodput-0.42) > 1e-9 || !a.comparable() {
		t.Errorf("a pooled to %+v", a)
	}
	if b.Policy != "b" || b.TTFT.P95 != 250 || b.E2E.P95 != 1000 || b.comparable() {
		t.Errorf("b pooled to %+v; held back at one seed, it is not comparable", b)
	}
	if r := pooled[1].Windows[0].Runs[0]; r.TTFT.P95 != 20 || r.E2E.P95 != 15 {
		t.Errorf("agent pooled to %+v", r)
	}

	// Seeds that do not match are refused, not pooled.
	for name, f := range map[string]evalFile{
		"a policy missing": cell(1, tails("a", 1, 1, 0, 1, 1)),
		"a policy more":    cell(1, tails("a", 1, 1, 0, 1, 1), tails("b", 1, 1, 0, 1, 1), tails("c", 1, 1, 0, 1, 1)),
		"another load":     cell(2, tails("a", 1, 1, 0, 1, 1), tails("b", 1, 1, 0, 1, 1)),
	} {
		if _, _, err := pool(paths[:3], []evalFile{files[0], files[1], f}); err == nil {
			t.Errorf("%s: pooled", name)
		}
	}
	other := files[2]
	other.Windows = []window{{1, []run{tails("b", 1, 1, 0, 1, 1), tails("a", 1, 1, 0, 1, 1)}}}
	other.Windows[0].Runs[1].SLO = 500
	if _, _, err := pool(paths[:3], []evalFile{files[0], files[1], other}); err == nil || !strings.Contains(err.Error(), "SLOs differ") {
		t.Errorf("another SLO: %v", err)
	}
}
