package main

import (
	"fmt"
	"path/filepath"
	"slices"
)

// The pooled mode (-pool) reads the grid at several seeds: files of the
// same name, one a seed (e.g. seed1/chat-paper-eval.json and
// seed2/chat-paper-eval.json), become one, each policy's p95s the mean of
// its seeds' and its requests and those meeting the SLO summed. A p95 of
// one seed moves by a few percent with the run's chaos, as much as the
// goals' 3% margins; the mean over five seeds moves by less than half as
// much, and the best other policy is no longer whichever was luckiest.
// A policy whose run failed requests, or whose client held them back, at
// any seed is not comparable in the pool.

// pool merges files of the same base name, in the order their names first
// appear, and returns a path for each pooled file (the first of its name)
// with the pooled files.
func pool(paths []string, files []evalFile) ([]string, []evalFile, error) {
	var names []string
	byName := map[string][]int{}
	for k, p := range paths {
		n := filepath.Base(p)
		if _, ok := byName[n]; !ok {
			names = append(names, n)
		}
		byName[n] = append(byName[n], k)
	}
	var outPaths []string
	var out []evalFile
	for _, n := range names {
		ks := byName[n]
		first := files[ks[0]]
		for _, k := range ks[1:] { // every seed's policies are the first's: none dropped unseen
			for wi, w := range files[k].Windows {
				for _, r := range w.Runs {
					if wi >= len(first.Windows) || !slices.ContainsFunc(first.Windows[wi].Runs, func(o run) bool { return o.Policy == r.Policy }) {
						return nil, nil, fmt.Errorf("%s: %s, not in %s", paths[k], r.Policy, paths[ks[0]])
					}
				}
			}
		}
		merged := evalFile{}
		for wi, w := range first.Windows {
			mw := w
			mw.Runs = nil
			for _, r := range w.Runs {
				var same []run
				for _, k := range ks {
					f := files[k]
					if len(f.Windows) != len(first.Windows) || f.Windows[wi].TimeScale != w.TimeScale {
						return nil, nil, fmt.Errorf("%s: not the loads of %s", paths[k], paths[ks[0]])
					}
					i := slices.IndexFunc(f.Windows[wi].Runs, func(o run) bool { return o.Policy == r.Policy })
					if i < 0 {
						return nil, nil, fmt.Errorf("%s at %v: no %s (in %s)", paths[k], w.TimeScale, r.Policy, paths[ks[0]])
					}
					same = append(same, f.Windows[wi].Runs[i])
				}
				m, err := mean(same)
				if err != nil {
					return nil, nil, fmt.Errorf("%s at %v, %s: %v", n, w.TimeScale, r.Policy, err)
				}
				mw.Runs = append(mw.Runs, m)
			}
			merged.Windows = append(merged.Windows, mw)
		}
		outPaths = append(outPaths, paths[ks[0]])
		out = append(out, merged)
	}
	return outPaths, out, nil
}

// mean pools one policy's runs of a cell at several seeds.
func mean(runs []run) (run, error) {
	m := runs[0]
	m.TTFT.P95, m.E2E.P95, m.Slip.P95, m.Goodput = 0, 0, 0, 0
	m.Failed, m.Requests, m.SLOMet = 0, 0, 0
	for _, r := range runs {
		if r.SLO != m.SLO || r.TPOTSLO != m.TPOTSLO {
			return run{}, fmt.Errorf("SLOs differ between seeds (%v/%v against %v/%v)", r.SLO, r.TPOTSLO, m.SLO, m.TPOTSLO)
		}
		m.heldBack = m.heldBack || !r.comparable()
		m.TTFT.P95 += r.TTFT.P95
		m.E2E.P95 += r.E2E.P95
		m.Slip.P95 += r.Slip.P95
		m.Goodput += r.Goodput
		m.Failed += r.Failed
		m.Requests += r.Requests
		m.SLOMet += r.SLOMet
	}
	n := float64(len(runs))
	m.TTFT.P95 /= n
	m.E2E.P95 /= n
	m.Slip.P95 /= n
	m.Goodput /= n
	return m, nil
}
