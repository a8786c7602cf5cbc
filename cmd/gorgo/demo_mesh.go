package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gorgo-llm/gorgo/internal/admin"
	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/mesh"
	"github.com/gorgo-llm/gorgo/internal/netem"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/replay"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/serve"
	"github.com/gorgo-llm/gorgo/internal/sim"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// meshDemo is one arrangement of the live mesh demo.
type meshDemo struct {
	label       string
	arrangement string
	sharing     sim.Sharing
}

// demoMeshArrangements are what `gorgo demo --mesh` runs.
var demoMeshArrangements = []meshDemo{
	{"central", sim.ArrangeCentral, sim.ShareNone},
	{"region-local", sim.ArrangeRegionLocal, sim.ShareNone},
	{"default, shared", policy.DefaultName, sim.ShareDelayed},
}

// runDemoMesh is `gorgo demo --mesh`: paper-mesh live, clients in every
// region, each arrangement on the same traffic, the simulator beside.
func runDemoMesh(ctx context.Context, stdout io.Writer, duration time.Duration, speedup, timeScale float64, seed uint64) error {
	top, err := sim.LoadTopology("paper-mesh")
	if err != nil {
		return err
	}
	reps, err := top.Resolve()
	if err != nil {
		return err
	}
	wl := workloadFlags{preset: "artchat", duration: duration, timeScale: timeScale, seed: seed}
	reqs, desc, err := wl.load()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "workload: %s\nmesh: %s: %s\nspeedup: %gx (model and network); TTFT and E2E from the client, its leg to its router included\n\n",
		desc, top.Name, describeMesh(top, reps), speedup)
	var live, predicted []report.Run
	var spreads []report.Spread
	for _, d := range demoMeshArrangements {
		newPolicy := func(name, region string) (policy.Policy, error) {
			return policy.New(name, policy.Options{Region: region})
		}
		m, err := top.Arrangement(d.arrangement, reps, d.sharing, 0, 0, newPolicy)
		if err != nil {
			return err
		}
		m.Label = d.label
		fmt.Fprintf(stdout, "%-24s ", d.label)
		start := time.Now()
		run, err := demoMeshLive(ctx, top, reps, m, reqs, speedup, seed)
		if err != nil {
			return fmt.Errorf("%s: %w", d.label, err)
		}
		live = append(live, run)
		// The simulator's prediction needs fresh policies, each time. Its
		// copies at other seeds place the clients as the live run does.
		placed := seed
		simulate := func(reqs []trace.Request, seed uint64) (report.Run, error) {
			m, err := top.Arrangement(d.arrangement, reps, d.sharing, 0, 0, newPolicy)
			if err != nil {
				return report.Run{}, err
			}
			m.Label, m.IngressSeed = d.label, &placed
			res, err := sim.Run(sim.Config{Replicas: reps, Requests: reqs, Mesh: m, Seed: seed})
			return res.Run, err
		}
		run0, err := simulate(reqs, seed)
		if err != nil {
			return err
		}
		predicted = append(predicted, run0)
		spread, err := simulatedSpread(run0, reqs, speedup, seed, simulate)
		if err != nil {
			return err
		}
		spreads = append(spreads, spread)
		fmt.Fprintf(stdout, "%d requests in %v\n", run.Requests, time.Since(start).Round(100*time.Millisecond))
	}
	fmt.Fprintln(stdout, "\nlive (emulated replicas, a gorgo proxy per router region, a replayer per client region; real-time ms):")
	if err := report.WriteTable(stdout, live); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "\nsimulated (the same workload and mesh in `gorgo sim --topology paper-mesh`):")
	if err := report.WriteTable(stdout, predicted); err != nil {
		return err
	}
	return writeAgreement(stdout, live, predicted, spreads, speedup)
}

