package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/sim"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

const simAbout = `
Simulates a router in front of engine replicas over a workload, once per
listed policy on the same workload and network, and prints a comparison.
TTFT and E2E run from a request's arrival at the router to its first and last
token back there. Without --trace it uses the embedded synthetic workload.`

func runSim(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim", "sim [flags]", simAbout, stderr)
	var wl workloadFlags
	wl.register(fs, true)
	var ff fleetFlags
	ff.register(fs)
	policies := fs.String("policy", strings.Join(policy.Compared(), ","), "comma-separated `POLICIES` to compare: "+joinNames(policyNames()))
	var pf policyFlags
	pf.register(fs)
	var tf tuneFlags
	tf.registerSim(fs)
	jsonOut := fs.String("json", "", "write the run summaries as JSON to `FILE`")
	records := fs.String("records", "", "write per-request records as JSONL to `FILE` (the policy name is inserted before the extension when several run)")
	quiet := fs.Bool("quiet", false, "no progress or header lines")
	var af admissionFlags
	af.register(fs)
	var mf meshFlags
	mf.register(fs)
	unstreamed := fs.Float64("unstreamed", 0, "share of requests whose answers are not streamed: the router sees no first token for them (0 to 1); their TTFT and ITL are still reported as the engine makes them, which their clients do not see (gorgo replay --unstreamed reports TTFT = E2E)")
	untold := fs.Bool("unstreamed-untold", false, "with --unstreamed: the router is not told which answers are not streamed, and keeps their prefill in the backlog until they end (a router before issue 20)")
	split := fs.String("split", "", "also print a table per part of the run, split at these comma-separated `TIMES` of arrival (e.g. 10m,15m: before, during and after a drain)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	tf.parsed(fs)
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	t, _ := sim.LoadTopology(ff.topology)
	own, err := wl.ownSLOs()
	if err != nil {
		return err
	}
	if own && t.IsMesh() {
		return fmt.Errorf("--tenants: a tenant's own TTFT SLO is not supported on a mesh topology yet")
	}
	if err := tf.runSLO(&wl, af.slo > 0, "--ttft-slo"); err != nil {
		return err
	}
	if t.IsMesh() {
		return runMeshSim(args, stdout, stderr, &wl, &ff, &pf, &tf, &mf, *policies, *jsonOut, *records, *quiet, fs)
	}
	for _, name := range []string{"sharing", "day", "amplitude"} {
		if isSet(fs, name) {
			return fmt.Errorf("--%s is for a mesh topology (a router in several regions: paper-mesh, paper-mesh-2, or mesh: in a topology file)", name)
		}
	}
	modes, err := af.modes()
	if err != nil {
		return err
	}
	// One fresh set of policies per admission mode: policies keep state.
	var pols []policy.Policy
	var runModes []admit.Config
	for _, m := range modes {
		ps, err := pf.policies(*policies, &tf, wl.seed)
		if err != nil {
			return err
		}
		pols = append(pols, ps...)
		for range ps {
			runModes = append(runModes, m)
		}
	}
	if *untold && *unstreamed == 0 {
		return fmt.Errorf("--unstreamed-untold is for the answers --unstreamed makes unstreamed: give --unstreamed SHARE")
	}
	if !(*unstreamed >= 0 && *unstreamed <= 1) {
		return fmt.Errorf("--unstreamed must be between 0 and 1, got %v", *unstreamed)
	}
	cuts, err := parseCuts(*split)
	if err != nil {
		return err
	}
	if err := checkWritable(*jsonOut, *records); err != nil {
		return err
	}
	t, reps, err := ff.load()
	if err != nil {
		return err
	}
	reqs, desc, err := wl.load()
	if err != nil {
		return err
	}
	if err := wl.served(reps, reqs); err != nil {
		return err
	}
	if !*quiet {
		fmt.Fprintf(stdout, "workload: %s\n", desc)
		if af.slo > 0 {
			fmt.Fprintf(stdout, "TTFT SLO %v: goodput is requests per second that met it; +queue holds, +reject refuses a request predicted to miss it\n", af.slo)
		}
		fmt.Fprintf(stdout, "topology: %s\n", describeFleet(t, reps))
		fmt.Fprint(stdout, describeEvents(ff.events))
	}

	prog := newProgress(stderr, "simulating", len(pols)*len(reqs), *quiet)
	results := make([]*sim.Result, len(pols))
	start := time.Now()
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, p := range pols {
		g.Go(func() error {
			res, err := sim.Run(pf.router(sim.Config{
				Replicas:         reps,
				Requests:         reqs,
				Policy:           p,
				MaxInflight:      ff.maxInflight,
				Seed:             wl.seed,
				Progress:         prog.add,
				Events:           ff.events,
				ScoreFrom:        ff.scoreFrom,
				Unstreamed:       *unstreamed,
				UnstreamedUntold: *untold,
				Admission:        runModes[i],
				GoodputSLO:       af.slo,
			}))
			if err != nil {
				return fmt.Errorf("policy %s: %w", p.Name(), err)
			}
			if len(modes) > 1 || runModes[i].SLO > 0 {
				res.Policy = af.label(p.Name(), runModes[i])
				res.Run.Policy = res.Policy
			}
			results[i] = res
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	prog.finish()
	runs := make([]report.Run, len(results))
	for i, r := range results {
		runs[i] = r.Run
	}
	if err := report.WriteTable(stdout, runs); err != nil {
		return err
	}
	if !*quiet {
		fmt.Fprintf(stderr, "simulated %d policies in %v\n", len(pols), time.Since(start).Round(time.Millisecond)) // stderr: stdout is the same for the same seed
	}
	if err := writeSplit(stdout, results, cuts); err != nil {
		return err
	}
	if err := writeTenants(stdout, results, af.slo); err != nil {
		return err
	}
	for _, p := range pols {
		if o, ok := p.(*tune.Online); ok {
			judged, won := o.Counts()
			fmt.Fprintf(stdout, "%s (%s): %d candidates judged, %d accepted; final weights %s\n", o.Name(), o.Objective(), judged, won, policy.Format(o.Base(), o.Incumbent()))
			if n, why := o.Resets(); n > 0 {
				fmt.Fprintf(stdout, "%s: back to its starting weights %d times (the last: %s)\n", o.Name(), n, why)
			}
		}
	}
	if *jsonOut != "" {
		if err := writeJSON(*jsonOut, provenance(args, wl.seed, desc, describeFleet(t, reps), "runs", runs)); err != nil {
			return err
		}
	}
	return writeAllRecords(*records, results)
}

// writeAllRecords writes each run's per-request records to path (none
// when empty), the run's name inserted before the extension when there
// are several.
func writeAllRecords(path string, results []*sim.Result) error {
	if path == "" {
		return nil
	}
	for _, r := range results {
		p := path
		if len(results) > 1 {
			p = insertBeforeExt(path, r.Policy)
		}
		if err := writeRecords(p, r.Records); err != nil {
			return err
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func joinNames(names []string) string { return strings.Join(names, ", ") }

func insertBeforeExt(path, tag string) string {
	dot := strings.LastIndexByte(path, '.')
	if dot <= strings.LastIndexByte(path, '/') {
		return path + "." + tag
	}
	return path[:dot] + "." + tag + path[dot:]
}

// checkWritable fails at once, before a long run, for an output path that
// cannot be written. It leaves no file behind that was not there.
func checkWritable(paths ...string) error {
	for _, p := range paths {
		if p == "" {
			continue
		}
		_, statErr := os.Stat(p)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("cannot write %s: %w", p, err)
		}
		f.Close()
		if os.IsNotExist(statErr) {
			os.Remove(p)
		}
	}
	return nil
}

// provenance is a JSON output with what made it: the command's arguments,
// the seed, the workload and the fleet as the output's header gave them,
// and the build (a researcher's doubt, 2026-12-06: the files said none of
// it), beside key's value.
func provenance(args []string, seed uint64, workload, fleet, key string, v any) map[string]any {
	out := map[string]any{"args": args, "seed": seed, "workload": workload, "fleet": fleet, key: v}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				out["revision"] = s.Value
			}
		}
	}
	return out
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func writeRecords(path string, recs []report.Record) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing records: %w", err)
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for i := range recs {
		if err := enc.Encode(&recs[i]); err != nil {
			f.Close()
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// progress draws a progress line on a terminal; elsewhere it stays silent.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	total int
	sum   int
	on    bool
	last  time.Time
}

func newProgress(w io.Writer, label string, total int, quiet bool) *progress {
	on := false
	if f, ok := w.(*os.File); ok && !quiet {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			on = true
		}
	}
	return &progress{w: w, label: label, total: total, on: on}
}

// add is a sim.Config.Progress callback; several runs may call it at once.
func (p *progress) add(finished int) {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sum += finished
	if time.Since(p.last) < 200*time.Millisecond {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "\r%s: %3.0f%%", p.label, 100*float64(min(p.sum, p.total))/float64(p.total))
}

func (p *progress) finish() {
	if p.on {
		fmt.Fprint(p.w, "\r                 \r")
	}
}

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// parseCuts reads --split: increasing durations.
func parseCuts(s string) ([]time.Duration, error) {
	var cuts []time.Duration
	for _, f := range splitList(s) {
		d, err := time.ParseDuration(f)
		if err != nil || d <= 0 || (len(cuts) > 0 && d <= cuts[len(cuts)-1]) {
			return nil, fmt.Errorf("--split: want increasing positive durations like 10m,15m, got %q", s)
		}
		cuts = append(cuts, d)
	}
	return cuts, nil
}

// writeSplit prints, for each part of the run between cuts, the runs of
// the requests that arrived in it.
func writeSplit(w io.Writer, results []*sim.Result, cuts []time.Duration) error {
	if len(cuts) == 0 {
		return nil
	}
	bounds := append([]time.Duration{0}, cuts...)
	for k, lo := range bounds {
		hi := time.Duration(math.MaxInt64)
		label := fmt.Sprintf("arrivals from %v", lo)
		if k+1 < len(bounds) {
			hi = bounds[k+1]
			label = fmt.Sprintf("arrivals in [%v, %v)", lo, hi)
		}
		runs := make([]report.Run, len(results))
		for i, res := range results {
			var part []report.Record
			for _, rec := range res.Records {
				if at := time.Duration(rec.Arrival * float64(time.Millisecond)); at >= lo && at < hi {
					part = append(part, rec)
				}
			}
			runs[i] = report.NewRun(res.Policy, part, slices.Collect(maps.Keys(res.Run.ReplicaShare)))
		}
		fmt.Fprintf(w, "\n%s:\n", label)
		if err := report.WriteTable(w, runs); err != nil {
			return err
		}
	}
	return nil
}

// admissionFlags configure admission under a TTFT SLO.
type admissionFlags struct {
	slo        time.Duration
	mode       string
	maxQueue   int
	satWaiting int
	weights    string
}

func (a *admissionFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&a.slo, "ttft-slo", 0, "TTFT SLO: a request predicted to miss it is held or refused (see --admission), and the table reports goodput, requests per second that met it (0: none); a tenant's own SLO (--tenants) replaces it for that tenant's requests")
	fs.StringVar(&a.mode, "admission", "", "what a request predicted to miss --ttft-slo gets: queue (held in a bounded router-side queue, the default), reject (429 at once) or none (only goodput is reported); a comma-separated list runs each policy under each")
	fs.IntVar(&a.maxQueue, "admission-queue", 1024, "bound of the router-side queue, requests")
	fs.IntVar(&a.satWaiting, "saturation-waiting", 0, "with --ttft-slo: the fleet is saturated for batch and sheddable requests when every replica has more than this many requests waiting for their first token; they then wait (sheddable ones are refused) and go only where no more wait (-1: held only when predicted to miss the SLO)")
	fs.StringVar(&a.weights, "tenant-weights", "", "tenants' weights in fair shares within a band, `NAME:W,...` (default 1)")
}

// modes are the admission configs to run, one per listed mode.
func (a *admissionFlags) modes() ([]admit.Config, error) {
	if a.slo < 0 {
		return nil, fmt.Errorf("--ttft-slo must not be negative")
	}
	if a.slo == 0 {
		if a.mode != "" {
			return nil, fmt.Errorf("--admission needs --ttft-slo")
		}
		return []admit.Config{{}}, nil
	}
	names := splitList(a.mode)
	if len(names) == 0 {
		names = []string{string(admit.ModeQueue)}
	}
	var out []admit.Config
	for _, n := range names {
		if n == "none" {
			out = append(out, admit.Config{})
			continue
		}
		m, err := admit.ParseMode(n)
		if err != nil {
			return nil, fmt.Errorf("--admission: %w (or none)", err)
		}
		c := admit.Config{SLO: a.slo, Mode: m, MaxQueue: a.maxQueue, SaturationWaiting: a.satWaiting}
		if a.weights != "" {
			ws, err := parseTenantWeights(a.weights)
			if err != nil {
				return nil, fmt.Errorf("--tenant-weights: %w", err)
			}
			c.Weights = ws
		}
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("--admission-queue, --tenant-weights: %w", err)
		}
		out = append(out, c)
	}
	return out, nil
}

// label names a run: the policy, and its admission mode if any.
func (a *admissionFlags) label(policy string, c admit.Config) string {
	if c.SLO <= 0 {
		return policy
	}
	return policy + "+" + string(c.Mode)
}

// writeTenants prints a table per run by tenant, when the workload has
// tenants.
func writeTenants(w io.Writer, results []*sim.Result, slo time.Duration) error {
	if len(results) == 0 || !slices.ContainsFunc(results[0].Records, func(r report.Record) bool { return r.Tenant != "" }) {
		return nil
	}
	fmt.Fprintln(w, "\nby tenant (token share: of the prompt and output tokens served):")
	for _, r := range results {
		if err := report.WriteTenants(w, r.Policy, report.ByTenant(r.Scored, float64(slo)/1e6), float64(slo)/1e6); err != nil {
			return err
		}
	}
	return nil
}

// parseTenantWeights reads --tenant-weights' NAME:W,...: each tenant once,
// its weight a positive number (a user's test, 2026-12-07: read as a
// model mix, "a:x" was a tenant "a:x" of weight 1, and errors spoke of
// models).
func parseTenantWeights(s string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, item := range strings.Split(s, ",") {
		name, w, ok := strings.Cut(strings.TrimSpace(item), ":")
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want TENANT:WEIGHT", item)
		}
		v, err := strconv.ParseFloat(w, 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("tenant %s: the weight must be a positive number, got %q", name, w)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("tenant %s named twice", name)
		}
		out[name] = v
	}
	return out, nil
}
