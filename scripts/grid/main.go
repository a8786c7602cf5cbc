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
// A cell where the policy misses a goal may still be on the policies'
// TTFT–E2E front: no other non-clairvoyant policy has both a lower p95
// TTFT and a lower p95 E2E.
//
// The issue's rule (issue 20) is the last column: a cell is met when the
// policy's p95 TTFT is within 3% of the best other non-clairvoyant
// policy's and its p95 E2E within 3% of the best other policy's; or, when
// no non-clairvoyant policy has both (the cell cannot have them), when the
// policy is on the front and its SLO goodput is the best of the
// non-clairvoyant policies' (or equal to it).
//
// At SLOs nearly every request of every policy meets, which policy's SLO
// goodput is the best turns on a few requests. The summary also says how
// many of the cells missed on goodput alone are within the noise: the
// policy's requests that missed the SLO outnumber the best policy's by no
// more than twice the standard error of the difference (√ of the two
// counts, as Poisson counts). A rerun could turn their verdict.
//
// With -plot DIR it also draws the fronts: DIR/front-WORKLOAD.png, a
// panel for each fleet and load, every comparable policy's p95 TTFT
// against its p95 E2E, the front as a line and the 3% margins dashed
// (report.PlotFronts).
//
// With -pool it reads the grid at several seeds, files of one name (one a
// seed) pooled into one cell (see pool.go).
//
// With -hindsight it asks instead what the policy would meet with its
// weights chosen per cell (see hindsight.go).
//
// Usage: go run ./scripts/grid [-policy NAME] [-exclude NAMES] [-plot DIR] [-pool] docs/results/grid/*-eval.json
// or: go run ./scripts/grid -hindsight BASE:SETS [-hindsight [BASE]:SETS...] [-exclude NAMES] [-reference SETTING]
// (-policy: the policy the grid is about, default gorgo-e2e; e.g.
// gorgo-online for the default policy tuning itself online. -exclude:
// policies left out of the comparison, e.g. gorgo-e2e when the grid is
// about gorgo-online, to compare the default policy, tuning itself, with
// the other policies alone and not with itself at fixed weights).
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gorgo-llm/gorgo/internal/report"
)

const cv = "clairvoyant"

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
	Failed  int     `json:"failed"`
	Goodput float64 `json:"goodput_rps"`
	// Requests and SLOMet count the scored requests and those that met
	// the SLO.
	Requests int     `json:"requests"`
	SLOMet   int     `json:"slo_met"`
	SLO      float64 `json:"ttft_slo_ms"`
	TPOTSLO  float64 `json:"tpot_slo_ms"`
	// heldBack says a pooled run was not comparable at some seed.
	heldBack bool
}

// comparable reports whether a run's TTFT means what it says.
func (r *run) comparable() bool { return r.Failed == 0 && r.Slip.P95 <= r.TTFT.P95 && !r.heldBack }

type evalFile struct {
	Windows []window `json:"windows"`
}

// window is one load of a cell: every policy's run at that time scale.
type window struct {
	TimeScale float64 `json:"time_scale"`
	Runs      []run   `json:"runs"`
}

