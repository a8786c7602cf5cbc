package main

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/sim"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// workloadFlags select and shape the workload of sim, tune and eval.
type workloadFlags struct {
	file      string
	format    string
	preset    string
	duration  time.Duration
	window    string
	timeScale float64
	seed      uint64
	// models mixes models into the workload (see trace.AssignModels);
	// tenants mixes tenants and priorities (trace.AssignTenants); only
	// keeps one tenant's requests (its solo run).
	models, tenants, only string
	// spread moves requests that share an arrival time apart (trace.Spread).
	spread bool
	mix    []trace.TenantShare // tenants parsed (see tenantMix)
}

// tenantMix is --tenants parsed, once (nil without it).
func (w *workloadFlags) tenantMix() ([]trace.TenantShare, error) {
	if w.tenants == "" || w.mix != nil {
		return w.mix, nil
	}
	mix, err := trace.ParseTenants(w.tenants)
	if err != nil {
		return nil, fmt.Errorf("--tenants: %w", err)
	}
	w.mix = mix
	return mix, nil
}

// register defines the flags; eval defines its own repeatable --window, so
// it passes withWindow false.
func (w *workloadFlags) register(fs *flag.FlagSet, withWindow bool) {
	fs.StringVar(&w.file, "trace", "", "workload trace `FILE` (JSON Lines, or Azure's or BurstGPT's CSV); without it, the embedded synthetic workload")
	fs.StringVar(&w.format, "format", "auto", "trace format: auto (detected), mooncake, gorgo, azure (Azure LLM inference CSV) or burstgpt (BurstGPT CSV)")
	fs.StringVar(&w.preset, "preset", "artchat", "synthetic workload when no --trace: "+joinNames(trace.Presets()))
	fs.DurationVar(&w.duration, "duration", 30*time.Minute, "length of the synthetic workload")
	if withWindow {
		fs.StringVar(&w.window, "window", "", "part of the trace to use, as `START,DURATION` Go durations (e.g. 0s,30m); default all")
	}
	fs.Float64Var(&w.timeScale, "time-scale", 1, "multiply inter-arrival gaps by `F` (2 = half the request rate)")
	fs.Uint64Var(&w.seed, "seed", 1, "random seed (the synthetic workload and its draws of models and tenants; in the simulator also the network's jitter, the policies and the tuner)")
	fs.StringVar(&w.tenants, "tenants", "", "mix tenants into the workload: each session belongs to one tenant, drawn by share from `NAME:PRIORITY:SHARE[:SLO],...` (priority interactive, standard, batch, sheddable or an integer; SLO the TTFT SLO the tenant's requests are held to instead of the run's; e.g. chat:interactive:0.7:1s,batch:batch:0.3)")
	fs.StringVar(&w.only, "tenant-only", "", "keep only this `TENANT`'s requests (its solo run, to compare with the mixed one)")
	fs.BoolVar(&w.spread, "spread-ticks", false, "spread the requests that share an arrival time at random over the gap to the next one, keeping their order: a trace recorded in coarse ticks (Mooncake's are 3 s) otherwise arrives in synchronised bursts ('gorgo trace stats' shows how many share)")
	fs.StringVar(&w.models, "models", "", "mix models into the workload: each session names one model, drawn by weight from `NAME:W,NAME:W,...` (replacing the trace's models; in the simulator a replica's models are its topology's models: and adapters:)")
}

// ownSLOs reports whether a tenant of --tenants has a TTFT SLO of its own
// (a fourth field). Where one is held to its own, the other tenants'
// requests need the run's; gorgo sim, eval and demo say which flag gives
// it, and commands that hold requests to no SLO refuse the field.
func (w *workloadFlags) ownSLOs() (bool, error) {
	mix, err := w.tenantMix()
	if err != nil {
		return false, err
	}
	for _, t := range mix {
		if t.SLO > 0 {
			return true, nil
		}
	}
	return false, nil
}

// needSLO refuses tenants' own TTFT SLOs unless has (what gives the run's
// SLO, named by what, is set).
func (w *workloadFlags) needSLO(has bool, what string) error {
	own, err := w.ownSLOs()
	if err != nil || !own || has {
		return err
	}
	return fmt.Errorf("--tenants: a tenant's own TTFT SLO needs %s, the SLO of the run's other requests", what)
}

