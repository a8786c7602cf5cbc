package proxy

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/discover"
	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// A reload cannot open the admin API: the listener address needs a restart
// and keeps running where it is, so a file that drops the tokens (while the
// running listener is not on loopback) is refused.
func TestReloadKeepsTheAdminLocked(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(tokens, []byte("alice s3cret-s3cret-s3cret\n"), 0o600)
	r := startReplica(t, 2*time.Millisecond, emulator.Faults{})
	cfg := Config{Admin: AdminConfig{Listen: "0.0.0.0:9091", TokenFile: tokens}, Replicas: []ReplicaConfig{{ID: "a", URL: r.url}}}
	s, err := New(cfg, nil, prometheus.NewRegistry(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	admin := adminURL(t, s)
	for _, next := range []AdminConfig{{Listen: "127.0.0.1:9091"}, {}, {Listen: AdminOff}} {
		if err := s.Apply(Config{Admin: next, Replicas: cfg.Replicas}); err == nil {
			t.Errorf("admin %+v: a reload that drops the tokens of a public listener was applied", next)
		}
		if code, _ := do(t, "DELETE", admin+"/admin/replicas/a", ""); code != 401 {
			t.Fatalf("admin %+v: unauthenticated DELETE answered %d", next, code)
		}
	}
}

// A stream whose replica sends its headers and then nothing is given up on
// after the idle limit, and served by another replica (nothing reached the
// client yet).
func TestStallBeforeTheFirstEventFailsOver(t *testing.T) {
	stall := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, Config{ProbeInterval: time.Hour, StreamIdleTimeout: 200 * time.Millisecond}, stall, good)
	client := &http.Client{Timeout: 20 * time.Second} // the failure would be a hang
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("x", 1, true)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(ReplicaHeader) != "b" || !strings.Contains(string(body), "[DONE]") {
		t.Errorf("status %d from %q: %.200s", resp.StatusCode, resp.Header.Get(ReplicaHeader), body)
	}
}

// holdOn dispatches requests until one lands on replica id, and returns its
// ticket (in id's ledger until Finish).
func holdOn(t *testing.T, s *Server, id string) router.Ticket {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		tk, _, err := s.Router().Dispatch(s.now(), &policy.Request{PromptTokens: 10}, rng, nil)
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
	s, _ := startProxy(t, Config{ProbeInterval: time.Hour, Policy: "round-robin"}, startReplica(t, 2*time.Millisecond, emulator.Faults{}), startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	cfg := s.Config()
	ra, rb := cfg.Replicas[0], cfg.Replicas[1]
	tk := holdOn(t, s, "a")
	cfg.Replicas = []ReplicaConfig{rb}
	if err := s.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	if st := replicaState(t, s, "a"); st.State != router.Removing {
		t.Fatalf("a dropped: %v", st.State)
	}
	ra.Region = "elsewhere"
	cfg.Replicas = []ReplicaConfig{ra, rb}
	if err := s.Apply(cfg); err != nil {
		t.Fatal(err)
	}
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
	dns.set(port(t, a))
	g := discover.Group{SRV: "_http._tcp.engines.test", Region: "us", Profile: "paper", Interval: 20 * time.Millisecond}
	cfg := Config{ProbeInterval: time.Hour, Discover: []discover.Group{g}}
	s, err := New(cfg, nil, prometheus.NewRegistry(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetResolver(dns)
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()
	defer func() { cancel(); <-runDone }()
	id := fmt.Sprintf("_http._tcp.engines.test@127.0.0.1:%d", port(t, a))
	eventually(t, "the replica to be found", func() bool { return s.Router().Has(id) })
	g.Region = "eu"
	cfg.Discover = []discover.Group{g}
	if err := s.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new region", func() bool { return stateOr(s, id).Region == "eu" })
	g.Scheme = "https"
	cfg.Discover = []discover.Group{g}
	if err := s.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new scheme", func() bool { u := s.upstream(id); return u != nil && strings.HasPrefix(u.cfg.URL, "https://") })
}