func main() {
	defName := flag.String("policy", "gorgo-e2e", "the policy the grid is about")
	exclude := flag.String("exclude", "", "comma-separated policies to leave out of the comparison")
	plotDir := flag.String("plot", "", "a directory to draw each workload's fronts in (front-WORKLOAD.png)")
	pooled := flag.Bool("pool", false, "pool files of the same name (one a seed): each policy's p95s the mean of its seeds' (see pool.go)")
	var groups []string
	flag.Func("hindsight", "`BASE:SETS`: the policy at each weight setting of SETS against the other policies of BASE (repeat per seed or window; :SETS for figures to choose by alone; see hindsight.go)", func(s string) error {
		groups = append(groups, s)
		return nil
	})
	reference := flag.String("reference", "decode=0.2,itl=0.2", "with -hindsight: the setting of the policy's default weights")
	flag.Parse()
	def := *defName
	if len(groups) > 0 {
		var ex []string
		if *exclude != "" {
			ex = strings.Split(*exclude, ",")
		}
		if err := hindsight(groups, def, ex, *reference); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if flag.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: grid [-policy NAME] WORKLOAD-FLEET-eval.json...")
		os.Exit(2)
	}
	paths := flag.Args()
	files := make([]evalFile, len(paths))
	for k, path := range paths {
		if err := readJSON(path, &files[k]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for i := range files[k].Windows {
			w := &files[k].Windows[i]
			w.Runs = slices.DeleteFunc(w.Runs, func(r run) bool {
				// clairvoyant's variants (clairvoyant-engines) are
				// yardsticks too, never the grid's competitors.
				return strings.HasPrefix(r.Policy, cv+"-") || *exclude != "" && slices.Contains(strings.Split(*exclude, ","), r.Policy)
			})
		}
	}
	if *pooled {
		var err error
		if paths, files, err = pool(paths, files); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	scored := false // some runs were scored for SLO goodput
	for _, f := range files {
		for _, w := range f.Windows {
			for _, r := range w.Runs {
				scored = scored || r.SLO > 0
			}
		}
	}
	header := fmt.Sprintf("| workload | fleet | time scale | %s p95 TTFT | best other (non-clairvoyant) | Δ | clairvoyant | Δ | %s p95 E2E | best other | Δ | goals | on the front |", def, def)
	rule := "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
	if scored {
		header, rule = header+" SLO goodput | the issue's rule |", rule+"---|---|"
	}
	fmt.Println(header)
	fmt.Println(rule)
	if *plotDir != "" {
		if err := plotFronts(*plotDir, def, paths, files); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	var cells, ttftOK, e2eOK, cvOK, all, overloaded, front, metOrFront, goodBest, goodCells int
	var issueBoth, issueFront, issueCells, goodMiss, goodNoise int
	for k, path := range paths {
		name := strings.TrimSuffix(filepath.Base(path), "-eval.json")
		workload, fleet, _ := strings.Cut(name, "-")
		for _, w := range files[k].Windows {
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
			dom, bestG := rivals(w.Runs, def, d)
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
			onFront := "yes"
			if dom != nil {
				onFront = fmt.Sprintf("no: %s %s / %s", dom.Policy, ms(dom.TTFT.P95), ms(dom.E2E.P95))
			} else if d.comparable() {
				front++
			}
			if ok || dom == nil && d.comparable() {
				metOrFront++
			}
			// SLO goodput, when the runs were scored for it: the policy's
			// against the best other non-clairvoyant policy's.
			good := ""
			if scored {
				good = " - | - |"
			}
			if d.SLO > 0 {
				goodCells++
				isBest := bestG == nil || d.Goodput >= bestG.Goodput
				switch {
				case isBest:
					goodBest++
					slo := "SLO " + ms(d.SLO) + " ms"
					if d.TPOTSLO > 0 {
						slo = "SLO TTFT " + ms(d.SLO) + " ms, TPOT " + ms(d.TPOTSLO) + " ms"
					}
					good = fmt.Sprintf(" best (%.2f/s, %s) |", d.Goodput, slo)
				default:
					good = fmt.Sprintf(" %s (%s %.2f/s) |", pct(rel(d.Goodput, bestG.Goodput)), bestG.Policy, bestG.Goodput)
				}
				issueCells++
				verdict := issueRule(w.Runs, def, d, dom, isBest)
				if verdict == "met: both" {
					issueBoth++
				} else if strings.HasPrefix(verdict, "met") {
					issueFront++
				}
				good += " " + verdict + " |"
				if verdict == "no: goodput" {
					goodMiss++
					if withinNoise(d, bestG) {
						goodNoise++
					}
				}
			}
			fmt.Printf("| %s | %s | %v | %s | %s %s | %s | %s | %s | %s %s | %s | %s | %s |%s\n",
				workload, fleet, w.TimeScale, ms(d.TTFT.P95), bestT.Policy, ms(bestT.TTFT.P95), pct(dt), cvText,
				ms(d.E2E.P95), bestE.Policy, ms(bestE.E2E.P95), pct(de), verdict, onFront, good)
		}
	}
	fmt.Printf("\n%d cells: p95 TTFT within 3%% of the best other non-clairvoyant policy in %d, p95 E2E within 3%% of the best other policy in %d, p95 TTFT within 5%% of clairvoyant in %d (%d where clairvoyant itself is overloaded count as met); all three in %d; on the TTFT–E2E front in %d; all three met or on the front in %d.\n",
		cells, ttftOK, e2eOK, cvOK, overloaded, all, front, metOrFront)
	if goodCells > 0 {
		fmt.Printf("SLO goodput the best of the non-clairvoyant policies (or tied) in %d of %d cells.\n", goodBest, goodCells)
	}
	if issueCells > 0 {
		fmt.Printf("The issue's rule: met in %d of %d cells, %d with both tails within 3%% and %d where no policy has both, on the front with the best SLO goodput.\n",
			issueBoth+issueFront, issueCells, issueBoth, issueFront)
		fmt.Printf("Of the %d cells missed on SLO goodput alone, %d are within the noise (their excess of requests missing the SLO over the best policy's at most twice its standard error).\n", goodMiss, goodNoise)
	}
}

// plotFronts draws each workload's cells, a row for each of its fleets
// (files) and a column for each load, into dir/front-WORKLOAD.png.
func plotFronts(dir, def string, paths []string, files []evalFile) error {
	byWorkload := map[string][]report.Cell{}
	var workloads []string
	cols := 1
	for k, path := range paths {
		name := strings.TrimSuffix(filepath.Base(path), "-eval.json")
		workload, fleet, _ := strings.Cut(name, "-")
		if !slices.Contains(workloads, workload) {
			workloads = append(workloads, workload)
		}
		cols = max(cols, len(files[k].Windows))
		for _, w := range files[k].Windows {
			c := report.Cell{Title: fmt.Sprintf("%s, %s ×%v", workload, fleet, w.TimeScale)}
			for _, r := range w.Runs {
				if r.comparable() {
					c.Runs = append(c.Runs, report.Tails{Policy: r.Policy, TTFT: r.TTFT.P95, E2E: r.E2E.P95, Yardstick: r.Policy == cv})
				}
			}
			byWorkload[workload] = append(byWorkload[workload], c)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, wl := range workloads {
		title := wl + " (line: the front;\ndashed: 3% above the bests)"
		if err := report.PlotFronts(filepath.Join(dir, "front-"+wl+".png"), title, cols, def, byWorkload[wl]); err != nil {
			return err
		}
	}
	return nil
}

// rivals are, among the other non-clairvoyant policies, the first that
// dominates d (comparable, and better on both tails) and the one with the
// best SLO goodput (nil if none).
func rivals(runs []run, def string, d *run) (dom, bestG *run) {
	for i := range runs {
		r := &runs[i]
		if r.Policy == def || r.Policy == cv {
			continue
		}
		if dom == nil && r.comparable() && r.TTFT.P95 < d.TTFT.P95 && r.E2E.P95 < d.E2E.P95 {
			dom = r
		}
		if bestG == nil || r.Goodput > bestG.Goodput {
			bestG = r
		}
	}
	return dom, bestG
}

// withinNoise reports whether d's excess of requests missing the SLO over
// best's is at most twice the standard error of that difference, the
// counts of misses taken as Poisson counts.
func withinNoise(d, best *run) bool {
	if d.Requests == 0 || best.Requests == 0 {
		return false // files written before the counts were
	}
	md, mb := float64(d.Requests-d.SLOMet), float64(best.Requests-best.SLOMet)
	return md-mb <= 2*math.Sqrt(md+mb)
}

// issueRule is the issue's verdict on a cell for policy d: "met: both"
// when its p95 TTFT is within 3% of the best other non-clairvoyant
// policy's and its p95 E2E within 3% of the best other policy's; else,
// when no non-clairvoyant policy has both tails within 3% of the bests
// (d included), "met: front and goodput" if d is on the front (dom nil)
// with the best SLO goodput, or what it misses.
func issueRule(runs []run, def string, d, dom *run, bestGoodput bool) string {
	if !d.comparable() {
		return "no: overloaded"
	}
	bestT, bestE := math.Inf(1), math.Inf(1) // over every comparable policy, d included
	for i := range runs {
		r := &runs[i]
		if !r.comparable() {
			continue
		}
		if r.Policy != cv {
			bestT = min(bestT, r.TTFT.P95)
		}
		bestE = min(bestE, r.E2E.P95)
	}
	both := func(r *run) bool {
		return r.comparable() && r.Policy != cv && rel(r.TTFT.P95, bestT) <= 0.03 && rel(r.E2E.P95, bestE) <= 0.03
	}
	if both(d) {
		return "met: both"
	}
	for i := range runs {
		if r := &runs[i]; r.Policy != def && both(r) {
			return "no: " + r.Policy + " has both"
		}
	}
	switch {
	case dom != nil:
		return "no: off the front"
	case !bestGoodput:
		return "no: goodput"
	}
	return "met: front and goodput"
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
