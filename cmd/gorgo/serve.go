package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	adminapi "github.com/gorgo-llm/gorgo/internal/admin"
	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/serve"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

const serveAbout = `
Runs the OpenAI-compatible proxy in front of SGLang/vLLM replicas (or gorgo
engine emulators): each chat or completion request goes to the replica the
policy picks (the default policy, gorgo-e2e: the least cost in ms of the time to
first token, from round trip, uncached prompt tokens and queue, and of decode,
its weights tuned online), streams back as it comes, and is tried on another
replica if the first fails before any byte reached the client. The proxy
probes health and round trips (GET /health and /v1/models), scrapes /metrics, and serves its own
/metrics and /health to clients; the admin API (/admin/replicas, weights,
tuner, decide) is on its own listener (admin.listen, 127.0.0.1:9091 by
default), behind bearer tokens when configured.

Replicas come from --config (YAML, see examples/serve.yaml: replicas, DNS
discover groups), --replica ID=URL[,region=R][,profile=P][,model=M]... (repeatable) and
the admin API. SIGHUP, or a change of the config file, reloads it: replicas
keep their state, new ones join, missing ones are drained then removed.`

func runServe(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", "serve [--config FILE] [--replica ID=URL,...] [flags]", serveAbout, stderr)
	configPath := fs.String("config", "", "YAML config `FILE`")
	var replicas listFlag
	fs.Var(&replicas, "replica", "upstream `ID=URL[,region=R][,profile=P][,model=M]...[,adapter=A]...[,max_loras=N]` (repeatable; model and adapter: what it serves, else its /v1/models is read)")
	listen := fs.String("listen", "", "address to serve clients on (default the config's, else 127.0.0.1:8080)")
	adminListen := fs.String("admin-listen", "", "address of the admin API (default the config's, else 127.0.0.1:9091; off for none)")
	policyName := fs.String("policy", "", "routing policy (default the config's, else default: "+policy.DefaultName+"): "+joinNames(policy.LiveNames()))
	ttftSLO := fs.Duration("ttft-slo", 0, "TTFT SLO: a request predicted to miss it is held in a router-side queue or refused with 429 (default the config's ttft_slo, else none)")
	admission := fs.String("admission", "", "with --ttft-slo: queue (hold, the default) or reject (429 at once)")
	weights := fs.String("weights", "", "gorgo's weights, `rtt=X,queue=Y` or a JSON file (default the config's, else the paper's)")
	accessLog := fs.Bool("access-log", true, "log one line per request to stderr")
	var tf tuneFlags
	tf.registerLive(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	tf.given(fs)
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	var cfg serve.Config
	if *configPath != "" {
		var err error
		if cfg, err = serve.LoadConfig(*configPath); err != nil {
			return err
		}
	}
	var flagReplicas []fleet.ReplicaConfig
	for _, r := range replicas {
		rc, err := parseReplica(r)
		if err != nil {
			return fmt.Errorf("--replica: %w", err)
		}
		flagReplicas = append(flagReplicas, rc)
	}
	var flagWeights policy.Values
	if *weights != "" {
		gorgo, _ := policy.Lookup("gorgo")
		w, err := gorgo.Parse(*weights, gorgo.Defaults())
		if err != nil {
			return fmt.Errorf("--weights: %w", err)
		}
		flagWeights = w
	}
	// The command line wins over the file, at start and on every reload.
	overrides := func(c *serve.Config) error {
		c.Replicas = append(c.Replicas, flagReplicas...)
		if *listen != "" {
			c.Proxy.Listen = *listen
		}
		if *adminListen != "" {
			c.Admin.Listen = *adminListen
		}
		if *policyName != "" {
			c.Policy = *policyName
		}
		tf.apply(c)
		if flagWeights != nil {
			if c.Params == nil {
				c.Params = map[string]policy.Values{}
			}
			c.Params["gorgo"] = flagWeights
		}
		if *ttftSLO != 0 {
			c.TTFTSLO = *ttftSLO
		}
		if *admission != "" {
			c.Admission = admit.Mode(*admission)
		}
		return startable(c, &tf)
	}
	_ = overrides(&cfg)
	cfg = cfg.Defaults()
	srv, err := newServer(cfg, &tf, serve.Options{Proxy: true, Path: *configPath, Overrides: overrides}, *accessLog, stderr)
	if err != nil {
		return err
	}
	px := srv.Proxy
	ln, err := net.Listen("tcp", cfg.Proxy.Listen)
	if err != nil {
		return err
	}
	ln = px.LimitListener(ln, cfg.Proxy.MaxConnections)
	scheme := "http"
	if px.ServesTLS() {
		ln, scheme = tls.NewListener(ln, px.TLSConfig()), "https"
	}
	var admin net.Listener
	if cfg.Admin.Listen != adminapi.Off {
		if admin, err = net.Listen("tcp", cfg.Admin.Listen); err != nil {
			ln.Close()
			return fmt.Errorf("admin listener: %w", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGHUP reloads from now: before it is caught, its default action
	// would end the process (a config reloader signalling at start).
	defer reloadOnHUP(ctx, srv)()
	srv.Fleet.ProbeOnce(ctx)
	slo := ""
	if cfg.TTFTSLO > 0 {
		mode := cfg.Admission
		if mode == "" {
			mode = admit.ModeQueue
		}
		slo = fmt.Sprintf(", TTFT SLO %v (%s)", cfg.TTFTSLO, mode)
	}
	fmt.Fprintf(stdout, "gorgo serve: %s://%s, policy %s%s, %d replicas:\n", scheme, ln.Addr(), describePolicy(srv.Fleet.Policy(), cfg.Policy), slo, len(cfg.Replicas))
	writeReplicas(stdout, srv.Fleet.Router().Replicas())
	if admin != nil {
		fmt.Fprintf(stdout, "admin API: http://%s/admin/replicas\nlive view: http://%s/admin/ui/\n", admin.Addr(), admin.Addr())
	}
	printTracing(stdout, cfg)
	servers := []served{{h: px.Handler(), ln: ln, grace: cfg.Proxy.ShutdownTimeout, idle: cfg.Proxy.IdleTimeout, readHeader: cfg.Proxy.ReadHeaderTimeout}}
	if admin != nil {
		servers = append(servers, served{h: srv.Admin.Handler(), ln: admin})
	}
	return shutdown(serveAll(ctx, srv.Run, servers...), srv, cfg)
}

// writeReplicas lists the replicas as serve starts: each one's round trip
// and whether it takes requests.
func writeReplicas(w io.Writer, reps []router.ReplicaState) {
	if len(reps) == 0 {
		fmt.Fprintln(w, "  none yet: add them under replicas: or discover: in the config, or with POST /admin/replicas")
	}
	health := func(st router.ReplicaState) (string, string) {
		switch {
		case !st.Probed:
			// Its first probe failed: it may still be starting; the probe
			// loop keeps trying, and it takes requests once reached.
			return "not reached yet (probing)", "-"
		case !st.Available():
			return "DOWN", st.RTT.Round(time.Millisecond).String()
		}
		return "up", st.RTT.Round(time.Millisecond).String()
	}
	listed, more := reps, 0
	if len(reps) > maxListed {
		// A large fleet: how many are in each state, and those not up.
		counts := map[string]int{}
		listed = nil
		for _, st := range reps {
			h, _ := health(st)
			switch counts[h]++; {
			case h == "up":
			case len(listed) < maxListed:
				listed = append(listed, st)
			default:
				more++
			}
		}
		fmt.Fprintf(w, "  %d up, %d DOWN, %d not reached yet (GET /admin/replicas lists them all)\n", counts["up"], counts["DOWN"], counts["not reached yet (probing)"])
	}
	for _, st := range listed {
		h, rtt := health(st)
		fmt.Fprintf(w, "  %-12s %-14s rtt %-8s %s\n", st.ID, st.Region, rtt, h)
	}
	if more > 0 {
		fmt.Fprintf(w, "  and %d more not up\n", more)
	}
}

// maxListed is how many replicas the start-up lists one by one: a larger
// fleet is counted, its replicas not up listed (2026-12-07, a user's
// test: a table of 500 lines).
const maxListed = 24

// printTracing says where spans go, when tracing is on.
func printTracing(stdout io.Writer, cfg serve.Config) {
	if t := cfg.Tracing; t.Enabled() {
		fmt.Fprintf(stdout, "tracing: OTLP/HTTP to %s, sampling ratio %v\n", t.Endpoint, t.Ratio())
	}
}

// shutdown flushes the server's spans once serving ended (err is how it
// ended), within the shutdown timeout.
func shutdown(err error, srv *serve.Server, cfg serve.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Proxy.ShutdownTimeout)
	defer cancel()
	if ferr := srv.Shutdown(ctx); ferr != nil {
		err = errors.Join(err, fmt.Errorf("tracing: flushing spans: %w", ferr))
	}
	return err
}

// reloadOnHUP reloads the server's config on SIGHUP until ctx ends; call
// the function it returns to stop listening for the signal.
func reloadOnHUP(ctx context.Context, srv *serve.Server) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				_ = srv.Reload() // logs what it did
			}
		}
	}()
	return func() { signal.Stop(hup) }
}

