package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The hindsight mode (-hindsight BASE:SETS, once per seed or window) asks what the
// policy could meet with its weights chosen per cell with hindsight. SETS
// holds a directory per weight setting (e.g. decode=0.2,itl=0.2), each
// with the grid's WORKLOAD-FLEET-eval.json files of the policy alone at
// those weights; BASE holds the grid's files of the other policies at the
// same seed. In each cell the setting's run stands in for the policy's
// own, and the issue's rule is read against the other policies (-exclude
// leaves out more). It prints how many cells each setting meets, how many
// some setting meets, and, for each way of choosing a setting per cell
// from its own figures (its p95s and its requests missing the SLO, what a
// tuner could measure; settings whose client held requests back are not
// chosen), how many cells the choice meets at the same seed and at
// another seed (chosen on one, scored on the other: what holds beyond the
// noise). The reference setting must be BASE's own run of the policy:
// that checks the two were run alike. A group without BASE (:SETS) gives
// figures to choose by and no verdicts: e.g. the settings run on the
// grid's tuning windows, to choose there what is scored on the held-out
// windows of another group (tuned on one window, scored on another).

// hindsightCell is one cell's verdict and figures for every setting.
type hindsightCell struct {
	verdict map[string]string // nil in a group without a base
	fig     map[string]run    // the setting's own run
}

// hindsight reads the groups and prints the analysis.
func hindsight(groups []string, def string, exclude []string, reference string) error {
	var byGroup []map[string]*hindsightCell // per group: cell name → cell
	var sets []string
	for _, g := range groups {
		base, dir, ok := strings.Cut(g, ":")
		if !ok {
			return fmt.Errorf("-hindsight %q: want BASE:SETS", g)
		}
		cells, names, err := hindsightGroup(base, dir, def, exclude, reference)
		if err != nil {
			return err
		}
		if sets == nil {
			sets = names
		} else if !slices.Equal(sets, names) {
			return fmt.Errorf("-hindsight %s: settings %v, not the first group's %v", dir, names, sets)
		}
		byGroup = append(byGroup, cells)
	}
	if !slices.Contains(sets, reference) {
		return fmt.Errorf("-reference %q: no such setting (have %s)", reference, strings.Join(sets, " "))
	}
	met := func(v string) bool { return strings.HasPrefix(v, "met") }
	for k, cells := range byGroup {
		if strings.HasPrefix(groups[k], ":") {
			continue // figures only
		}
		fmt.Printf("group %d (%s): the issue's rule met by each setting, against the other policies:\n", k+1, groups[k])
		best, hind := 0, 0
		for _, s := range sets {
			n := 0
			for _, c := range cells {
				if met(c.verdict[s]) {
					n++
				}
			}
			best = max(best, n)
			fmt.Printf("  %-28s %d\n", s, n)
		}
		for _, c := range cells {
			if slices.ContainsFunc(sets, func(s string) bool { return met(c.verdict[s]) }) {
				hind++
			}
		}
		fmt.Printf("  the best single setting: %d of %d cells; some setting, per cell with hindsight: %d\n", best, len(cells), hind)
	}
	// Choosing per cell from the setting's own figures, among the
	// settings whose run is comparable (its client did not hold requests
	// back): an overloaded setting's TTFT hides its wait.
	choosers := []struct {
		name   string
		choose func(c *hindsightCell) string
	}{
		{"the reference weights (" + reference + ")", func(*hindsightCell) string { return reference }},
		{"least p95 TTFT, p95 E2E within 5% of the reference's", func(c *hindsightCell) string {
			ref := 1.05 * c.fig[reference].E2E.P95 // the tuner's guard, over its drift from the start
			return argmin(c.usable(sets), func(s string) (float64, float64) { return b2f(c.fig[s].E2E.P95 > ref), c.fig[s].TTFT.P95 })
		}},
		{"least p95 TTFT", func(c *hindsightCell) string {
			return argmin(c.usable(sets), func(s string) (float64, float64) { return c.fig[s].TTFT.P95, 0 })
		}},
		{"least p95 TTFT × p95 E2E", func(c *hindsightCell) string {
			return argmin(c.usable(sets), func(s string) (float64, float64) { return c.fig[s].TTFT.P95 * c.fig[s].E2E.P95, 0 })
		}},
		{"fewest SLO misses, then least p95 TTFT × p95 E2E", func(c *hindsightCell) string {
			return argmin(c.usable(sets), func(s string) (float64, float64) {
				r := c.fig[s]
				return float64(r.Requests - r.SLOMet), r.TTFT.P95 * r.E2E.P95
			})
		}},
	}
	fmt.Println("\ncells met by the setting chosen per cell (chosen in group i, scored in group j):")
	for _, ch := range choosers {
		var parts []string
		for i := range byGroup {
			for j := range byGroup {
				if strings.HasPrefix(groups[j], ":") {
					continue // no verdicts to score by
				}
				n, of := 0, 0
				for name, c := range byGroup[i] {
					if o := byGroup[j][name]; o != nil {
						of++
						if met(o.verdict[ch.choose(c)]) {
							n++
						}
					}
				}
				parts = append(parts, fmt.Sprintf("%d→%d: %d of %d", i+1, j+1, n, of))
			}
		}
		fmt.Printf("  %-58s %s\n", ch.name, strings.Join(parts, "  "))
	}
	return nil
}

