package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/netem"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/replay"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/serve"
	"github.com/gorgo-llm/gorgo/internal/sim"
	"github.com/gorgo-llm/gorgo/internal/tenant"
	"github.com/gorgo-llm/gorgo/internal/trace"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

const demoAbout = `
Runs the whole system live on this machine, no GPU needed: for each policy, a
fleet of emulated replicas in the paper's three regions (each behind its
region's round trip, injected on every byte), gorgo's proxy in front of them,
and the replayer sending the embedded workload through it. The model and the
network run --speedup times faster than real time, so a few minutes of traffic
take seconds; times are reported back in real time (multiplied by the
speedup). Each policy gets a fresh fleet, one after another, on the same
workload; the simulator's prediction for the same runs is printed beside.
With --topology and --models, the fleet is a topology's (each replica serving
its models and LoRA adapters, as gorgo engine does) and the workload a mix of
models; with adapters, the tables give how often a request found its adapter
resident.`

func runDemo(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "demo [flags]", demoAbout, stderr)
	duration := fs.Duration("duration", 2*time.Minute, "length of the workload (real time)")
	// On a 2-core machine every millisecond the machine adds is speedup
	// in model time: at 10 the emulated fleet under load fell behind the
	// simulator by more than timing noise, and at 5 the default policy's
	// live p95 sat 8.5% above the simulator's median (at 3, −0.9%); the
	// mesh demo's arrangements centred at 5 (docs/results.md, part 10).
	speedup := fs.Float64("speedup", 3, "run model and network this many times faster than real time (5 with --mesh unless given)")
	policies := fs.String("policy", "default,gorgo,simple-session-affinity,round-robin", "comma-separated `POLICIES` to run: "+joinNames(policy.LiveNames()))
	timeScale := fs.Float64("time-scale", 1, "multiply the workload's inter-arrival gaps by `F`")
	seed := fs.Uint64("seed", 1, "random seed")
	topology := fs.String("topology", "paper", "the emulated fleet: a built-in topology ("+strings.Join(sim.TopologyNames(), ", ")+") or a YAML file, e.g. examples/topologies/lora.yaml; each replica serves the models and adapters its topology gives")
	models := fs.String("models", "", "mix models into the workload: each session names one model, drawn by weight from `NAME:W,NAME:W,...` (the names the topology's replicas serve)")
	tenants := fs.String("tenants", "", "mix tenants into the workload, `NAME:PRIORITY:SHARE[:SLO],...` (e.g. chat:interactive:0.25:1s,batch:batch:0.75); the router trusts the replayer's X-Gorgo-Tenant and gives each tenant its priority and, with --ttft-slo and admission, its own TTFT SLO")
	only := fs.String("tenant-only", "", "keep only this `TENANT`'s requests (its solo run)")
	var af admissionFlags
	af.register(fs)
	maxInflight := fs.Int("max-inflight", sim.DefaultMaxInflight, "the replayer's cap on requests in flight (0 = none)")
	meshDemo := fs.Bool("mesh", false, "a router in every region instead: paper-mesh (clients 45/30/25% in the paper's three regions), central and region-local against the default policy in every region sharing state over NATS")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if !(*speedup >= 1 && *speedup <= 50) {
		return fmt.Errorf("--speedup must be between 1 and 50, got %v", *speedup)
	}
	if *maxInflight < 0 {
		return fmt.Errorf("--max-inflight must not be negative")
	}
	if *meshDemo {
		given := false
		fs.Visit(func(f *flag.Flag) { given = given || f.Name == "speedup" })
		if !given {
			*speedup = 5
		}
		if *topology != "paper" || *models != "" || *tenants != "" || af.slo != 0 {
			return fmt.Errorf("--mesh runs its own fleet: --topology, --models, --tenants and --ttft-slo are for the single-router demo")
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return runDemoMesh(ctx, stdout, *duration, *speedup, *timeScale, *seed)
	}
	names := splitList(*policies)
	seen := map[string]bool{}
	for _, n := range names {
		if _, err := policy.New(n, policy.Options{}); err != nil {
			return fmt.Errorf("--policy: %w", err)
		}
		c := policy.Canonical(n)
		if seen[c] {
			return fmt.Errorf("--policy: %s named twice", c) // as sim and eval say
		}
		seen[c] = true
		if info, _ := policy.Lookup(n); info.SimOnly {
			// Refused now, not after the policies before it have run.
			return fmt.Errorf("--policy: %s runs only in the simulator (valid here: %s)", n, joinNames(policy.LiveNames()))
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("--policy: no policy given")
	}
	top, err := sim.LoadTopology(*topology)
	if err != nil {
		return fmt.Errorf("--topology: %w", err)
	}
	if top.IsMesh() {
		return fmt.Errorf("--topology %s is a mesh (a router in several regions): gorgo demo --mesh runs paper-mesh live", top.Name)
	}
	reps, err := top.Resolve()
	if err != nil {
		return fmt.Errorf("--topology: %w", err)
	}
	modes, err := af.modes()
	if err != nil {
		return err
	}
	if len(modes) != 1 {
		return fmt.Errorf("--admission: the demo runs one mode at a time")
	}
	flow := demoFlow{adm: modes[0], maxInflight: *maxInflight}
	if *tenants != "" {
		if flow.tenants, err = trace.ParseTenants(*tenants); err != nil {
			return fmt.Errorf("--tenants: %w", err)
		}
	}
	wl := workloadFlags{preset: "artchat", duration: *duration, timeScale: *timeScale, seed: *seed, models: *models, tenants: *tenants, only: *only, mix: flow.tenants}
	if err := wl.needSLO(flow.adm.SLO > 0, "--ttft-slo with --admission queue or reject (the live router holds a tenant's requests to its SLO by admission)"); err != nil {
		return err
	}
	reqs, desc, err := wl.load()
	if err != nil {
		return err
	}
	for _, r := range reps {
		if r.Models != nil && len(r.Models.Bases()) > 1 {
			return fmt.Errorf("--topology: replica %s serves %d base models; an emulated replica serves one (under several names, sharing one cache)", r.ID, len(r.Models.Bases()))
		}
	}
	if err := checkServed(reps, reqs); err != nil {
		return err
	}
	// The replayer sends at wall-clock times: the trace compressed by the speedup.
	wall := make([]trace.Request, len(reqs))
	copy(wall, reqs)
	for i := range wall {
		wall[i].Time = time.Duration(float64(wall[i].Time) / *speedup)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	fmt.Fprintf(stdout, "workload: %s\nfleet: %s\nspeedup: %gx (model and network)\n\n", desc, describeFleet(top, reps), *speedup)
	var live, predicted []report.Run
	var spreads []report.Spread
	var liveRecs, simRecs [][]report.Record
	for _, name := range names {
		fmt.Fprintf(stdout, "%-24s ", policy.Canonical(name))
		start := time.Now()
		run, recs, err := demoPolicy(ctx, stdout, name, reps, wall, *speedup, *seed, flow)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		live = append(live, run)
		liveRecs = append(liveRecs, recs)
		simulate := func(reqs []trace.Request, seed uint64) (report.Run, []report.Record, error) {
			pol, _ := policy.New(name, policy.Options{})
			res, err := sim.Run(sim.Config{Replicas: reps, Requests: reqs, Policy: pol, MaxInflight: *maxInflight, Seed: seed, Admission: flow.adm, GoodputSLO: flow.adm.SLO})
			return res.Run, res.Records, err
		}
		run0, recs0, err := simulate(reqs, *seed)
		if err != nil {
			return err
		}
		predicted = append(predicted, run0)
		simRecs = append(simRecs, recs0)
		spread, err := simulatedSpread(run0, reqs, *speedup, *seed, func(r []trace.Request, seed uint64) (report.Run, error) {
			run, _, err := simulate(r, seed)
			return run, err
		})
		if err != nil {
			return err
		}
		spreads = append(spreads, spread)
		fmt.Fprintf(stdout, "%d requests in %v\n", run.Requests, time.Since(start).Round(100*time.Millisecond))
	}
	fmt.Fprintln(stdout, "\nlive (emulated replicas behind gorgo's proxy, times in real-time ms):")
	if err := report.WriteTable(stdout, live); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "\nsimulated (the same workload and fleet in `gorgo sim`):")
	if err := report.WriteTable(stdout, predicted); err != nil {
		return err
	}
	if err := writeAgreement(stdout, live, predicted, spreads, *speedup); err != nil {
		return err
	}
	if flow.tenants == nil {
		return nil
	}
	slo := float64(flow.adm.SLO) / 1e6
	for k, pair := range [][][]report.Record{liveRecs, simRecs} {
		fmt.Fprintf(stdout, "\nby tenant, %s:\n", [...]string{"live", "simulated"}[k])
		for i, recs := range pair {
			if err := report.WriteTenants(stdout, live[i].Policy, report.ByTenant(recs, slo), slo); err != nil {
				return err
			}
		}
	}
	return nil
}

// demoParams are the live policy's parameters when model and network run
// speedup times faster than real time. gorgo's cost adds prompt tokens to
// w_rtt times the round trip in ms: the demo's round trips are speedup
// times shorter while tokens stay tokens, so its w_rtt is speedup times
// larger, and the live router weighs the network as the simulator does in
// model time. (At 5x with the paper's weights, the live router counted the
// network a fifth as much and ran 21% slower at p95 TTFT than simulated.)
// The other policies' costs are in ms throughout, their rates scaled with
// the model, or have no units to scale: nil.
func demoParams(name string, speedup float64) map[string]policy.Values {
	info, ok := policy.Lookup(name)
	if !ok || info.Name != "gorgo" {
		return nil
	}
	v := info.Defaults()
	v["rtt"] *= speedup
	return map[string]policy.Values{info.Name: v}
}

// demoTuner is the live policy when it is the paper's online tuner
// (gorgo-online, over gorgo): its candidates' w_rtt scaled as demoParams
// scales gorgo's, the search's start and bounds speedup times the
// simulator's, so that in log space the live tuner draws the simulator's
// candidates. nil for any other policy: the fleet builds it.
func demoTuner(name string, speedup float64) (policy.Policy, error) {
	if policy.Canonical(name) != tune.OnlineName {
		return nil, nil
	}
	params := tune.DefaultParams("gorgo")
	for i := range params {
		if params[i].Name == "rtt" {
			params[i].Min *= speedup
			params[i].Max *= speedup
			params[i].Init *= speedup
		}
	}
	return tune.NewOnline(tune.OnlineConfig{Base: "gorgo", BaseParams: demoParams("gorgo", speedup)["gorgo"], ES: tune.Config{Params: params}})
}

// tenantConfigs are the live router's tenants: each one's priority, its
// weight and, under admission, its own TTFT SLO in router time (the model
// runs speedup times faster).
func (f demoFlow) tenantConfigs(speedup float64) map[string]tenant.Config {
	out := map[string]tenant.Config{}
	for _, t := range f.tenants {
		c := tenant.Config{Priority: t.Priority, MaxPriority: t.Priority, Weight: f.adm.Weights[t.Name]}
		if f.adm.SLO > 0 {
			c.TTFTSLO = time.Duration(float64(t.SLO) / speedup)
		}
		out[t.Name] = c
	}
	return out
}

// demoFlow is the demo's flow control: its admission, and the tenants the
// router gives their priorities (nil: none).
type demoFlow struct {
	adm         admit.Config
	tenants     []trace.TenantShare
	maxInflight int
}

// demoPolicy brings up a fleet and a proxy with the named policy, replays
// the workload through it, tears everything down and returns the run with
// its times scaled back to real time.
func demoPolicy(ctx context.Context, view io.Writer, name string, reps []sim.Replica, reqs []trace.Request, speedup float64, seed uint64, flow demoFlow) (report.Run, []report.Record, error) {
	// A replica whose topology names no models serves every model the
	// workload names.
	var anyModel []string
	for _, q := range reqs {
		if q.Model != "" && !slices.Contains(anyModel, q.Model) {
			anyModel = append(anyModel, q.Model)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var cfg serve.Config
	var servers []*http.Server
	var ems []*emulator.Server
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	for k, r := range reps {
		ec := emulator.Config{Profile: r.Profile, Speedup: speedup, Seed: seed}
		if r.Models != nil {
			ec.ServedNames, ec.LoRAModules = r.Models.Bases(), r.Models.Adapters()
			ec.MaxLoRAs, ec.LoRALoadTime = r.MaxLoRAs, r.LoRALoadTime
			if ec.MaxLoRAs == 0 { // the simulator's engine default, not the emulated engine's
				ec.MaxLoRAs = engine.DefaultMaxLoRAs
			}
		} else {
			ec.ServedNames = anyModel // it serves any model, as in the simulator
		}
		em, err := emulator.New(ec)
		if err != nil {
			return report.Run{}, nil, err
		}
		ems = append(ems, em)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return report.Run{}, nil, err
		}
		link := netem.NewLink(time.Duration(float64(r.RTT)/speedup), time.Duration(float64(r.Jitter)/speedup), seed+uint64(k))
		hs := &http.Server{Handler: em.Handler()}
		servers = append(servers, hs)
		go em.Run(ctx)
		go hs.Serve(link.Listener(ln))
		cfg.Replicas = append(cfg.Replicas, fleet.ReplicaConfig{ID: r.ID, URL: "http://" + ln.Addr().String(), Region: r.Region,
			KVCapacityTokens: r.Profile.KVCapacityTokens, PrefillMSPerTok: r.Profile.PrefillMSPerToken() / speedup, QueueMSPerTok: r.Profile.QueueMSPerToken() / speedup,
			ITLMS: r.Profile.ITLMS() / speedup, ITLSlopeMS: r.Profile.ITLSlopeMS() / speedup})
	}
	// Probes and scrapes at the paper's 30 s, in model time.
	cfg.ProbeInterval = time.Duration(float64(30*time.Second) / speedup)
	cfg.ScrapeInterval = cfg.ProbeInterval
	cfg.Policy, cfg.Seed, cfg.Params = name, seed, demoParams(name, speedup)
	// Flow control, as in the simulator: the SLO in router time (the
	// model runs speedup times faster), the tenants and their priorities.
	if flow.adm.SLO > 0 {
		cfg.TTFTSLO = time.Duration(float64(flow.adm.SLO) / speedup)
		cfg.Admission, cfg.AdmissionQueue = flow.adm.Mode, flow.adm.MaxQueue
		cfg.SaturationWaiting = flow.adm.SaturationWaiting
	}
	if flow.tenants != nil {
		cfg.Proxy.TenantHeader = tenant.HeaderTrust
		cfg.Tenants = flow.tenantConfigs(speedup)
	}
	tuner, err := demoTuner(name, speedup)
	if err != nil {
		return report.Run{}, nil, err
	}
	px, err := serve.New(cfg, serve.Options{Proxy: true, Policy: tuner})
	if err != nil {
		return report.Run{}, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return report.Run{}, nil, err
	}
	px.Fleet.ProbeOnce(ctx)
	// The live view of each run, on an admin listener of its own.
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return report.Run{}, nil, err
	}
	fmt.Fprintf(view, "(live view: http://%s/admin/ui/) ", adminLn.Addr())
	go serveAll(ctx, px.Run, served{h: px.Proxy.Handler(), ln: ln}, served{h: px.Admin.Handler(), ln: adminLn})
	// The replayer's connections are opened first: the simulator does not
	// model their setup.
	out, err := replay.Run(ctx, replay.Config{Target: "http://" + ln.Addr().String(), Requests: reqs, MaxInflight: flow.maxInflight,
		Warm: max(flow.maxInflight, replay.DefaultMaxInflight)})
	if err != nil {
		return report.Run{}, nil, err
	}
	ids := make([]string, len(reps))
	for i, r := range reps {
		ids[i] = r.ID
	}
	for i := range out.Records {
		rec := &out.Records[i]
		rec.TTFT *= speedup
		rec.E2E *= speedup
		rec.ITL *= speedup
		rec.Slip *= speedup
		rec.Arrival *= speedup
	}
	run := report.NewRun(policy.Canonical(name), out.Records, ids)
	var adReqs, adLoads int64
	for _, em := range ems {
		g := em.Gauges()
		adReqs += g.AdapterRequests
		adLoads += g.AdapterLoads
	}
	run.ScoreAdapters(adReqs, adLoads)
	if flow.adm.SLO > 0 {
		span := 0.0
		for _, r := range out.Records {
			span = max(span, r.Arrival/1000)
		}
		run.ScoreSLO(out.Records, float64(flow.adm.SLO)/1e6, 0, span)
	}
	return run, out.Records, nil
}

// checkServed fails when a request names a model no replica serves: the
// demo would only count 404s.
func checkServed(reps []sim.Replica, reqs []trace.Request) error {
	var all []*models.Set
	for _, r := range reps {
		if r.Models == nil {
			return nil // it serves any model
		}
		all = append(all, r.Models)
	}
	served := models.Union(all...)
	for _, q := range reqs {
		if _, ok := served.Lookup(q.Model); q.Model != "" && !ok {
			return fmt.Errorf("--models: no replica of the topology serves %q (they serve %s)", q.Model, served)
		}
	}
	return nil
}

// The simulator's run is one draw of what the live run cannot reproduce:
// the network's jitter (each request's round trip, each probe's), the
// policy's random draws, and the arrivals' timing, which the live run
// shifts by the machine's scheduling noise, about demoNoise of wall clock
// (a policy that reacts to the order or the timing of arrivals, such as
// round-robin's rotation or a cost that reads the ledger, turns such
// differences into a different run). So the demo also simulates
// demoCopies copies of each run, each with its own seed and every arrival
// moved by up to demoNoise of the live clock (trace.Perturb), and shows
// where the live run falls against their median and range. (With the
// arrivals moved alone, the paper's gorgo, which decides on a few probes
// of each region's round trip, ran 8–10% below the range in four demos in
// a row: its simulated p95 TTFT spans 2,134–2,751 ms over the network's
// draws, docs/results.md.)
const (
	demoCopies = 16
	demoNoise  = time.Millisecond
)

// simulatedSpread is the spread of p95 TTFT over the simulated run run0
// (at seed) and demoCopies runs of simulate, each at another seed on
// perturbed copies of reqs.
func simulatedSpread(run0 report.Run, reqs []trace.Request, speedup float64, seed uint64, simulate func([]trace.Request, uint64) (report.Run, error)) (report.Spread, error) {
	spread := report.Spread{}.Add(run0.TTFT.P95)
	for k := range uint64(demoCopies) {
		run, err := simulate(trace.Perturb(reqs, time.Duration(speedup*float64(demoNoise)), seed+k+1), seed+k+1)
		if err != nil {
			return spread, err
		}
		spread = spread.Add(run.TTFT.P95)
	}
	return spread, nil
}

// writeAgreement prints the live runs' p95 TTFT against the simulated
// runs' and their copies' median and range.
func writeAgreement(w io.Writer, live, predicted []report.Run, spreads []report.Spread, speedup float64) error {
	fmt.Fprintf(w, "\nlive against simulated, p95 TTFT in ms; the median and range are the simulator's over the run above and %d\n"+
		"copies, each with other draws of the network's jitter and every arrival moved by up to ±%v (±%v of the live\n"+
		"clock): the live run is one more draw of each (policies that react to the order and timing of arrivals amplify them);\n"+
		"draws as far: how many of the simulated runs lie at least as far from their median as the live run:\n",
		demoCopies, time.Duration(speedup*float64(demoNoise)), demoNoise)
	return report.WriteAgreement(w, live, predicted, spreads)
}
