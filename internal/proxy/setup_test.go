package proxy

import (
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

type replica = servetest.Replica

var (
	chat         = servetest.Chat
	fakeUpstream = servetest.Fake
	fakeReplica  = servetest.At
	startReplica = servetest.StartReplica
	chatBody     = servetest.ChatBody
	do           = servetest.Do
	eventually   = servetest.Eventually
)

// testConfig is a router's config in a test: the fleet's part, the front
// end's, an access log and a policy of the test's own (nil: the config's).
type testConfig struct {
	Fleet     fleet.Config
	Proxy     Config
	AccessLog *slog.Logger
	Policy    policy.Policy
}

// testRouter is a fleet and its front end, running until the test ends.
type testRouter struct {
	*fleet.Fleet
	proxy *Server
	reg   *prometheus.Registry
}

// startProxy runs a fleet of the replicas (ids a, b, ... in regions ra,
// rb, ...), probed and scraped every 100 ms unless the config says
// otherwise, and the front end over it; it returns the front end's URL.
func startProxy(t testing.TB, cfg testConfig, reps ...*replica) (*testRouter, string) {
	t.Helper()
	cfg.Fleet = servetest.FleetConfig(cfg.Fleet, reps...)
	reg := prometheus.NewRegistry()
	f, err := fleet.New(cfg.Fleet, fleet.Options{Policy: cfg.Policy, Registry: reg, AccessLog: cfg.AccessLog})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(f, cfg.Proxy, reg, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	servetest.RunFleet(t, f)
	ts := httptest.NewServer(p.Handler())
	t.Cleanup(ts.Close) // before the fleet stops
	return &testRouter{Fleet: f, proxy: p, reg: reg}, ts.URL
}

// stateOr is replica id's state, zero if it is gone.
func stateOr(s *testRouter, id string) router.ReplicaState {
	st, _ := s.Router().Replica(id)
	return st
}
