package fleet_test

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// An engine that restarted (its counters went back) has an empty cache:
// the router forgets what it believed the replica held.
func TestRestartedEngineIsForgotten(t *testing.T) {
	var mu sync.Mutex
	promptTotal, scraped := 5000, 0
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			mu.Lock()
			defer mu.Unlock()
			if promptTotal == 5000 {
				scraped++
			}
			fmt.Fprintf(w, "sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\nsglang:max_total_num_tokens 983549\nsglang:prompt_tokens_total %d\n", promptTotal)
			return
		}
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"completion_tokens":1}}`)
	})
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ScrapeInterval: 20 * time.Millisecond}}, up)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(strings.Repeat("a long prompt ", 200), 1, false)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := stateOr(s, "a").IndexBlocks; n == 0 {
		t.Fatal("nothing indexed")
	}
	// A second scrape is asked for once the first was read: the router
	// has seen the counter before it goes back, however slow the machine.
	eventually(t, "two scrapes", func() bool { mu.Lock(); defer mu.Unlock(); return scraped >= 2 })
	mu.Lock()
	promptTotal = 12 // the engine came back from a restart
	mu.Unlock()
	eventually(t, "the router to forget the replica's cache", func() bool { return stateOr(s, "a").IndexBlocks == 0 })
}

// The router sizes a replica's share of the prefix index from the KV
// capacity its engine reports, not only from the configured profile.
func TestScrapedKVCapacitySizesTheIndex(t *testing.T) {
	p, _ := engine.LookupProfile("paper")
	p.KVCapacityTokens = 123456
	srv, err := emulator.New(emulator.Config{Profile: p, Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Run(ctx)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	s, _ := startProxy(t, testConfig{Fleet: fleet.Config{ScrapeInterval: 20 * time.Millisecond}}, fakeReplica(hs.URL))
	deadline := time.Now().Add(5 * time.Second)
	for s.Router().Replicas()[0].KVCapacityTokens != 123456/16*16 {
		if time.Now().After(deadline) {
			t.Fatalf("capacity %d, want the engine's", s.Router().Replicas()[0].KVCapacityTokens)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A replica whose engine serves more requests than this router sent there
// serves others' too (another router that does not share state, clients
// that bypass it): the router shows how many, and says so once it lasts,
// and again once it is over.
func TestForeignLoadIsShown(t *testing.T) {
	var mu sync.Mutex
	running, waiting := 6, 4
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(w, "sglang:num_running_reqs %d\nsglang:num_queue_reqs %d\nsglang:max_total_num_tokens 983549\nsglang:prompt_tokens_total 10\n", running, waiting)
			return
		}
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"completion_tokens":1}}`)
	})
	var logs servetest.Log
	s, _ := startProxy(t, testConfig{Fleet: fleet.Config{ScrapeInterval: 10 * time.Millisecond}, Log: slog.New(slog.NewTextHandler(&logs, nil))}, up)
	eventually(t, "10 requests from elsewhere shown", func() bool { return s.metric("gorgo_replica_foreign_requests", "a") == 10 })
	eventually(t, "the router to say so", func() bool {
		return strings.Contains(logs.String(), "replica serves requests this router did not send")
	})
	mu.Lock()
	running, waiting = 0, 0
	mu.Unlock()
	eventually(t, "none shown", func() bool { return s.metric("gorgo_replica_foreign_requests", "a") == 0 })
	eventually(t, "the router to say it is over", func() bool { return strings.Contains(logs.String(), "replica serves no more requests from elsewhere") })
	if n := strings.Count(logs.String(), "replica serves requests this router did not send"); n != 1 {
		t.Errorf("said %d times, want once:\n%s", n, logs.String())
	}
}

// A reload that shortens the probe and scrape intervals takes effect at
// once: the loops do not wait out the old interval (an hour here).
func TestReloadShortensIntervalsAtOnce(t *testing.T) {
	var mu sync.Mutex
	probes, scrapes := 0, 0
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case "/health":
			probes++
		case "/metrics":
			scrapes++
			io.WriteString(w, "sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n")
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(hs.Close) // after the router's end
	up := fakeReplica(hs.URL)
	count := func() (int, int) { mu.Lock(); defer mu.Unlock(); return probes, scrapes }
	s, _ := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, ScrapeInterval: time.Hour}}, up)
	eventually(t, "the first probe and scrape", func() bool { p, sc := count(); return p >= 1 && sc >= 1 })
	p0, s0 := count()
	cfg := s.Config()
	cfg.ProbeInterval, cfg.ScrapeInterval = 20*time.Millisecond, 20*time.Millisecond
	apply(t, s, cfg)
	eventually(t, "probes and scrapes at the new interval", func() bool { p, sc := count(); return p >= p0+3 && sc >= s0+3 })
}

