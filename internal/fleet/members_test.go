package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/discover"
	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// A membership change leaves the other replicas' state alone: their RTT
// estimates and prefix-index shares are exactly as they were.
func TestFleetChangesKeepOthersState(t *testing.T) {
	a, b := startReplica(t, 10*time.Millisecond, emulator.Faults{}), startReplica(t, 20*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Policy: "round-robin"}}, a, b)
	for i := range 6 {
		if res := chat(t, url, fmt.Sprintf("conversation %d: %s", i, strings.Repeat("words ", 300)), 2); res.Status != 200 {
			t.Fatalf("%+v", res)
		}
	}
	before := []router.ReplicaState{replicaState(t, s, "a"), replicaState(t, s, "b")}
	if before[0].IndexBlocks == 0 || before[1].IndexBlocks == 0 || before[0].RTT == 0 {
		t.Fatalf("nothing to keep: %+v", before)
	}
	c := startReplica(t, 5*time.Millisecond, emulator.Faults{})
	for _, op := range []struct {
		name   string
		change func() error
	}{
		{"add", func() error { return s.Add(fleet.SourceAdmin, fleet.ReplicaConfig{ID: "c", URL: c.URL}) }},
		{"drain", func() error { return s.Drain("c") }},
		{"undrain", func() error { return s.Undrain("c") }},
		{"remove", func() error { return s.Remove("c") }},
	} {
		if err := op.change(); err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
		after := []router.ReplicaState{replicaState(t, s, "a"), replicaState(t, s, "b")}
		for i := range before {
			if after[i].RTT != before[i].RTT || after[i].IndexBlocks != before[i].IndexBlocks || after[i].RTTSamples != before[i].RTTSamples {
				t.Errorf("%s changed %s: %+v -> %+v", op.name, before[i].ID, before[i], after[i])
			}
		}
	}
	if err := s.Add(fleet.SourceAdmin, fleet.ReplicaConfig{ID: "a", URL: c.URL}); !errors.Is(err, router.ErrExists) {
		t.Errorf("adding an existing id: %v, want ErrExists", err)
	}
	if err := s.Add(fleet.SourceAdmin, fleet.ReplicaConfig{ID: "d", URL: "ftp://x"}); err == nil {
		t.Error("a bad URL added")
	}
}

// apply reloads the fleet's config.
func apply(t *testing.T, s *testRouter, cfg fleet.Config) {
	t.Helper()
	run, _, err := s.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(); err != nil {
		t.Fatal(err)
	}
}

// Replicas of a DNS group follow its records while a replay runs.
func TestDNSDiscoveryWhileServing(t *testing.T) {
	a, b, c := startReplica(t, 10*time.Millisecond, emulator.Faults{}), startReplica(t, 20*time.Millisecond, emulator.Faults{}),
		startReplica(t, 15*time.Millisecond, emulator.Faults{})
	dns := &fakeDNS{}
	dns.set(a.Port(), b.Port())
	cfg := testConfig{Resolver: dns, Fleet: fleet.Config{ProbeInterval: time.Hour, Policy: "round-robin", Discover: []discover.Group{{SRV: "_http._tcp.engines.test", Region: "us", Profile: "paper", Interval: 20 * time.Millisecond}}}}
	s, url := startProxy(t, cfg)
	id := func(r *replica) string { return fmt.Sprintf("_http._tcp.engines.test@127.0.0.1:%d", r.Port()) }
	eventually(t, "the group's replicas", func() bool {
		return s.Router().Len() == 2 && stateOr(s, id(a)).Available() && stateOr(s, id(b)).Available()
	})
	reqs := workload(5)
	done := replayInBackground(t, url, reqs)
	eventually(t, "a third of the replay", func() bool { return a.Served()+b.Served() > int64(len(reqs)/3) })
	dns.set(a.Port(), c.Port()) // b scaled down, c up
	eventually(t, "c to join", func() bool { return c.Served() > 0 })
	eventually(t, "b to leave", func() bool { return !s.Router().Has(id(b)) })
	res := <-done
	for _, r := range res.Records {
		if r.Failed {
			t.Fatalf("request %d failed: %s", r.Index, r.Error)
		}
	}
	if st := stateOr(s, id(c)); st.Region != "us" {
		t.Errorf("discovered replica %+v", st)
	}
	_ = b
}

// fakeDNS answers SRV lookups from a set the test changes.
type fakeDNS struct {
	mu    sync.Mutex
	ports []int
}

func (f *fakeDNS) set(ports ...int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ports = ports
}

func (f *fakeDNS) LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error) {
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (f *fakeDNS) LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*net.SRV
	for _, p := range f.ports {
		out = append(out, &net.SRV{Target: "127.0.0.1.", Port: uint16(p)})
	}
	return name, out, nil
}

// holdOn dispatches requests until one lands on replica id, and returns its
// ticket (in id's ledger until Finish).
func holdOn(t *testing.T, s *testRouter, id string) router.Ticket {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		tk, _, err := s.Router().Dispatch(s.Now(), &policy.Request{PromptTokens: 10}, rng, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tk.ID == id {
			return tk
		}
		s.Router().Finish(&tk)
	}
	t.Fatalf("no request landed on %s", id)
	return router.Ticket{}
}

// A replica dropped from the file while busy, then listed again with
// changed settings, stays (with the new settings).
func TestRelistedReplicaStays(t *testing.T) {
	s, _ := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Policy: "round-robin"}}, startReplica(t, 2*time.Millisecond, emulator.Faults{}), startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	cfg := s.Config()
	ra, rb := cfg.Replicas[0], cfg.Replicas[1]
	tk := holdOn(t, s, "a")
	cfg.Replicas = []fleet.ReplicaConfig{rb}
	apply(t, s, cfg)
	if st := replicaState(t, s, "a"); st.State != router.Removing {
		t.Fatalf("a dropped: %v", st.State)
	}
	ra.Region = "elsewhere"
	cfg.Replicas = []fleet.ReplicaConfig{ra, rb}
	apply(t, s, cfg)
	s.Router().Finish(&tk)
	st, err := s.Router().Replica("a")
	if err != nil || st.State != router.Active || st.Region != "elsewhere" {
		t.Errorf("a listed again with a new region: %+v, %v", st, err)
	}
}

// A DNS group's changed settings reach the replicas it already found.
func TestDNSGroupChangesReachItsReplicas(t *testing.T) {
	a := startReplica(t, 2*time.Millisecond, emulator.Faults{})
	dns := &fakeDNS{}
	dns.set(a.Port())
	g := discover.Group{SRV: "_http._tcp.engines.test", Region: "us", Profile: "paper", Interval: 20 * time.Millisecond}
	s, _ := startProxy(t, testConfig{Resolver: dns, Fleet: fleet.Config{ProbeInterval: time.Hour, Discover: []discover.Group{g}}})
	cfg := s.Config()
	id := fmt.Sprintf("_http._tcp.engines.test@127.0.0.1:%d", a.Port())
	eventually(t, "the replica to be found", func() bool { return s.Router().Has(id) })
	g.Region = "eu"
	cfg.Discover = []discover.Group{g}
	apply(t, s, cfg)
	eventually(t, "the new region", func() bool { return stateOr(s, id).Region == "eu" })
	g.Scheme = "https"
	cfg.Discover = []discover.Group{g}
	apply(t, s, cfg)
	eventually(t, "the new scheme", func() bool { u := s.Upstream(id); return u != nil && strings.HasPrefix(u.URL(), "https://") })
}