// demoMeshLive brings up the mesh m live: one emulator per replica, with a
// listener per router region behind that pair's round trip; a proxy per
// router, with a listener per client region behind the client's leg; a
// replayer per client region. Times come back scaled to real time.
func demoMeshLive(ctx context.Context, top sim.Topology, reps []sim.Replica, m *sim.Mesh, reqs []trace.Request, speedup float64, seed uint64) (report.Run, error) {
	ctx, cancel := context.WithCancel(ctx)
	var servers []*http.Server
	var running sync.WaitGroup // the routers' and engines' loops
	var stopNATS func()
	defer func() {
		// Stop the loops first, then the servers and the bus they use.
		cancel()
		running.Wait()
		for _, s := range servers {
			s.Close()
		}
		if stopNATS != nil {
			stopNATS()
		}
	}()
	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) / speedup) }
	// listen serves h behind a link of round trip rtt ± jitter (real time).
	listen := func(h http.Handler, rtt, jitter time.Duration, k uint64) (string, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		hs := &http.Server{Handler: h}
		servers = append(servers, hs)
		go hs.Serve(netem.NewLink(scale(rtt), scale(jitter), seed+k).Listener(ln))
		return "http://" + ln.Addr().String(), nil
	}
	// Replicas: one engine each, reached from each router region through
	// its own link.
	urls := make([]map[string]string, len(reps)) // replica → router region → URL
	for i, r := range reps {
		em, err := emulator.New(emulator.Config{Profile: r.Profile, Speedup: speedup, Seed: seed})
		if err != nil {
			return report.Run{}, err
		}
		running.Add(1)
		go func() { defer running.Done(); em.Run(ctx) }()
		urls[i] = map[string]string{}
		for k, st := range m.Sites {
			rtt, jitter, err := m.RTT(st.Region, r.Region)
			if err != nil {
				return report.Run{}, err
			}
			if urls[i][st.Region], err = listen(em.Handler(), rtt, jitter, uint64(100*i+k)); err != nil {
				return report.Run{}, err
			}
		}
	}
	// The bus, for routers that share.
	var busURL string
	if m.Sharing != sim.ShareNone {
		url, stop, err := mesh.Serve("127.0.0.1:0")
		if err != nil {
			return report.Run{}, err
		}
		stopNATS, busURL = stop, url
	}
	// Each router's connection to the bus is delayed so that its news
	// reaches each other router a leg between their regions late, as the
	// simulator delays it (busRTTs).
	busRTT, err := busRTTs(m)
	if err != nil {
		return report.Run{}, err
	}
	// Routers.
	targets := make([]string, len(m.Ingress)) // per client region
	for k, st := range m.Sites {
		var cfg serve.Config
		for i, r := range reps {
			if st.Replicas != nil && !contains(st.Replicas, r.ID) {
				continue
			}
			cfg.Replicas = append(cfg.Replicas, fleet.ReplicaConfig{ID: r.ID, URL: urls[i][st.Region], Region: r.Region,
				KVCapacityTokens: r.Profile.KVCapacityTokens, PrefillMSPerTok: r.Profile.PrefillMSPerToken() / speedup,
				QueueMSPerTok: r.Profile.QueueMSPerToken() / speedup, ITLMS: r.Profile.ITLMS() / speedup, ITLSlopeMS: r.Profile.ITLSlopeMS() / speedup})
		}
		cfg.ProbeInterval = scale(30 * time.Second)
		cfg.ScrapeInterval = cfg.ProbeInterval
		cfg.Policy, cfg.Seed, cfg.Admin.Listen, cfg.Region = st.Policy.Name(), seed, admin.Off, st.Region
		cfg.Params = demoParams(cfg.Policy, speedup)
		if busURL != "" {
			link := netem.NewLink(scale(busRTT[k]), 0, seed+uint64(1000+k))
			cfg.Mesh = &mesh.Config{URL: busURL, Name: st.Region, Heartbeat: scale(2 * time.Second),
				Dial: func(network, address string) (net.Conn, error) {
					c, err := net.Dial(network, address)
					if err != nil {
						return nil, err
					}
					return link.Conn(c), nil
				}}
		}
		px, err := serve.New(cfg, serve.Options{Proxy: true})
		if err != nil {
			return report.Run{}, err
		}
		px.Fleet.ProbeOnce(ctx)
		running.Add(1)
		go func() { defer running.Done(); px.Run(ctx) }()
		for c, in := range m.Ingress {
			if in.Site != k {
				continue
			}
			leg, jitter, err := m.RTT(in.Region, st.Region)
			if err != nil {
				return report.Run{}, err
			}
			if targets[c], err = listen(px.Proxy.Handler(), leg, jitter, uint64(1000+10*k+c)); err != nil {
				return report.Run{}, err
			}
		}
	}
	// Clients: one replayer per region, on its share of the sessions.
	ingress := sim.AssignIngress(m, reqs, seed)
	parts := make([][]trace.Request, len(m.Ingress))
	index := make([][]int, len(m.Ingress))
	for i, r := range reqs {
		r.Time = scale(r.Time)
		parts[ingress[i]] = append(parts[ingress[i]], r)
		index[ingress[i]] = append(index[ingress[i]], i)
	}
	recs := make([]report.Record, len(reqs))
	var mu sync.Mutex
	clients := 0
	for _, p := range parts {
		if len(p) > 0 {
			clients++
		}
	}
	// The replayers begin together, as the simulator's clients share its
	// time 0: each alone would begin once its setup's round trips over
	// its leg were over, the far regions' clients later (the central
	// router saw Seoul's traffic 0.84 s of model time late).
	together := replay.Together(clients, nil)
	g, gctx := errgroup.WithContext(ctx)
	for c := range m.Ingress {
		if len(parts[c]) == 0 {
			continue
		}
		g.Go(func() error {
			// Connections opened first, over the client's leg: the
			// simulator does not model their setup.
			out, err := replay.Run(gctx, replay.Config{Target: targets[c], Requests: parts[c], Warm: replay.DefaultMaxInflight, Ready: together})
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			for j, rec := range out.Records {
				rec.Index = index[c][j]
				rec.TTFT *= speedup
				rec.E2E *= speedup
				rec.ITL *= speedup
				rec.Slip *= speedup
				rec.Arrival *= speedup
				recs[rec.Index] = rec
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return report.Run{}, err
	}
	ids := make([]string, len(reps))
	for i, r := range reps {
		ids[i] = r.ID
	}
	return report.NewRun(m.Label, recs, ids), nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// busRTTs is the round trip to give each site's connection to the mesh's
// one NATS server, so that the news of one router reaches another half
// their regions' mean round trip late, as in the simulator: the legs
// through the hub add up, r_i/2 + r_j/2 = RTT_ij/2, exactly for two or
// three sites (paper-mesh: 71, 208 and 385 ms), in the least-squares sense
// for more (clamped at zero).
func busRTTs(m *sim.Mesh) ([]time.Duration, error) {
	n := len(m.Sites)
	d := make([][]float64, n)
	for i := range d {
		d[i] = make([]float64, n)
		for j := range d[i] {
			if i == j {
				continue
			}
			rtt, _, err := m.RTT(m.Sites[i].Region, m.Sites[j].Region)
			if err != nil {
				return nil, err
			}
			d[i][j] = float64(rtt)
		}
	}
	out := make([]time.Duration, n)
	switch n {
	case 1:
		return out, nil
	case 2:
		out[0], out[1] = time.Duration(d[0][1]/2), time.Duration(d[0][1]/2)
		return out, nil
	}
	// Minimising Σ_{i<j} (r_i + r_j − d_ij)²: (n−2)·r_i + Σr = S_i, where
	// S_i = Σ_j d_ij, and Σr = T/(n−1) with T the sum over the pairs.
	total, sums := 0.0, make([]float64, n)
	for i := range d {
		for j := range d[i] {
			sums[i] += d[i][j]
			if j > i {
				total += d[i][j]
			}
		}
	}
	for i := range out {
		out[i] = time.Duration(max((sums[i]-total/float64(n-1))/float64(n-2), 0))
	}
	return out, nil
}