// noSLO refuses tenants' own TTFT SLOs in a command that holds requests to
// none (cmd names it).
func (w *workloadFlags) noSLO(cmd string) error {
	own, err := w.ownSLOs()
	if err != nil || !own {
		return err
	}
	return fmt.Errorf("--tenants: a tenant's own TTFT SLO is for gorgo sim, eval and demo; %s holds requests to none", cmd)
}

// raw reads or generates the whole workload, mixes models into it
// (--models), and describes its source.
func (w *workloadFlags) raw() ([]trace.Request, string, error) {
	var mix []trace.ModelWeight
	if w.models != "" {
		var err error
		if mix, err = trace.ParseModelWeights(w.models); err != nil {
			return nil, "", fmt.Errorf("--models: %w", err)
		}
	}
	tenants, err := w.tenantMix()
	if err != nil {
		return nil, "", err
	}
	var (
		reqs []trace.Request
		src  string
	)
	if w.file != "" {
		f, ferr := trace.ParseFormat(w.format)
		if ferr != nil {
			return nil, "", fmt.Errorf("--format: %w", ferr)
		}
		reqs, err = trace.ReadFile(w.file, f)
		src = w.file
	} else {
		if w.duration <= 0 {
			return nil, "", fmt.Errorf("--duration must be positive, got %v", w.duration)
		}
		reqs, err = trace.Generate(trace.GenConfig{Preset: w.preset, Seed: w.seed, Duration: w.duration})
		src = fmt.Sprintf("synthetic %s (%v, seed %d)", w.preset, w.duration, w.seed)
	}
	if err != nil {
		return nil, "", err
	}
	if w.spread {
		reqs = trace.Spread(reqs, w.seed)
		src += ", ticks spread"
	}
	if mix != nil {
		trace.AssignModels(reqs, mix, w.seed)
		src += ", models " + trace.FormatModelWeights(mix)
	}
	if tenants != nil {
		trace.AssignTenants(reqs, tenants, w.seed)
		src += ", tenants " + trace.FormatTenants(tenants)
	}
	if w.only != "" {
		reqs = trace.Tenant(reqs, w.only)
		src += ", tenant " + w.only + " alone"
	}
	return reqs, src, nil
}

// served fails where --models names a model no replica serves: every
// request for it would fail (a user's test, 2026-12-07: sim and eval
// counted 738 failures of 738 without a word; demo already refused).
func (w *workloadFlags) served(reps []sim.Replica, reqs []trace.Request) error {
	if w.models == "" {
		return nil
	}
	return checkServed(reps, reqs)
}

// load reads or generates the workload and applies the window and time scale.
// It returns the requests and a one-line description.
func (w *workloadFlags) load() ([]trace.Request, string, error) {
	win, err := parseWindow(w.window)
	if err != nil {
		return nil, "", err
	}
	if err := trace.ValidateScale(w.timeScale); err != nil {
		return nil, "", fmt.Errorf("--time-scale: %w", err)
	}
	reqs, src, err := w.raw()
	if err != nil {
		return nil, "", err
	}
	return cut(reqs, src, w.window, win, w.timeScale)
}

func parseWindow(s string) (trace.Window, error) {
	if s == "" {
		return trace.Window{}, nil
	}
	win, err := trace.ParseWindow(s)
	if err != nil {
		return win, fmt.Errorf("--window: %w", err)
	}
	return win, nil
}

// cut applies a window and a time scale and describes the result.
func cut(reqs []trace.Request, src, winText string, win trace.Window, scale float64) ([]trace.Request, string, error) {
	if len(reqs) == 0 {
		return nil, "", fmt.Errorf("%s has no requests", src)
	}
	reqs = trace.Apply(reqs, win, scale)
	if len(reqs) == 0 {
		return nil, "", fmt.Errorf("%s has no requests in window %s", src, winText)
	}
	desc := fmt.Sprintf("%s: %d requests over %v", src, len(reqs), reqs[len(reqs)-1].Time.Round(time.Second))
	if winText != "" {
		desc += ", window " + winText
	}
	if scale != 1 {
		desc += fmt.Sprintf(", time scale %g", scale)
	}
	return reqs, desc, nil
}

