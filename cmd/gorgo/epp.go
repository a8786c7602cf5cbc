package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/gorgo-llm/gorgo/internal/admin"
	"github.com/gorgo-llm/gorgo/internal/epp"
	"github.com/gorgo-llm/gorgo/internal/proxy"
	"github.com/gorgo-llm/gorgo/internal/serve"
)

const eppAbout = `
Serves the Gateway API Inference Extension's endpoint-picker protocol over
Envoy's ext_proc gRPC service: an Envoy-based gateway (Envoy AI Gateway,
kgateway, Istio, GKE's inference gateway) asks it, for each request, which
replica should serve it, and gorgo answers with its cost (see docs/gateway.md).
The fleet, probes, scrapes, health, admission and the admin API are gorgo
serve's, from the same config file (its listen address is not used).`

func runEPP(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("epp", "epp --config FILE [--listen ADDR]", eppAbout, stderr)
	configPath := fs.String("config", "", "YAML config `FILE`, as for gorgo serve (required)")
	listen := fs.String("listen", "127.0.0.1:9002", "address of the ext_proc gRPC service")
	fallbacks := fs.Int("fallbacks", 0, "ranked fallback endpoints after the chosen one in the answer, for gateways that follow the list (Envoy's ORIGINAL_DST reads one address: keep 0 there)")
	bodyMode := fs.String("body-mode", "", "the body `MODE` of a gateway that does not say it on each stream (Envoy before 1.34): FULL_DUPLEX_STREAMED (requests and responses, as the protocol's reference picker assumes) or BUFFERED (requests; responses streamed); unset: BUFFERED, and a stream that ends before its response counted as served")
	adminListen := fs.String("admin-listen", "", "address of the admin API (default the config's, else 127.0.0.1:9091; off for none)")
	var tf tuneFlags
	tf.registerLive(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	tf.given(fs)
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *configPath == "" {
		return fmt.Errorf("--config is required")
	}
	if *fallbacks < 0 {
		return fmt.Errorf("--fallbacks must not be negative")
	}
	assume, err := assumedProtocol(*bodyMode)
	if err != nil {
		return err
	}
	cfg, err := serve.LoadConfig(*configPath)
	if err != nil {
		return err
	}
	overrides := func(c *serve.Config) error {
		if *adminListen != "" {
			c.Admin.Listen = *adminListen
		}
		tf.apply(c)
		return startable(c, &tf)
	}
	_ = overrides(&cfg)
	cfg = cfg.Defaults()
	srv, err := newServer(cfg, &tf, serve.Options{Path: *configPath, Overrides: overrides}, false, stderr)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	var adminLn net.Listener
	if cfg.Admin.Listen != admin.Off {
		if adminLn, err = net.Listen("tcp", cfg.Admin.Listen); err != nil {
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
	fmt.Fprintf(stdout, "gorgo epp: ext_proc on %s, policy %s, %d replicas\n", ln.Addr(), describePolicy(srv.Fleet.Policy(), cfg.Policy), len(cfg.Replicas))
	if adminLn != nil {
		fmt.Fprintf(stdout, "admin API: http://%s/admin/replicas\n", adminLn.Addr())
	}
	printTracing(stdout, cfg)
	gs := grpc.NewServer()
	picker := epp.New(srv.Fleet, srv.Registry())
	picker.Fallbacks, picker.Assume = *fallbacks, assume
	pickerSettings := func(c serve.Config) epp.Settings {
		return epp.Settings{TenantHeader: c.Proxy.TenantHeader, RefuseOperations: c.Proxy.EngineOperations == proxy.OperationsRefuse,
			OperationWait: c.Proxy.HeaderTimeout, WeightsWait: c.Proxy.FirstByteTimeout,
			MaxBodyBytes: c.Proxy.MaxBodyBytes, MaxBodyBytesInFlight: c.Proxy.MaxBodyBytesInFlight}
	}
	srv.OnApply(func(c serve.Config) { picker.SetSettings(pickerSettings(c)) }) // now, and each reload's
	extprocv3.RegisterExternalProcessorServer(gs, picker)
	// The protocol's health services.
	hs := health.NewServer()
	for _, svc := range []string{"liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		hs.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(gs, hs)
	stopped := make(chan struct{}) // the gRPC server stopped (gracefully or not)
	go func() {
		defer close(stopped)
		<-ctx.Done()
		// Not serving from now: a gateway checking the picker's health
		// stops sending it new streams while those in flight end.
		hs.Shutdown()
		done := make(chan struct{})
		go func() { gs.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(cfg.Proxy.ShutdownTimeout):
			gs.Stop()
		}
	}()
	go gs.Serve(ln)
	var servers []served
	if adminLn != nil {
		servers = append(servers, served{h: srv.Admin.Handler(), ln: adminLn})
	}
	err = serveAll(ctx, srv.Run, servers...)
	if ctx.Err() != nil {
		<-stopped // the streams in flight ended their spans (bounded by the shutdown timeout)
	}
	return shutdown(err, srv, cfg)
}

// assumedProtocol is the protocol configuration --body-mode says a gateway
// that does not send one uses (nil: unset).
func assumedProtocol(mode string) (*extprocv3.ProtocolConfiguration, error) {
	switch strings.ToUpper(mode) {
	case "":
		return nil, nil
	case "FULL_DUPLEX_STREAMED":
		return &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}, nil
	case "BUFFERED":
		return &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED,
			ResponseBodyMode: filterv3.ProcessingMode_STREAMED}, nil
	}
	return nil, fmt.Errorf("--body-mode must be FULL_DUPLEX_STREAMED or BUFFERED, got %q", mode)
}
