package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/gorgo-llm/gorgo/internal/proxy"
	"github.com/gorgo-llm/gorgo/internal/route"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

const serveAbout = `
Runs the OpenAI-compatible proxy in front of SGLang/vLLM replicas (or gorgo
engine emulators): each chat or completion request goes to the replica the
policy picks (gorgo by default: lowest estimated TTFT from round trip, uncached
prompt tokens and queue), streams back as it comes, and is tried on another
replica if the first fails before any byte reached the client. The proxy
probes round trips (GET /health), scrapes /metrics, and serves its own
/metrics, /health and /admin/replicas, /admin/decide, /admin/tuner.

Replicas come from --config (YAML, see examples/serve.yaml) and/or
--replica ID=URL[,region=R][,profile=P] (repeatable).`

func runServe(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", "serve [--config FILE] [--replica ID=URL,...] [flags]", serveAbout, stderr)
	configPath := fs.String("config", "", "YAML config `FILE`")
	var replicas listFlag
	fs.Var(&replicas, "replica", "upstream `ID=URL[,region=R][,profile=P]` (repeatable)")
	listen := fs.String("listen", "", "address to serve on (default the config's, else 127.0.0.1:8080)")
	policy := fs.String("policy", "", "routing policy (default the config's, else gorgo): "+joinNames(append(route.Names(), tune.OnlineName)))
	weights := fs.String("weights", "", "gorgo's weights, `rtt=X,queue=Y` or a JSON file (default the config's, else the paper's)")
	accessLog := fs.Bool("access-log", true, "log one line per request to stderr")
	var tf tuneFlags
	tf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	var cfg proxy.Config
	if *configPath != "" {
		var err error
		if cfg, err = proxy.LoadConfig(*configPath); err != nil {
			return err
		}
	}
	for _, r := range replicas {
		rc, err := parseReplica(r)
		if err != nil {
			return fmt.Errorf("--replica: %w", err)
		}
		cfg.Replicas = append(cfg.Replicas, rc)
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	if *policy != "" {
		cfg.Policy = *policy
	}
	if *weights != "" {
		w, err := route.ParseWeights(*weights, route.PaperWeights)
		if err != nil {
			return fmt.Errorf("--weights: %w", err)
		}
		cfg.Weights = &w
	}
	cfg = cfg.Defaults()
	var pol route.Policy
	if cfg.Policy == tune.OnlineName {
		base := route.Options{TieMargin: cfg.TieMargin}
		if cfg.Weights != nil {
			base.Weights = *cfg.Weights
		}
		o, err := tf.online(cfg.Seed, base)
		if err != nil {
			return err
		}
		pol = o
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := proxy.New(cfg, pol, reg)
	if err != nil {
		return err
	}
	if *accessLog {
		srv.SetAccessLog(slog.New(slog.NewTextHandler(stderr, nil)))
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv.ProbeOnce(ctx)
	fmt.Fprintf(stdout, "gorgo serve: http://%s, policy %s, %d replicas:\n", ln.Addr(), cfg.Policy, len(cfg.Replicas))
	for _, st := range srv.Router().Snapshot() {
		health := "healthy"
		if !st.Healthy {
			health = "DOWN"
		}
		fmt.Fprintf(stdout, "  %-12s %-14s rtt %-8v %s\n", st.ID, st.Region, st.RTT.Round(time.Millisecond), health)
	}
	return serve(ctx, srv.Handler(), ln, srv.Run)
}

// serve serves h on ln and runs run (a server's background work: an
// emulator's model, a proxy's probes) until ctx ends or run fails. When run
// ends cleanly the HTTP server shuts down gracefully; when it fails (an
// emulator's injected crash) every connection is cut at once.
func serve(ctx context.Context, h http.Handler, ln net.Listener, run func(context.Context) error) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		if err := run(ctx); err != nil {
			hs.Close()
			return err
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return hs.Shutdown(sctx)
	})
	return g.Wait()
}

// parseReplica reads ID=URL[,region=R][,profile=P].
func parseReplica(s string) (proxy.ReplicaConfig, error) {
	parts := strings.Split(s, ",")
	id, u, ok := strings.Cut(parts[0], "=")
	if !ok || id == "" || u == "" {
		return proxy.ReplicaConfig{}, fmt.Errorf("want ID=URL[,region=R][,profile=P], got %q", s)
	}
	rc := proxy.ReplicaConfig{ID: id, URL: u}
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "region":
			rc.Region = v
		case "profile":
			rc.Profile = v
		default:
			return rc, fmt.Errorf("unknown replica option %q in %q (valid: region, profile)", k, s)
		}
	}
	return rc, nil
}
