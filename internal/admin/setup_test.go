package admin

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/proxy"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

type replica = servetest.Replica

var (
	chat         = servetest.Chat
	startReplica = servetest.StartReplica
	do           = servetest.Do
)

// testConfig is a router's config in a test: the fleet's part, the admin
// listener's, the log of admin changes and a policy of the test's own.
type testConfig struct {
	Fleet  fleet.Config
	Admin  Config
	Log    *slog.Logger
	Policy policy.Policy
}

// testRouter is a fleet, its admin server and a front end, running until
// the test ends.
type testRouter struct {
	*fleet.Fleet
	admin *Server
	// client and admin are the front end's and the admin API's URLs.
	client, adminURL string
}

// startAdmin runs a fleet of the replicas (ids a, b, ... in regions ra,
// rb, ...), probed and scraped every 100 ms unless the config says
// otherwise, its admin server and live view, and an HTTP front end.
func startAdmin(t testing.TB, cfg testConfig, reps ...*replica) *testRouter {
	t.Helper()
	s, err := newRouter(t, cfg, reps...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newRouter(t testing.TB, cfg testConfig, reps ...*replica) (*testRouter, error) {
	t.Helper()
	cfg.Fleet = servetest.FleetConfig(cfg.Fleet, reps...)
	reg := prometheus.NewRegistry()
	view := NewView()
	f, err := fleet.New(cfg.Fleet, fleet.Options{Registry: reg, Tap: view, Policy: cfg.Policy})
	if err != nil {
		return nil, err
	}
	a, err := New(f, view, cfg.Admin, reg, cfg.Log)
	if err != nil {
		return nil, err
	}
	p, err := proxy.New(f, proxy.Config{}, reg, reg, nil)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.ProbeOnce(ctx)
	done := make(chan error, 2)
	go func() { done <- f.Run(ctx) }()
	go func() { done <- a.Run(ctx) }()
	client := httptest.NewServer(p.Handler())
	adm := httptest.NewServer(a.Handler())
	t.Cleanup(func() {
		client.Close()
		adm.Close()
		cancel()
		<-done
		<-done
	})
	return &testRouter{Fleet: f, admin: a, client: client.URL, adminURL: adm.URL}, nil
}