// newServer builds the router of a config, as gorgo serve and gorgo epp
// run it: its policy (the online tuner if asked for), a registry with the
// Go and process collectors, a logger on stderr (and the access log there,
// if asked for).
func newServer(cfg serve.Config, tf *tuneFlags, o serve.Options, accessLog bool, stderr io.Writer) (*serve.Server, error) {
	pol, err := servePolicy(cfg, tf)
	if err != nil {
		return nil, err
	}
	o.Policy = pol
	o.Registry = prometheus.NewRegistry()
	o.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	o.Log = slog.New(slog.NewTextHandler(stderr, nil))
	if accessLog {
		o.AccessLog = o.Log
	}
	return serve.New(cfg, o)
}

// startable reports what a start of c would refuse beyond the config's
// own validation (which the reload runs): the tuner the command builds from
// it. A reload must not take a file the next start refuses (2026-12-06, a
// review: e2e_weights all 0 under the tuner were taken for the restart).
func startable(c *serve.Config, tf *tuneFlags) error {
	d := c.Defaults()
	if d.Validate() != nil {
		return nil // the reload says why
	}
	_, err := servePolicy(d, tf)
	return err
}

// servePolicy builds the online tuner: over --base when the policy is
// gorgo-online, over the config's policy when it is tuned (the default
// policy, unless tune: false or --tune=false), each from the config's
// parameters of the tuned policy; nil means the fleet builds the config's
// policy itself.
func servePolicy(cfg serve.Config, tf *tuneFlags) (policy.Policy, error) {
	switch {
	case cfg.Policy == tune.OnlineName:
		c, err := tf.config(cfg.Seed)
		if err != nil {
			return nil, err
		}
		return tf.onlineWith(c, cfg.Params[policy.Canonical(tf.base)], false)
	case cfg.Tuned():
		if info, ok := policy.Lookup(cfg.Policy); !ok || len(info.Params) == 0 {
			return nil, nil // the config's validation says why
		}
		oc, err := tf.liveConfig(cfg.Policy, cfg.Seed, cfg.Params[cfg.Policy], cfg.HasSLO())
		if err != nil {
			return nil, err
		}
		return tune.NewOnline(oc)
	}
	// The flags that set the tuner (those tuneFlags registers) mean
	// nothing without it.
	fs := flag.NewFlagSet("tuner", flag.ContinueOnError)
	new(tuneFlags).register(fs)
	var given string
	fs.VisitAll(func(f *flag.Flag) {
		if given == "" && tf.set[f.Name] {
			given = f.Name
		}
	})
	if given != "" {
		return nil, fmt.Errorf("--%s is the online tuner's, and the policy runs untuned (tune: false, or --tune=false)", given)
	}
	return nil, nil
}

