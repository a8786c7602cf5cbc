package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/sim"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

const tuneAbout = `
Tunes gorgo's weights on a window of a workload with a (1+1) evolution
strategy and writes them as JSON ({"rtt":X,"queue":Y}), with a convergence
plot (PNG).

--mode offline (default) replays the whole window from the same start state
for every candidate, so comparisons carry no noise (two candidates at a time,
one per core). --mode online runs the paper's procedure inside the simulated
router: live traffic alternates between the incumbent and a candidate every
--hop requests, and each is scored on --window-requests requests of its own.
A candidate is accepted only if it beats the incumbent on --objective and no
--guard rejects it.`

func runTune(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tune", "tune [flags] --out weights.json", tuneAbout, stderr)
	var wl workloadFlags
	wl.register(fs, true)
	var ff fleetFlags
	ff.register(fs)
	var pf policyFlags
	pf.register(fs)
	var tf tuneFlags
	tf.register(fs)
	mode := fs.String("mode", "offline", "offline or online")
	generations := fs.Int("generations", 30, "offline: generations of --workers candidates each")
	workers := fs.Int("workers", 2, "offline: candidates measured at once (the result depends on it, not on the machine)")
	out := fs.String("out", "", "write the tuned weights as JSON to `FILE` (required)")
	plotPath := fs.String("plot", "", "convergence plot `FILE` (PNG; default: --out with .png)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *out == "" {
		return fmt.Errorf("--out is required")
	}
	if *plotPath == "" {
		*plotPath = strings.TrimSuffix(*out, ".json") + ".png"
	}
	if err := checkWritable(*out, *plotPath); err != nil {
		return err
	}
	if *generations < 1 || *workers < 1 {
		return fmt.Errorf("--generations and --workers must be at least 1")
	}
	if *mode != "offline" && *mode != "online" {
		return fmt.Errorf("--mode: want offline or online, got %q", *mode)
	}
	if tf.base = policy.Canonical(tf.base); !policy.HasParams(tf.base) {
		return fmt.Errorf("--base: want a policy with parameters (%s), got %q", joinNames(policy.WithParams()), tf.base)
	}
	if _, err := pf.policies("round-robin", &tf, wl.seed); err != nil { // validates the signal flags
		return err
	}
	cfg, err := tf.config(wl.seed)
	if err != nil {
		return err
	}
	if err := wl.noSLO("gorgo tune"); err != nil {
		return err
	}
	if cfg.Objective == tune.SLOP95 {
		return fmt.Errorf("--objective slo-p95 judges requests held to SLOs: tune it online (gorgo sim or gorgo eval with --live-tuner and --ttft-slo or --goodput-slo, or gorgo serve with ttft_slo)")
	}
	if err := tune.CheckParams(tf.base, cfg.Params); err != nil {
		return fmt.Errorf("--param: %w", err)
	}
	baseParams, err := pf.paramsOf(tf.base)
	if err != nil {
		return err
	}
	// The tuner's own checks (the objective, the bounds; online, the
	// blocks) before any output, not after the workload's header.
	if *mode == "online" {
		if _, err := tf.onlineWith(cfg, baseParams, false); err != nil {
			return err
		}
	} else if _, err := tune.NewES(cfg); err != nil {
		return err
	}
	t, reps, err := ff.load()
	if err != nil {
		return err
	}
	if t.IsMesh() {
		return fmt.Errorf("--topology %s is a mesh (a router in several regions): gorgo tune runs one router; gorgo sim runs a mesh", t.Name)
	}
	reqs, desc, err := wl.load()
	if err != nil {
		return err
	}
	if err := wl.served(reps, reqs); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "workload: %s\ntopology: %s\n", desc, describeFleet(t, reps))
	fmt.Fprint(stdout, describeEvents(ff.events))
	base := pf.router(sim.Config{Replicas: reps, Requests: reqs, MaxInflight: ff.maxInflight, Seed: wl.seed, Events: ff.events, ScoreFrom: ff.scoreFrom})

	start := time.Now()
	var res tuneResult
	if *mode == "offline" {
		res, err = tuneOffline(stdout, base, cfg, &tf, baseParams, *generations, *workers)
	} else {
		res, err = tuneOnline(stdout, base, &tf, cfg, baseParams)
	}
	if err != nil {
		return err
	}
	info, _ := policy.Lookup(tf.base)
	fmt.Fprintf(stdout, "tuned %s weights %v in %v (%d candidates judged, %d accepted)\n",
		tf.base, info.Format(res.weights), time.Since(start).Round(time.Millisecond), len(res.steps), accepted(res.steps))
	file := map[string]any{policy.FileKey: policy.Canonical(tf.base)} // whose they are: gorgo's and gorgo-ms's have the same names
	for k, v := range res.weights {
		file[k] = v
	}
	if err := writeJSON(*out, file); err != nil {
		return err
	}
	conv := report.Convergence{
		Title:     fmt.Sprintf("gorgo tune --mode %s: %s", *mode, desc),
		Objective: strings.ToUpper(tf.objective[:3]) + " " + strings.ToUpper(tf.objective[4:]) + " (ms)",
	}
	names := []string{}
	for _, p := range res.es.Config().Params {
		names = append(names, p.Name)
		conv.Params = append(conv.Params, report.Series{Name: p.Name})
	}
	cur := res.start
	conv.Start = res.startScore
	for i := range names {
		conv.Params[i].Values = append(conv.Params[i].Values, cur[i])
	}
	for _, s := range res.steps {
		conv.Candidate = append(conv.Candidate, s.Score)
		conv.Incumbent = append(conv.Incumbent, s.Incumbent)
		conv.Accepted = append(conv.Accepted, s.Accepted)
		if s.Accepted {
			cur = s.Candidate
		}
		for i := range names {
			conv.Params[i].Values = append(conv.Params[i].Values, cur[i])
		}
	}
	if err := report.PlotConvergence(*plotPath, conv); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s and %s\n", *out, *plotPath)
	return nil
}