// usable are the settings whose run in the cell is comparable, or all of
// them if none is.
func (c *hindsightCell) usable(sets []string) []string {
	ok := slices.DeleteFunc(slices.Clone(sets), func(s string) bool {
		r := c.fig[s]
		return !r.comparable()
	})
	if len(ok) == 0 {
		return sets
	}
	return ok
}

// hindsightGroup reads one group: each setting's files merged into the
// base's, and the issue's verdict on every cell.
func hindsightGroup(base, dir, def string, exclude []string, reference string) (map[string]*hindsightCell, []string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	var sets []string
	for _, e := range entries {
		if fi, err := os.Stat(filepath.Join(dir, e.Name())); err == nil && fi.IsDir() { // a link to one too
			sets = append(sets, e.Name())
		}
	}
	if len(sets) == 0 {
		return nil, nil, fmt.Errorf("%s: no settings (a directory per setting)", dir)
	}
	from := base
	if base == "" { // figures only: the reference setting's files name the cells
		from = filepath.Join(dir, reference)
	}
	paths, err := filepath.Glob(filepath.Join(from, "*-eval.json"))
	if err != nil || len(paths) == 0 {
		return nil, nil, fmt.Errorf("%s: no *-eval.json files", from)
	}
	cells := map[string]*hindsightCell{}
	for _, path := range paths {
		var b evalFile
		if err := readJSON(path, &b); err != nil {
			return nil, nil, err
		}
		name := strings.TrimSuffix(filepath.Base(path), "-eval.json")
		for _, s := range sets {
			var f evalFile
			if err := readJSON(filepath.Join(dir, s, filepath.Base(path)), &f); err != nil {
				return nil, nil, err
			}
			if len(f.Windows) != len(b.Windows) {
				return nil, nil, fmt.Errorf("%s/%s: %d loads, the base %d", s, filepath.Base(path), len(f.Windows), len(b.Windows))
			}
			for i, w := range b.Windows {
				if f.Windows[i].TimeScale != w.TimeScale {
					return nil, nil, fmt.Errorf("%s/%s: load %v, the base %v", s, filepath.Base(path), f.Windows[i].TimeScale, w.TimeScale)
				}
				k := slices.IndexFunc(f.Windows[i].Runs, func(r run) bool { return r.Policy == def })
				if k < 0 {
					return nil, nil, fmt.Errorf("%s/%s: no %s run", s, filepath.Base(path), def)
				}
				mine := f.Windows[i].Runs[k]
				if mine.SLO <= 0 {
					return nil, nil, fmt.Errorf("%s/%s: not scored for SLO goodput (gorgo eval --goodput-slo), which the rule reads", s, filepath.Base(path))
				}
				// The reference setting is the base's own policy: the same
				// run, or the two were not run alike (window, seed, SLOs).
				if own := slices.IndexFunc(w.Runs, func(r run) bool { return r.Policy == def }); s == reference && (own < 0 || w.Runs[own] != mine) {
					return nil, nil, fmt.Errorf("%s/%s at %v: the reference setting's run is not %s's own in %s: were they run alike (window, seed, SLOs)?", s, filepath.Base(path), w.TimeScale, def, base)
				}
				runs := []run{mine}
				for _, r := range w.Runs {
					if r.Policy != def && !slices.Contains(exclude, r.Policy) && !strings.HasPrefix(r.Policy, cv+"-") {
						runs = append(runs, r)
					}
				}
				cell := fmt.Sprintf("%s ×%v", name, w.TimeScale)
				c := cells[cell]
				if c == nil {
					c = &hindsightCell{fig: map[string]run{}}
					if base != "" {
						c.verdict = map[string]string{}
					}
					cells[cell] = c
				}
				c.fig[s] = mine
				if c.verdict != nil {
					c.verdict[s] = verdict(runs, def)
				}
			}
		}
	}
	return cells, sets, nil
}

// verdict is the issue's rule on a cell's runs for policy def, as main
// reads it.
func verdict(runs []run, def string) string {
	d := &runs[slices.IndexFunc(runs, func(r run) bool { return r.Policy == def })]
	dom, bestG := rivals(runs, def, d)
	return issueRule(runs, def, d, dom, bestG == nil || d.Goodput >= bestG.Goodput)
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// argmin is the setting with the least key (first, then second).
func argmin(sets []string, key func(string) (float64, float64)) string {
	best, b1, b2 := "", math.Inf(1), math.Inf(1)
	for _, s := range sets {
		k1, k2 := key(s)
		if k1 < b1 || k1 == b1 && k2 < b2 {
			best, b1, b2 = s, k1, k2
		}
	}
	return best
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