// fleetFlags select the fleet and the client of sim, tune and eval.
type fleetFlags struct {
	topology    string
	maxInflight int
	eventFlags  listFlag
	scoreFrom   time.Duration
	// events are the resolved fleet events (the topology's and the
	// flags'), set by load.
	events []sim.FleetEvent
}

func (f *fleetFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.topology, "topology", "paper", "fleet: "+joinNames(sim.TopologyNames())+", or a YAML `FILE`")
	fs.IntVar(&f.maxInflight, "max-inflight", sim.DefaultMaxInflight, "client cap on requests in flight (0 = none); beyond it requests wait and the wait is recorded as slip")
	fs.Var(&f.eventFlags, "fleet-event", "change the fleet during the run: `\"T drain|undrain|remove ID\"` or \"T add NAME region=R [profile=P] [speed=S] [models=A,B] [adapters=X,Y] [max_loras=N] [lora_load_time=D]\" (repeatable; T a duration of the run)")
	fs.DurationVar(&f.scoreFrom, "score-from", 0, "score only the requests that arrive this long into the run or later (run time: after --time-scale, so each scale of a --sweep scores from the same time, not the same requests); the earlier ones are routed and warm the fleet and any online tuner, unscored (0: all)")
}

// load resolves the fleet and its events.
func (f *fleetFlags) load() (sim.Topology, []sim.Replica, error) {
	t, err := sim.LoadTopology(f.topology)
	if err != nil {
		return t, nil, fmt.Errorf("--topology: %w", err)
	}
	reps, err := t.Resolve()
	if err != nil {
		return t, nil, fmt.Errorf("--topology: %w", err)
	}
	if f.maxInflight < 0 {
		return t, nil, fmt.Errorf("--max-inflight must not be negative")
	}
	if f.scoreFrom < 0 {
		return t, nil, fmt.Errorf("--score-from must not be negative")
	}
	var specs []sim.EventSpec
	for _, s := range f.eventFlags {
		e, err := sim.ParseEventSpec(s)
		if err != nil {
			return t, nil, fmt.Errorf("--fleet-event: %w", err)
		}
		specs = append(specs, e)
	}
	if f.events, err = t.ResolveEvents(specs); err != nil {
		if len(specs) == 0 {
			return t, nil, err // the topology's own events: the error names it
		}
		return t, nil, fmt.Errorf("fleet events (the topology's and --fleet-event): %w", err)
	}
	return t, reps, nil
}

func describeFleet(t sim.Topology, reps []sim.Replica) string {
	s := fmt.Sprintf("%s, router in %s:", t.Name, t.RouterRegion)
	for _, r := range reps {
		s += fmt.Sprintf(" %s (%s, rtt %v±%v%s)", r.ID, r.Profile.Name, r.RTT, r.Jitter, describeModels(r))
	}
	return s
}

// describeModels says what a replica serves, or "" when it serves any
// model.
func describeModels(r sim.Replica) string {
	if r.Models == nil {
		return ""
	}
	s := ", " + strings.Join(r.Models.Bases(), "+")
	if n := len(r.Models.Adapters()); n > 0 {
		s += fmt.Sprintf(" with %d adapters", n)
		if r.MaxLoRAs > 0 {
			s += fmt.Sprintf(", %d slots", r.MaxLoRAs)
		}
		if r.LoRALoadTime > 0 {
			s += fmt.Sprintf(", load %v", r.LoRALoadTime)
		}
	}
	return s
}

// describeEvents lists fleet events, one per line, or "".
func describeEvents(evs []sim.FleetEvent) string {
	var b strings.Builder
	for _, e := range evs {
		id := e.ID
		if e.Op == sim.OpAdd {
			id = fmt.Sprintf("%s (%s, %s, rtt %v%s)", e.Replica.ID, e.Replica.Region, e.Replica.Profile.Name, e.Replica.RTT, describeModels(e.Replica))
		}
		fmt.Fprintf(&b, "fleet event: at %v %s %s\n", e.At, e.Op, id)
	}
	return b.String()
}
