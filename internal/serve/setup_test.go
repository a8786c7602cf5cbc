package serve

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

type replica = servetest.Replica

var (
	startReplica       = servetest.StartReplica
	chatBody           = servetest.ChatBody
	do                 = servetest.Do
	eventually         = servetest.Eventually
	workload           = servetest.Workload
	replayInBackground = servetest.ReplayInBackground
)

// testRouter is a whole router (gorgo serve's), running until the test
// ends, and its listeners' URLs.
type testRouter struct {
	*Server
	client, admin string
}

// startRouter runs gorgo serve's router over the replicas (ids a, b, ...
// in regions ra, rb, ...), probed and scraped every 100 ms unless the
// config says otherwise.
func startRouter(t testing.TB, cfg Config, o Options, reps ...*replica) *testRouter {
	t.Helper()
	cfg.Config = servetest.FleetConfig(cfg.Config, reps...)
	o.Proxy = true
	s, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.Fleet.ProbeOnce(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	client := httptest.NewServer(s.Proxy.Handler())
	admin := httptest.NewServer(s.Admin.Handler())
	t.Cleanup(func() {
		client.Close()
		admin.Close()
		cancel()
		<-done
	})
	return &testRouter{Server: s, client: client.URL, admin: admin.URL}
}

// stateOr is replica id's state, zero if it is gone.
func stateOr(s *testRouter, id string) router.ReplicaState {
	st, _ := s.Fleet.Router().Replica(id)
	return st
}

// replicaState is replica id's state; the test fails if it is gone.
func replicaState(t *testing.T, s *testRouter, id string) router.ReplicaState {
	t.Helper()
	st, err := s.Fleet.Router().Replica(id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
