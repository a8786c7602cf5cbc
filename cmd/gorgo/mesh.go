package main

import (
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/sim"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// meshArrangements are what sim compares on a mesh topology by default.
var meshArrangements = []string{sim.ArrangeCentral, sim.ArrangeRegionLocal, "skywalker", "gorgo", "gorgo-ms", "default"}

// meshFlags configure a mesh run (a topology with a mesh section).
type meshFlags struct {
	sharing   string
	day       time.Duration
	amplitude float64
}

func (m *meshFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.sharing, "sharing", "local", "mesh topologies: what the routers tell each other, comma-separated `LIST` (each arrangement runs under each): local (nothing: each its own requests and scrapes), shared (their requests and prefix inserts, after the one-way delay between them), omniscient (the same, instantly)")
	fs.DurationVar(&m.day, "day", 0, "mesh topologies: period of the ingress regions' daily curves, shifted by their time zones (0: constant shares)")
	fs.Float64Var(&m.amplitude, "amplitude", 0.8, "mesh topologies: swing of the daily curves, in [0, 1]")
}

// runMeshSim is sim on a mesh topology: --policy lists arrangements
// (central, region-local, or a policy run by a router in every region).
func runMeshSim(args []string, stdout, stderr io.Writer, wl *workloadFlags, ff *fleetFlags, pf *policyFlags, tf *tuneFlags, mf *meshFlags, policies, jsonOut, records string, quiet bool, fs *flag.FlagSet) error {
	if err := checkWritable(jsonOut, records); err != nil {
		return err
	}
	for _, name := range []string{"ttft-slo", "admission", "admission-queue", "saturation-waiting", "tenant-weights", "unstreamed", "unstreamed-untold", "split"} {
		if isSet(fs, name) {
			return fmt.Errorf("--%s: not supported on a mesh topology yet", name)
		}
	}
	if !isSet(fs, "policy") {
		policies = strings.Join(meshArrangements, ",")
	}
	var sharings []sim.Sharing
	for _, s := range splitList(mf.sharing) {
		sh, err := sim.ParseSharing(s)
		if err != nil {
			return fmt.Errorf("--sharing: %w", err)
		}
		sharings = append(sharings, sh)
	}
	if len(sharings) == 0 {
		return fmt.Errorf("--sharing: none given")
	}
	if mf.day < 0 || !(mf.amplitude >= 0 && mf.amplitude <= 1) {
		return fmt.Errorf("--day must not be negative and --amplitude must be in [0, 1]")
	}
	if err := pf.check(); err != nil {
		return err
	}
	newPolicy := func(name, region string) (policy.Policy, error) {
		if name == tune.OnlineName {
			// Each region's router tunes on its own, as live, with its
			// own draws.
			h := fnv.New64a()
			h.Write([]byte(region))
			return tf.online(wl.seed^h.Sum64(), pf)
		}
		params, err := pf.paramsOf(name)
		if err != nil {
			return nil, err
		}
		return policy.New(name, policy.Options{Params: params, Region: region})
	}
	t, reps, err := ff.load()
	if err != nil {
		return err
	}
	if len(ff.events) > 0 {
		return fmt.Errorf("--fleet-event: not supported on a mesh topology yet")
	}
	reqs, desc, err := wl.load()
	if err != nil {
		return err
	}
	if err := wl.served(reps, reqs); err != nil {
		return err
	}
	type run struct {
		label string
		mesh  *sim.Mesh
	}
	var runs []run
	for _, a := range splitList(policies) {
		a = policy.Canonical(a)
		if a != sim.ArrangeCentral && a != sim.ArrangeRegionLocal {
			if _, ok := policy.Lookup(a); !ok {
				return fmt.Errorf("--policy: unknown arrangement %q (valid: %s, %s, or a policy run in every region: %s)", a, sim.ArrangeCentral, sim.ArrangeRegionLocal, joinNames(policy.LiveNames()))
			}
		}
		for k, sh := range sharings {
			if a == sim.ArrangeCentral && k > 0 {
				break // one router: nothing to share
			}
			m, err := t.Arrangement(a, reps, sh, mf.day, mf.amplitude, newPolicy)
			if err != nil {
				return err
			}
			m.Label = a
			if a != sim.ArrangeCentral && len(sharings) > 1 {
				m.Label += "/" + sh.String()
			}
			runs = append(runs, run{m.Label, m})
		}
	}
	if !quiet {
		fmt.Fprintf(stdout, "workload: %s\n", desc)
		fmt.Fprintf(stdout, "mesh: %s: %s\n", t.Name, describeMesh(t, reps))
		if mf.day > 0 {
			fmt.Fprintf(stdout, "daily curves: a day is %v, amplitude %.2f, shifted by each region's time zone\n", mf.day, mf.amplitude)
		}
		fmt.Fprintln(stdout, "TTFT and E2E run from the client: its round trip to its router included")
	}
	prog := newProgress(stderr, "simulating", len(runs)*len(reqs), quiet)
	results := make([]*sim.Result, len(runs))
	start := time.Now()
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, r := range runs {
		g.Go(func() error {
			res, err := sim.Run(pf.router(sim.Config{Replicas: reps, Requests: reqs, Mesh: r.mesh,
				MaxInflight: ff.maxInflight, Seed: wl.seed, ScoreFrom: ff.scoreFrom, Progress: prog.add}))
			if err != nil {
				return fmt.Errorf("%s: %w", r.label, err)
			}
			results[i] = res
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	prog.finish()
	out := make([]report.Run, len(results))
	for i, r := range results {
		out[i] = r.Run
	}
	if err := report.WriteTable(stdout, out); err != nil {
		return err
	}
	if !quiet {
		fmt.Fprintf(stderr, "simulated %d arrangements in %v\n", len(runs), time.Since(start).Round(time.Millisecond)) // stderr: stdout is the same for the same seed
	}
	if jsonOut != "" {
		if err := writeJSON(jsonOut, provenance(args, wl.seed, desc, t.Name+": "+describeMesh(t, reps), "runs", out)); err != nil {
			return err
		}
	}
	return writeAllRecords(records, results)
}

func describeMesh(t sim.Topology, reps []sim.Replica) string {
	var parts []string
	for _, in := range t.Mesh.Ingress {
		parts = append(parts, fmt.Sprintf("clients %.0f%% in %s (UTC%+g)", 100*in.Share, in.Region, in.UTCOffset))
	}
	var ids []string
	for _, r := range reps {
		ids = append(ids, r.ID+" ("+r.Region+")")
	}
	return strings.Join(parts, ", ") + "; replicas " + strings.Join(ids, ", ")
}

// isSet reports whether a flag was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