type tuneResult struct {
	es         *tune.ES
	start      tune.Point
	startScore float64
	steps      []tune.Outcome
	weights    policy.Values
}

func accepted(steps []tune.Outcome) int {
	n := 0
	for _, s := range steps {
		if s.Accepted {
			n++
		}
	}
	return n
}

func printStep(w io.Writer, es *tune.ES, n int, s tune.Outcome) {
	verdict := "accepted"
	if !s.Accepted {
		verdict = "rejected (" + s.Reason + ")"
	}
	fmt.Fprintf(w, "step %3d  candidate %-30s  score %8.1f  incumbent %8.1f  sigma %.3f  %s\n",
		n, es.Format(s.Candidate), s.Score, s.Incumbent, s.Sigma, verdict)
}

func tuneOffline(w io.Writer, base sim.Config, cfg tune.Config, tf *tuneFlags, baseW policy.Values, generations, workers int) (tuneResult, error) {
	es, err := tune.NewES(cfg) // for formatting only; Offline runs its own
	if err != nil {
		return tuneResult{}, err
	}
	eval := func(ctx context.Context, p tune.Point) (tune.Metrics, error) {
		pol, err := policy.New(tf.base, policy.Options{Params: tune.Apply(es, p, baseW)})
		if err != nil {
			return tune.Metrics{}, err
		}
		c := base
		c.Policy = pol
		res, err := sim.Run(c)
		if err != nil {
			return tune.Metrics{}, err
		}
		return tune.FromRun(res.Run), nil
	}
	n := 0
	res, err := tune.Offline(context.Background(), tune.OfflineConfig{ES: cfg, Generations: generations, Workers: workers}, eval, func(s tune.Outcome) {
		n++
		printStep(w, es, n, s)
	})
	if err != nil {
		return tuneResult{}, err
	}
	if m := res.Initial; m.N == m.Failed {
		return tuneResult{}, noneServed(m.N)
	}
	fmt.Fprintf(w, "initial %s: p95 TTFT %.1f ms, p95 E2E %.1f ms; best %s: p95 TTFT %.1f ms, p95 E2E %.1f ms\n",
		es.Format(es.Incumbent()), res.Initial.TTFTP95, res.Initial.E2EP95, es.Format(res.Best), res.BestMetrics.TTFTP95, res.BestMetrics.E2EP95)
	start, _ := cfg.Objective.Of(res.Initial)
	return tuneResult{es: es, start: es.Incumbent(), startScore: start, steps: res.Steps, weights: tune.Apply(es, res.Best, baseW)}, nil
}

// noneServed is a tuning run in which every one of n requests failed: no
// weights were judged (a user's test, 2026-12-07: weights were written,
// and the run said it had tuned them).
func noneServed(n int) error {
	return fmt.Errorf("all %d requests failed: no weights can be judged on this workload and fleet (nothing written)", n)
}

func tuneOnline(w io.Writer, base sim.Config, tf *tuneFlags, cfg tune.Config, baseW policy.Values) (tuneResult, error) {
	o, err := tf.onlineWith(cfg, baseW, false)
	if err != nil {
		return tuneResult{}, err
	}
	start := o.ES().Incumbent()
	c := base
	c.Policy = o
	run, err := sim.Run(c)
	if err != nil {
		return tuneResult{}, err
	}
	if r := run.Run; r.Requests == r.Failed {
		return tuneResult{}, noneServed(r.Requests)
	}
	steps := o.Steps()
	for i, s := range steps {
		printStep(w, o.ES(), i+1, s)
	}
	fmt.Fprintf(w, "while tuning: p95 TTFT %.1f ms, p95 E2E %.1f ms over %d requests\n", run.Run.TTFT.P95, run.Run.E2E.P95, run.Run.Requests)
	return tuneResult{es: o.ES(), start: start, startScore: math.NaN(), steps: steps, weights: o.Incumbent()}, nil
}
