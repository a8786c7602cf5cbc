// Package deploy holds gorgo's deployment files (Grafana dashboard,
// Kubernetes manifests, Envoy bootstrap) and the tests that check them
// against the real things.
package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admin"
	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/replay"
	"github.com/gorgo-llm/gorgo/internal/serve"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// dashboardExprs returns every PromQL expression of the Grafana dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("grafana/gorgo.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana/gorgo.json: %v", err)
	}
	var out []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	if len(out) < 10 {
		t.Fatalf("only %d queries in the dashboard", len(out))
	}
	return out
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// Debian's prometheus scrapes a gorgo serve under a short replay to
// emulated replicas, and every query of the Grafana dashboard returns
// series without error.
func TestDashboardQueriesAgainstPrometheus(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (.ci/run installs Debian's with apt-get): the dashboard's queries are not checked")
	}
	exprs := dashboardExprs(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Two emulated replicas and a proxy in front of them, with a TTFT SLO
	// (generous: admission says go) so its series exist.
	p, err := engine.LookupProfile("paper")
	if err != nil {
		t.Fatal(err)
	}
	cfg := serve.Config{Config: fleet.Config{ProbeInterval: 200 * time.Millisecond, ScrapeInterval: 200 * time.Millisecond, TTFTSLO: time.Minute}, Admin: admin.Config{Listen: admin.Off}}
	for i := range 2 {
		em, err := emulator.New(emulator.Config{Profile: p, Speedup: 20})
		if err != nil {
			t.Fatal(err)
		}
		go em.Run(ctx)
		srv := httptest.NewServer(em.Handler())
		defer srv.Close()
		cfg.Replicas = append(cfg.Replicas, fleet.ReplicaConfig{ID: fmt.Sprintf("r%d", i), URL: srv.URL, Region: fmt.Sprintf("region-%d", i), Profile: "paper"})
	}
	px, err := serve.New(cfg, serve.Options{Proxy: true})
	if err != nil {
		t.Fatal(err)
	}
	px.Fleet.ProbeOnce(ctx)
	go px.Run(ctx)
	front := httptest.NewServer(px.Proxy.Handler())
	defer front.Close()

	// Prometheus scraping it every second.
	dir := t.TempDir()
	target, _ := url.Parse(front.URL)
	promCfg := fmt.Sprintf("global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n- job_name: gorgo\n  static_configs: [{targets: [%q]}]\n", target.Host)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(promCfg), 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := freePort(t)
	cmd := exec.CommandContext(ctx, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting prometheus: %v", err)
	}
	defer func() { cancel(); cmd.Wait() }()

	// A short replay: 60 requests over 12 s, streamed.
	reqs, err := trace.Generate(trace.GenConfig{Preset: "artchat", Seed: 3, Duration: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	reqs = reqs[:min(60, len(reqs))]
	for i := range reqs {
		reqs[i].Time = time.Duration(i) * 200 * time.Millisecond
		reqs[i].OutputTokens = min(reqs[i].OutputTokens, 40)
	}
	out, err := replay.Run(ctx, replay.Config{Target: front.URL, Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range out.Records {
		if r.Failed {
			t.Fatalf("request %d failed: %s", r.Index, r.Error)
		}
	}

	// Every query returns series (Prometheus has had ~15 scrapes by now;
	// wait for the last ones to land).
	query := func(expr string) (int, error) {
		resp, err := http.Get("http://" + promAddr + "/api/v1/query?query=" + url.QueryEscape(expr))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var r struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Data   struct {
				Result []json.RawMessage `json:"result"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return 0, err
		}
		if r.Status != "success" {
			return 0, fmt.Errorf("%s", r.Error)
		}
		return len(r.Data.Result), nil
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, expr := range exprs {
		for {
			n, err := query(expr)
			if err == nil && n > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: %d series, error %v", expr, n, err)
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}
