// Command grid turns gorgo eval JSON files into the default policy's
// results grid (docs/results.md, part 6): for each workload, fleet and
// load, the default policy's p95 TTFT and p95 E2E against the best other
// non-clairvoyant policy, the best policy and clairvoyant, and whether the
// goals are met. Files are named WORKLOAD-FLEET-eval.json.
//
// A run whose client held requests back longer than they then waited
// (slip p95 above TTFT p95: the paper's client caps requests in flight)
// is overloaded, and its TTFT, which starts only when the client sends,
// says nothing of the wait: it is left out of the comparisons.
//
// Usage: go run ./scripts/grid docs/results/grid/*-eval.json
package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

const (
	def = "gorgo-e2e"
	cv  = "clairvoyant"
)

type run struct {
	Policy string `json:"policy"`
	TTFT   struct {
		P95 float64 `json:"p95"`
	} `json:"ttft_ms"`
	E2E struct {
		P95 float64 `json:"p95"`
	} `json:"e2e_ms"`
	Slip struct {
		P95 float64 `json:"p95"`
	} `json:"slip_ms"`
	Failed int `json:"failed"`
}

// comparable reports whether a run's TTFT means what it says.
func (r *run) comparable() bool { return r.Failed == 0 && r.Slip.P95 <= r.TTFT.P95 }

type evalFile struct {
	Windows []struct {
		TimeScale float64 `json:"time_scale"`
		Runs      []run   `json:"runs"`
	} `json:"windows"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: grid WORKLOAD-FLEET-eval.json...")
		os.Exit(2)
	}
	fmt.Println("| workload | fleet | time scale | default p95 TTFT | best other (non-clairvoyant) | Δ | clairvoyant | Δ | default p95 E2E | best other | Δ | goals |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	var cells, ttftOK, e2eOK, cvOK, all, overloaded int
	for _, path := range os.Args[1:] {
		name := strings.TrimSuffix(filepath.Base(path), "-eval.json")
		workload, fleet, _ := strings.Cut(name, "-")
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		var ef evalFile
		if err := json.Unmarshal(data, &ef); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			os.Exit(1)
		}
		for _, w := range ef.Windows {
			var d, c *run
			bestT, bestE := (*run)(nil), (*run)(nil)
			for i := range w.Runs {
				r := &w.Runs[i]
				switch {
				case r.Policy == def:
					d = r
					continue
				case r.Policy == cv:
					c = r
				case r.comparable() && (bestT == nil || r.TTFT.P95 < bestT.TTFT.P95):
					bestT = r
				}
				if r.comparable() && (bestE == nil || r.E2E.P95 < bestE.E2E.P95) {
					bestE = r
				}
			}
			if d == nil || c == nil || bestT == nil || bestE == nil {
				fmt.Fprintf(os.Stderr, "%s at %v: the default policy, clairvoyant or a baseline is missing\n", path, w.TimeScale)
				os.Exit(1)
			}
			dt, dc, de := rel(d.TTFT.P95, bestT.TTFT.P95), rel(d.TTFT.P95, c.TTFT.P95), rel(d.E2E.P95, bestE.E2E.P95)
			var goals []string
			cells++
			ok := true
			cvText := fmt.Sprintf("%s | %s", ms(c.TTFT.P95), pct(dc))
			if !c.comparable() {
				dc = 0 // no yardstick: it held requests back
				cvText = fmt.Sprintf("(slip p95 %s s) | n/a", ms(c.Slip.P95/1000))
				overloaded++
			}
			if !d.comparable() {
				goals = append(goals, "overloaded")
				ok = false
			}
			if dt <= 0.03 {
				ttftOK++
			} else {
				goals = append(goals, "TTFT")
				ok = false
			}
			if de <= 0.03 {
				e2eOK++
			} else {
				goals = append(goals, "E2E")
				ok = false
			}
			if dc <= 0.05 {
				cvOK++
			} else {
				goals = append(goals, "vs clairvoyant")
				ok = false
			}
			verdict := "met"
			if ok {
				all++
			} else {
				verdict = "missed: " + strings.Join(goals, ", ")
			}
			fmt.Printf("| %s | %s | %v | %s | %s %s | %s | %s | %s | %s %s | %s | %s |\n",
				workload, fleet, w.TimeScale, ms(d.TTFT.P95), bestT.Policy, ms(bestT.TTFT.P95), pct(dt), cvText,
				ms(d.E2E.P95), bestE.Policy, ms(bestE.E2E.P95), pct(de), verdict)
		}
	}
	fmt.Printf("\n%d cells: p95 TTFT within 3%% of the best other non-clairvoyant policy in %d, p95 E2E within 3%% of the best other policy in %d, p95 TTFT within 5%% of clairvoyant in %d (%d where clairvoyant itself is overloaded count as met); all three in %d.\n",
		cells, ttftOK, e2eOK, cvOK, overloaded, all)
}

func rel(a, b float64) float64 {
	if b == 0 {
		return math.Inf(1)
	}
	return a/b - 1
}

func pct(x float64) string { return fmt.Sprintf("%+.1f%%", 100*x) }

func ms(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