// describePolicy names the running policy, and what an online tuner tunes
// (configured: the config's policy).
func describePolicy(p policy.Policy, configured string) string {
	o, ok := p.(*tune.Online)
	if !ok {
		return p.Name()
	}
	var names []string
	for _, q := range o.Config().ES.Params {
		names = append(names, q.Name)
	}
	obj, _, _ := strings.Cut(o.Objective(), ",")
	fixed := "; --tune=false for fixed weights"
	if configured == tune.OnlineName {
		fixed = "; its base policy alone for fixed weights"
	}
	judged := "judged on " + o.Judges()
	if o.Paused() { // resumed paused (tuner_state)
		judged = "paused: POST /admin/tuner/resume to tune"
	}
	return fmt.Sprintf("%s (tuning %s online for %s, %s%s)", o.Base(), strings.Join(names, ", "), obj, judged, fixed)
}

// served is a handler and the listener it serves on, how long a graceful
// shutdown waits for its requests in flight (default 5 s), how long a
// keep-alive connection may idle (default 75 s) and a client take to send
// its request headers (default 10 s).
type served struct {
	h           http.Handler
	ln          net.Listener
	grace, idle time.Duration
	readHeader  time.Duration
}

// serveAll serves each handler on its listener and runs run (a server's
// background work: an emulator's model, a proxy's probes) until ctx ends or
// run fails. When run ends cleanly the HTTP servers shut down gracefully;
// when it fails (an emulator's injected crash) every connection is cut at
// once.
func serveAll(ctx context.Context, run func(context.Context) error, servers ...served) error {
	g, ctx := errgroup.WithContext(ctx)
	var hss []*http.Server
	for _, sv := range servers {
		hs := &http.Server{Handler: sv.h, ReadHeaderTimeout: cmp.Or(sv.readHeader, 10*time.Second), IdleTimeout: cmp.Or(sv.idle, 75*time.Second)}
		hss = append(hss, hs)
		g.Go(func() error {
			if err := hs.Serve(sv.ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	g.Go(func() error {
		if err := run(ctx); err != nil {
			for _, hs := range hss {
				hs.Close()
			}
			return err
		}
		// Stop accepting; let what is in flight finish, up to each
		// server's grace period.
		errs := make([]error, len(hss))
		var wg sync.WaitGroup
		for i, hs := range hss {
			wg.Add(1)
			go func() {
				defer wg.Done()
				grace := servers[i].grace
				if grace <= 0 {
					grace = 5 * time.Second
				}
				sctx, cancel := context.WithTimeout(context.Background(), grace)
				defer cancel()
				if errs[i] = hs.Shutdown(sctx); errs[i] != nil {
					hs.Close() // the grace period is over: cut what is left
				}
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	})
	return g.Wait()
}

// parseReplica reads ID=URL[,region=R][,profile=P][,model=M]...[,adapter=A]...[,max_loras=N].
func parseReplica(s string) (fleet.ReplicaConfig, error) {
	parts := strings.Split(s, ",")
	id, u, ok := strings.Cut(parts[0], "=")
	if !ok || id == "" || u == "" {
		return fleet.ReplicaConfig{}, fmt.Errorf("want ID=URL[,region=R][,profile=P][,model=M]...[,adapter=A]...[,max_loras=N], got %q", s)
	}
	rc := fleet.ReplicaConfig{ID: id, URL: u}
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "region":
			rc.Region = v
		case "profile":
			rc.Profile = v
		case "model":
			rc.Models = append(rc.Models, v)
		case "adapter":
			rc.Adapters = append(rc.Adapters, v)
		case "max_loras":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return rc, fmt.Errorf("max_loras in %q: want a positive integer", s)
			}
			rc.MaxLoRAs = n
		default:
			return rc, fmt.Errorf("unknown replica option %q in %q (valid: region, profile, model, adapter, max_loras)", k, s)
		}
	}
	return rc, nil
}