// probedRTT probes a fleet of one replica, a, once, and returns its round
// trip; it fails the test if the probe did not make it available.
func probedRTT(t *testing.T, cfg fleet.Config) time.Duration {
	t.Helper()
	f, err := fleet.New(cfg, fleet.Options{Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	f.ProbeOnce(t.Context())
	st, _ := f.Router().Replica("a")
	if !st.Available() {
		t.Fatal("the replica is not up after a probe")
	}
	return st.RTT
}

// SGLang's /health has its scheduler generate a token and answers a second
// later (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION, its default): that
// second is not the network's. The probe's round trip is its model list's,
// which is answered at once. (Here the check
// takes two seconds, so that a loaded machine's loopback cannot pass for it.)
func TestSlowHealthCheckIsNotTheRoundTrip(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			time.Sleep(2 * time.Second)
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		}
	}))
	defer up.Close()
	if rtt := probedRTT(t, fleet.Config{Replicas: []fleet.ReplicaConfig{{ID: "a", URL: up.URL}}}); rtt >= time.Second {
		t.Fatalf("round trip %v: the health check's seconds taken for the network", rtt)
	}
	// A replica whose config lists its models has its list asked too, only
	// to time it.
	listed := fleet.Config{Replicas: []fleet.ReplicaConfig{{ID: "a", URL: up.URL, Models: []string{"m"}}}}
	if rtt := probedRTT(t, listed); rtt >= time.Second {
		t.Fatalf("round trip %v of a replica whose config lists its models: the health check's seconds taken for the network", rtt)
	}
}

// A probe's round trip is one request's, its model list's, not the least
// of its two requests' (/health's and the list's): the least of two draws
// of a jittery link is below the link's mean, and drew the router to far
// replicas. Here /health answers after 200 ms and the list after 300 ms;
// the probe takes the list's 300 ms (it took /health's 200 before), with
// or without the models in the config.
func TestProbeIsOneDrawOfTheRoundTrip(t *testing.T) {
	const healthWait, listWait = 200 * time.Millisecond, 300 * time.Millisecond
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			time.Sleep(healthWait)
		case "/v1/models":
			time.Sleep(listWait)
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		}
	}))
	defer up.Close()
	for _, models := range [][]string{nil, {"m"}} {
		cfg := fleet.Config{Replicas: []fleet.ReplicaConfig{{ID: "a", URL: up.URL, Models: models}}}
		if rtt := probedRTT(t, cfg); rtt < listWait {
			t.Errorf("config's models %v: round trip %v, want the list's %v or more", models, rtt, listWait)
		}
	}
	// A list not answered leaves /health's time.
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			panic(http.ErrAbortHandler) // the connection cut: no answer
		}
	}))
	defer down.Close()
	cfg := fleet.Config{Replicas: []fleet.ReplicaConfig{{ID: "a", URL: down.URL, Models: []string{"m"}}}}
	if rtt := probedRTT(t, cfg); rtt <= 0 || rtt >= time.Second {
		t.Errorf("a list not answered: round trip %v, want /health's", rtt)
	}
}

// A list far slower than /health (a large one, a stalled server) is not
// the network either, and a probe does not wait out a list that hangs
// (review, 2026-12-06: a list answered after 1.5 s was taken for the
// round trip of a replica /health found at once, and a hanging list held
// every probe, the one before serving included, for 5 s).
func TestSlowListIsNotTheRoundTrip(t *testing.T) {
	for _, hang := range []bool{false, true} {
		release := make(chan struct{})
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/models" {
				if hang {
					select {
					case <-release:
					case <-r.Context().Done():
					}
					return
				}
				time.Sleep(1500 * time.Millisecond)
				io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			}
		}))
		t.Cleanup(up.Close)
		t.Cleanup(func() { close(release) }) // before the server's Close, which waits for it
		start := time.Now()
		cfg := fleet.Config{Replicas: []fleet.ReplicaConfig{{ID: "a", URL: up.URL, Models: []string{"m"}}}}
		rtt := probedRTT(t, cfg)
		if took := time.Since(start); hang && took >= 3*time.Second {
			t.Errorf("a hanging list held the probe %v", took)
		}
		if rtt >= time.Second {
			t.Errorf("hanging %v: round trip %v, the list's wait taken for the network", hang, rtt)
		}
	}
}

// A probe on a new connection is timed from its request written: the
// dial and the TLS handshake (which a replica across an ocean takes two
// or three round trips for) are not the round trip a request sees on the
// connections the router keeps.
func TestHandshakeIsNotTheRoundTrip(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close") // every probe's request on a new connection
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		}
	}))
	up.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		time.Sleep(2 * time.Second) // a slow handshake
		return nil, nil
	}}
	up.StartTLS()
	defer up.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fleet.Config{UpstreamTLS: fleet.UpstreamTLSConfig{CAFile: ca}, Replicas: []fleet.ReplicaConfig{{ID: "a", URL: up.URL}}}
	if rtt := probedRTT(t, cfg); rtt >= time.Second {
		t.Fatalf("round trip %v: the handshake's seconds taken for the network", rtt)
	}
}
