package fleet_test

import (
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gorgo-llm/gorgo/internal/discover"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/proxy"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

type replica = servetest.Replica

var (
	chat               = servetest.Chat
	fakeUpstream       = servetest.Fake
	fakeReplica        = servetest.At
	startReplica       = servetest.StartReplica
	chatBody           = servetest.ChatBody
	do                 = servetest.Do
	eventually         = servetest.Eventually
	workload           = servetest.Workload
	replayInBackground = servetest.ReplayInBackground
)

// testConfig is a router's config in a test: the fleet's part, the front
// end's, and a DNS resolver of the test's own.
type testConfig struct {
	Fleet    fleet.Config
	Proxy    proxy.Config
	Resolver discover.Resolver
	Log      *slog.Logger // default: discarded
}

// testRouter is a fleet and a front end over it, running until the test
// ends.
type testRouter struct {
	*fleet.Fleet
	reg *prometheus.Registry
}

// metric is the value of a metric of the router's (0 if absent).
func (s *testRouter) metric(name string, labels ...string) float64 {
	fams, _ := s.reg.Gather()
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if matches(m, labels) {
				if c := m.GetCounter(); c != nil {
					return c.GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// matches reports whether the metric has the label pairs.
func matches(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// startProxy runs a fleet of the replicas (ids a, b, ... in regions ra,
// rb, ...), probed and scraped every 100 ms unless the config says
// otherwise, and a front end over it; it returns the front end's URL.
func startProxy(t testing.TB, cfg testConfig, reps ...*replica) (*testRouter, string) {
	t.Helper()
	cfg.Fleet = servetest.FleetConfig(cfg.Fleet, reps...)
	reg := prometheus.NewRegistry()
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	f, err := fleet.New(cfg.Fleet, fleet.Options{Registry: reg, Resolver: cfg.Resolver, Log: cfg.Log})
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.New(f, cfg.Proxy, reg, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	servetest.RunFleet(t, f)
	ts := httptest.NewServer(p.Handler())
	t.Cleanup(ts.Close) // before the fleet stops
	return &testRouter{Fleet: f, reg: reg}, ts.URL
}

// stateOr is replica id's state, zero if it is gone.
func stateOr(s *testRouter, id string) router.ReplicaState {
	st, _ := s.Router().Replica(id)
	return st
}

// replicaState is replica id's state; the test fails if it is gone.
func replicaState(t *testing.T, s *testRouter, id string) router.ReplicaState {
	t.Helper()
	st, err := s.Router().Replica(id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
