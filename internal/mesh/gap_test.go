package mesh

import (
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// clusterNode runs a NATS server of cluster "gorgo", routed to route (a
// nats-route:// URL; "" for none).
func clusterNode(t *testing.T, name, route string) *server.Server {
	t.Helper()
	o := &server.Options{ServerName: name, Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		Cluster: server.ClusterOpts{Name: "gorgo", Host: "127.0.0.1", Port: -1}}
	if route != "" {
		u, err := url.Parse(route)
		if err != nil {
			t.Fatal(err)
		}
		o.Routes = []*url.URL{u}
	}
	ns, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(ns.Shutdown)
	return ns
}

// A mesh across regions runs a NATS cluster (Config.URL: "the NATS server
// (or cluster)"), one server per region. When the route between two
// servers blips, both routers stay connected to their own server: neither
// sees a disconnect, a slow consumer or a failed publish, yet every event
// published meanwhile is dropped by the server that has no route to its
// subscriber. The ends of the requests mirrored on the other side are
// among them: if the blip is shorter than five of the sender's heartbeats
// (10 s by default), the sender is never quiet, and the mirrors stay in
// the replica's ledger as phantom load until remote_ttl (10 min). Events
// are numbered: a receiver that finds one missing forgets the sender's
// mirrors (2026-12-05: they carried nothing by which it could see the
// gap).
func TestRouteBlipLeavesNoPhantomLoad(t *testing.T) {
	nsA := clusterNode(t, "A", "")
	cut := newCutter(t, nsA.ClusterAddr().String())
	nsB := clusterNode(t, "B", "nats-route://"+cut.ln.Addr().String())
	routed := func() bool { return nsA.NumRoutes() > 0 && nsB.NumRoutes() > 0 }
	eventually(t, "the route", routed)

	rB := newRouter(t)
	us := join(t, nsA.ClientURL(), "us", newRouter(t)) // default heartbeat: 2 s, quiet after 10 s
	eu := join(t, nsB.ClientURL(), "eu", rB)
	var charges atomic.Int64
	eu.OnCharge(func(string, float64, float64) { charges.Add(1) })
	// Interest crosses the route: resend until eu hears.
	req := policy.Request{PromptTokens: 64, Blocks: []uint64{1, 2, 3, 4}}
	eventually(t, "eu to hear us", func() bool { us.Charged("team", 1, 0); time.Sleep(20 * time.Millisecond); return charges.Load() > 0 })
	for id := uint64(1); id <= 3; id++ {
		us.Dispatched(id, "a", 0, &req)
	}
	eventually(t, "eu to mirror us's requests", func() bool { return eu.Mirrors() == 3 })

	cut.cut(true)
	eventually(t, "the route to go", func() bool { return nsA.NumRoutes() == 0 && nsB.NumRoutes() == 0 })
	start := time.Now()
	for id := uint64(1); id <= 3; id++ {
		us.Finished(id, 0, 0) // reaches server A, which has no route to eu
	}
	if err := us.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	cut.restore()
	eventually(t, "the route back", routed)
	seen := charges.Load()
	eventually(t, "eu to hear us again", func() bool { us.Charged("team", 1, 0); time.Sleep(20 * time.Millisecond); return charges.Load() > seen })
	gap := time.Since(start)
	if gap > 8*time.Second {
		t.Skipf("the route took %v to come back: us may have gone quiet at eu", gap)
	}
	n, _ := inFlight(t, rB, "a")
	t.Logf("route back after %v: eu mirrors %d, in flight at a %d (all 3 ended at us)", gap, eu.Mirrors(), n)
	if n != 0 {
		t.Errorf("phantom load at eu after a route blip: %d in flight at a, kept until remote_ttl", n)
	}
	if !us.Connected() || !eu.Connected() {
		t.Errorf("a router lost its own server")
	}
}
