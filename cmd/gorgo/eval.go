package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/sim"
	"github.com/gorgo-llm/gorgo/internal/trace"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

const evalAbout = `
Evaluates gorgo with frozen weights (--weights) against every baseline on
held-out windows of a workload, side by side on the same traffic and network:
a table per window and time scale like the paper's, with each policy's change
against simple-session-affinity, and a TTFT CDF plot per window (PNG).`

// baseline is the policy eval compares every other against, as the paper does.
const baseline = "simple-session-affinity"

// evalWindow is one window at one time scale.
type evalWindow struct {
	Window    string       `json:"window"`
	TimeScale float64      `json:"time_scale"`
	Runs      []report.Run `json:"runs"`
	desc      string
	ttfts     []report.Series
}

func runEval(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("eval", "eval [--weights FILE] --window A --window B ... [flags]", evalAbout, stderr)
	var wl workloadFlags
	wl.register(fs, false)
	var ff fleetFlags
	ff.register(fs)
	var pf policyFlags
	pf.register(fs)
	var tf tuneFlags
	tf.registerSim(fs)
	var windows listFlag
	fs.Var(&windows, "window", "held-out window `START,DURATION` (repeatable; default the whole workload)")
	sweep := fs.String("sweep", "", "evaluate at several time scales: `time-scale=1,1.5,2,3` (overrides --time-scale)")
	policies := fs.String("policy", strings.Join(policy.Compared(), ","), "comma-separated `POLICIES`")
	jsonOut := fs.String("json", "", "write the results as JSON to `FILE`")
	goodputSLO := fs.Duration("goodput-slo", 0, "also score goodput: requests per second whose TTFT (slip included) met this SLO (0: none)")
	goodputTPOT := fs.Duration("goodput-tpot", 0, "with --goodput-slo: a request must also keep its time per output token (the mean gap between its tokens) within this `D` (0: no TPOT SLO)")
	plots := fs.String("plots", "", "TTFT CDF plots go to `PREFIX`-N-tsS.png, one per window N and time scale S (default: beside --json, else eval-N-tsS.png here; \"none\" for none)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	tf.parsed(fs)
	if err := tf.runSLO(&wl, *goodputSLO > 0, "--goodput-slo"); err != nil {
		return err
	}
	switch {
	case *plots == "none":
		*plots = ""
	case *plots == "" && *jsonOut != "":
		*plots = strings.TrimSuffix(*jsonOut, ".json")
	case *plots == "":
		*plots = "eval"
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *goodputSLO < 0 {
		return fmt.Errorf("--goodput-slo must not be negative")
	}
	if *goodputTPOT < 0 || *goodputTPOT > 0 && *goodputSLO == 0 {
		return fmt.Errorf("--goodput-tpot must be positive and come with --goodput-slo")
	}
	scales := []float64{wl.timeScale}
	if *sweep != "" {
		var err error
		if scales, err = parseSweep(*sweep); err != nil {
			return err
		}
	}
	for _, s := range scales {
		if err := trace.ValidateScale(s); err != nil {
			return fmt.Errorf("time scale: %w", err)
		}
	}
	if len(windows) == 0 {
		windows = listFlag{""}
	}
	var wins []trace.Window
	for _, w := range windows {
		win, err := parseWindow(w)
		if err != nil {
			return err
		}
		wins = append(wins, win)
	}
	names := splitList(*policies)
	for i := range names {
		names[i] = policy.Canonical(names[i])
	}
	plotProbe := "" // the first plot's path: its directory must exist before the runs
	if *plots != "" {
		plotProbe = *plots + "-1-ts1.png"
	}
	if err := checkWritable(*jsonOut, plotProbe); err != nil {
		return err
	}
	checked, err := pf.policies(*policies, &tf, wl.seed) // validate once
	if err != nil {
		return err
	}
	t, reps, err := ff.load()
	if err != nil {
		return err
	}
	if t.IsMesh() {
		return fmt.Errorf("--topology %s is a mesh (a router in several regions): gorgo eval runs one router; gorgo sim runs a mesh", t.Name)
	}
	raw, src, err := wl.raw()
	if err != nil {
		return err
	}
	if err := wl.served(reps, raw); err != nil {
		return err
	}
	params, err := pf.describeParams()
	if err != nil {
		return err
	}
	for _, p := range checked {
		if o, ok := p.(*tune.Online); ok {
			params += fmt.Sprintf("; %s tunes %s for %s", o.Name(), o.Base(), o.Objective())
			break
		}
	}
	fmt.Fprintf(stdout, "topology: %s\n%s\n", describeFleet(t, reps), params)

	var evals []*evalWindow
	type job struct{ w, p int }
	var jobs []job
	var cfgs []sim.Config
	for i, win := range wins {
		for _, scale := range scales {
			reqs, desc, err := cut(raw, src, windows[i], win, scale)
			if err != nil {
				return err
			}
			ew := &evalWindow{Window: windows[i], TimeScale: scale, desc: desc, Runs: make([]report.Run, len(names)), ttfts: make([]report.Series, len(names))}
			if ew.Window == "" {
				ew.Window = "all"
			}
			evals = append(evals, ew)
			cfgs = append(cfgs, pf.router(sim.Config{Replicas: reps, Requests: reqs, MaxInflight: ff.maxInflight, Seed: wl.seed, Events: ff.events, ScoreFrom: ff.scoreFrom, GoodputSLO: *goodputSLO, GoodputTPOT: *goodputTPOT}))
			for p := range names {
				jobs = append(jobs, job{len(evals) - 1, p})
			}
		}
	}
	start := time.Now()
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for _, j := range jobs {
		g.Go(func() error {
			pols, err := pf.policies(names[j.p], &tf, wl.seed) // a fresh instance per run
			if err != nil {
				return err
			}
			c := cfgs[j.w]
			c.Policy = pols[0]
			res, err := sim.Run(c)
			if err != nil {
				return fmt.Errorf("%s on window %s: %w", names[j.p], evals[j.w].Window, err)
			}
			ew := evals[j.w]
			ew.Runs[j.p] = res.Run
			s := report.Series{Name: names[j.p]}
			for _, r := range res.Scored {
				if !r.Failed {
					s.Values = append(s.Values, r.TTFT)
				}
			}
			ew.ttfts[j.p] = s
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for i, ew := range evals {
		fmt.Fprintf(stdout, "\n%s\n", ew.desc)
		if err := writeEvalTable(stdout, ew.Runs); err != nil {
			return err
		}
		if *plots != "" {
			path := fmt.Sprintf("%s-%d-ts%g.png", *plots, i/len(scales)+1, ew.TimeScale)
			title := fmt.Sprintf("TTFT, window %s, time scale %g", ew.Window, ew.TimeScale)
			switch err := report.PlotCDF(path, title, "TTFT (ms, log scale)", ew.ttfts); {
			case errors.Is(err, report.ErrNothingToPlot):
				_ = os.Remove(path) // an earlier run's plot would read as this one's
				fmt.Fprintf(stdout, "no plot for %s: %v\n", path, err)
			case err != nil:
				return err
			default:
				fmt.Fprintf(stdout, "wrote %s\n", path)
			}
		}
	}
	fmt.Fprintf(stderr, "evaluated %d runs in %v\n", len(jobs), time.Since(start).Round(time.Millisecond)) // stderr: stdout is the same for the same seed
	if *jsonOut != "" {
		return writeJSON(*jsonOut, provenance(args, wl.seed, src, describeFleet(t, reps), "windows", evals))
	}
	return nil
}

func parseSweep(s string) ([]float64, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k != "time-scale" {
		return nil, fmt.Errorf("--sweep: want time-scale=S1,S2,..., got %q", s)
	}
	var out []float64
	for _, f := range splitList(v) {
		x, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, fmt.Errorf("--sweep: time scale %q is not a number", f)
		}
		out = append(out, x)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--sweep: no time scale given")
	}
	return out, nil
}

// writeEvalTable prints the paper's table: TTFT and E2E percentiles, ITL,
// the client's scheduling slip (time a request waited because 64 were in
// flight, which TTFT does not include), the change of p95 TTFT and p95 E2E
// against simple-session-affinity, and the share of requests per replica.
func writeEvalTable(w io.Writer, runs []report.Run) error {
	var base *report.Run
	for i := range runs {
		if runs[i].Policy == baseline {
			base = &runs[i]
		}
	}
	delta := func(v, b float64) string {
		if base == nil || b == 0 {
			return "-"
		}
		return fmt.Sprintf("%+.1f%%", 100*(v-b)/b)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tfail\tTTFT p50\tp95\tp99\tE2E p50\tp95\tp99\tITL mean\tslip p95\tΔTTFT p95\tΔE2E p95\thit\tshare\t")
	for _, r := range runs {
		var bt, be float64
		if base != nil {
			bt, be = base.TTFT.P95, base.E2E.P95
		}
		lat := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
		if r.Completed == 0 {
			lat = func(float64, int) string { return "-" } // no latency, not a perfect one
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%s\t%s\t%.1f%%\t%s\t\n",
			r.Policy, r.Failed, lat(r.TTFT.P50, 0), lat(r.TTFT.P95, 0), lat(r.TTFT.P99, 0), lat(r.E2E.P50, 0), lat(r.E2E.P95, 0), lat(r.E2E.P99, 0), lat(r.ITL.Mean, 1), r.Slip.P95,
			delta(r.TTFT.P95, bt), delta(r.E2E.P95, be), 100*r.CacheHitRatio, shortShares(r.ReplicaShare))
	}
	return tw.Flush()
}

func shortShares(m map[string]float64) string {
	var b strings.Builder
	for _, id := range sortedKeys(m) {
		fmt.Fprintf(&b, "%s %.0f%% ", id, 100*m[id])
	}
	return strings.TrimSpace(b.String())
}
