package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/replay"
	"github.com/gorgo-llm/gorgo/internal/trace"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// chromium finds Debian's chromium (installed by .ci/run), or "".
func chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// The live view in a real browser: emulated replicas, gorgo serve, a
// short replay; the page shows every replica with a round trip, a decision
// with its cost terms, charts with points, and a drain click changes the
// replica's state. It saves a screenshot (GORGO_SCREENSHOT=path to keep it).
func TestLiveViewInChromium(t *testing.T) {
	bin := chromium()
	if bin == "" {
		t.Skip("chromium is not installed (.ci/run installs Debian's with apt-get): the live view is not checked in a browser")
	}
	// The default policy tuning itself, as gorgo serve runs it.
	o, err := tune.NewOnline(tune.OnlineConfig{Base: policy.DefaultName, Window: 256, Block: time.Minute, ES: tune.Config{Seed: 1}})
	if err != nil {
		t.Fatal(err)
	}
	s := startAdmin(t, testConfig{Policy: o}, startReplica(t, 20*time.Millisecond, emulator.Faults{}), startReplica(t, 60*time.Millisecond, emulator.Faults{}))
	url, admin := s.client, s.adminURL
	// Traffic while the page watches: 40 requests over 8 s.
	reqs, err := trace.Generate(trace.GenConfig{Preset: "artchat", Seed: 5, Duration: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	reqs = reqs[:40]
	for i := range reqs {
		reqs[i].Time = time.Duration(i) * 200 * time.Millisecond
		reqs[i].OutputTokens = min(reqs[i].OutputTokens, 20)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := replay.Run(ctx, replay.Config{Target: url, Requests: reqs})
		done <- err
	}()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.Flag("headless", true),
		chromedp.WindowSize(1400, 1800))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	var rows, rtts []string
	err = chromedp.Run(bctx,
		chromedp.Navigate(admin+"/admin/ui/"),
		chromedp.Click("#connect", chromedp.ByQuery),
		// Every replica listed with a round trip.
		chromedp.WaitVisible(`#replicas tbody tr[data-id="b"]`, chromedp.ByQuery),
		chromedp.Evaluate(`[...document.querySelectorAll("#replicas tbody tr")].map(r => r.dataset.id)`, &rows),
		chromedp.Evaluate(`[...document.querySelectorAll("#replicas tbody td.rtt")].map(td => td.textContent)`, &rtts),
	)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || len(rtts) != 2 {
		t.Fatalf("replicas listed %v, round trips %v", rows, rtts)
	}
	for _, r := range rtts {
		var v float64
		if _, err := fmt.Sscan(r, &v); err != nil || v <= 0 {
			t.Errorf("a replica's round trip shows %q", r)
		}
	}
	// The map: each region with its replicas and mean round trip.
	var regions []string
	if err := chromedp.Run(bctx, chromedp.Evaluate(`[...document.querySelectorAll("#map text")].map(t => t.textContent).filter(v => v !== "router")`, &regions)); err != nil {
		t.Fatal(err)
	}
	if len(regions) != 2 {
		t.Fatalf("the map shows %q, want the two regions", regions)
	}
	for _, g := range regions {
		var name string
		var n, ms int
		if _, err := fmt.Sscanf(g, "%s · %d · %d ms", &name, &n, &ms); err != nil || n != 1 || ms <= 0 {
			t.Errorf("the map shows a region as %q (%v), want its one replica and its round trip", g, err)
		}
	}
	// A decision with its cost terms and, once it ended, its TTFT; charts
	// with points.
	var terms string
	var points int
	deadline := time.Now().Add(60 * time.Second)
	for {
		err = chromedp.Run(bctx,
			chromedp.Evaluate(`(document.querySelector("#decisions tbody tr.decision td.terms")||{}).textContent||""`, &terms),
			chromedp.Evaluate(`(() => { const d = window.gorgoCharts.latency.data; return d[0].length && d[2].filter(v => v != null).length })()`, &points),
		)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(terms, "=") && points > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision with cost terms (%q) or no TTFT points (%d)", terms, points)
		}
		time.Sleep(500 * time.Millisecond)
	}
	var ttft string
	if err := chromedp.Run(bctx, chromedp.Evaluate(`[...document.querySelectorAll("#decisions td.ttft")].map(td => td.textContent).find(v => v !== "–") || ""`, &ttft)); err != nil || ttft == "" {
		t.Errorf("no decision shows its measured TTFT (%v)", err)
	}
	// The tuner's line: the candidate it is trying and how far its round is.
	var tuner string
	if err := chromedp.Run(bctx, chromedp.Text("#tuner-steps", &tuner, chromedp.ByQuery)); err != nil || !strings.Contains(tuner, "tuner running · trying ") || !strings.Contains(tuner, "/256") {
		t.Errorf("the tuner's line reads %q (%v)", tuner, err)
	}
	// Drain b from the page: its state changes. (The table is redrawn
	// every second: the button is clicked as the page holds it then.)
	var state string
	var clicked bool
	err = chromedp.Run(bctx,
		chromedp.Evaluate(`(() => { const b = document.querySelector('button.drain[data-id="b"]'); if (b) b.click(); return !!b })()`, &clicked),
		chromedp.WaitVisible(`#replicas tbody tr.draining[data-id="b"]`, chromedp.ByQuery),
		chromedp.Text(`#replicas tbody tr[data-id="b"] td.state`, &state, chromedp.ByQuery),
	)
	if err != nil || !clicked || state != "draining" {
		t.Fatalf("drain from the page: clicked %v, state %q, %v", clicked, state, err)
	}
	if st, _ := s.Router().Replica("b"); st.State.String() != "draining" {
		t.Errorf("the router says %s", st.State)
	}
	var png []byte
	if err := chromedp.Run(bctx, chromedp.FullScreenshot(&png, 100)); err != nil {
		t.Fatal(err)
	}
	path := os.Getenv("GORGO_SCREENSHOT")
	if path == "" {
		path = filepath.Join(t.TempDir(), "live-view.png")
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("replay: %v", err)
	}
}

// The page's files need no token (they hold no data); its data stream
// does, when the admin API does, and then pushes snapshots of the fleet.
func TestLiveViewStreamNeedsTheToken(t *testing.T) {
	t.Setenv("GORGO_TEST_UI_TOKEN", "a-token-long-enough-for-the-view")
	admin := startAdmin(t, testConfig{Admin: Config{TokenEnv: "GORGO_TEST_UI_TOKEN"}}, startReplica(t, 5*time.Millisecond, emulator.Faults{})).adminURL
	for _, path := range []string{"/admin/ui/", "/admin/ui/app.js", "/admin/ui/uPlot.iife.min.js"} {
		resp, err := http.Get(admin + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s without a token: %d", path, resp.StatusCode)
		}
	}
	resp, err := http.Get(admin + "/admin/ui/stream")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("the stream without a token: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, admin+"/admin/ui/stream", nil)
	req.Header.Set("Authorization", "Bearer a-token-long-enough-for-the-view")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("the stream with the token: %d %q %v", resp.StatusCode, line, err)
	}
	var snap struct {
		Policy   string
		Replicas []struct {
			ID    string  `json:"id"`
			RTTMS float64 `json:"rtt_ms"`
		}
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &snap); err != nil || snap.Policy != "gorgo-e2e" || len(snap.Replicas) != 1 || snap.Replicas[0].RTTMS <= 0 {
		t.Errorf("first snapshot %+v (%v)", snap, err)
	}
}

// An open live view ends when the router stops, so a shutdown does not wait
// for it (SIGTERM once waited out the grace and failed).
func TestLiveViewEndsWithTheRouter(t *testing.T) {
	rep := startReplica(t, 5*time.Millisecond, emulator.Faults{})
	f, err := fleet.New(fleet.Config{ProbeInterval: 100 * time.Millisecond, ScrapeInterval: 100 * time.Millisecond,
		Replicas: []fleet.ReplicaConfig{{ID: "a", URL: rep.URL, Profile: "paper"}}}, fleet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	view := NewView()
	s, err := New(f, view, Config{}, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.ProbeOnce(ctx)
	done := make(chan error, 2)
	go func() { done <- f.Run(ctx) }()
	go func() { done <- s.Run(ctx) }()
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/admin/ui/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	ended := make(chan struct{})
	go func() { io.Copy(io.Discard, resp.Body); close(ended) }()
	cancel()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the live view's stream outlived the router")
	}
	<-done
	<-done
}

// The live view sends its regions summed (the map draws them) and, of a
// large fleet, its busiest replicas, as many as the page lists, not every
// replica each second (2026-12-07, a user's test: 137 KB a second for 500 replicas).
func TestLiveViewOfALargeFleet(t *testing.T) {
	var reps []fleet.ReplicaConfig
	for i := range 250 {
		reps = append(reps, fleet.ReplicaConfig{ID: fmt.Sprint("r", i), URL: "http://127.0.0.1:1", Region: fmt.Sprint("region-", i%4), Models: []string{"m"}})
	}
	s := startAdmin(t, testConfig{Fleet: fleet.Config{Replicas: reps, ProbeInterval: time.Hour, ScrapeInterval: time.Hour}})
	snap := s.admin.snapshot(0)
	listed, _ := snap["replicas"].([]uiReplica)
	regions, _ := snap["regions"].(map[string]*uiRegion)
	if len(listed) != maxUIReplicas || snap["replica_count"] != 250 || len(regions) != 4 {
		t.Fatalf("a fleet of 250: %d replicas listed, count %v, %d regions", len(listed), snap["replica_count"], len(regions))
	}
	n := 0
	for _, g := range regions {
		n += g.Replicas
	}
	if n != 250 {
		t.Errorf("the regions sum %d replicas, want 250", n)
	}
	small := startAdmin(t, testConfig{}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	snap = small.admin.snapshot(0)
	if regions, _ := snap["regions"].(map[string]*uiRegion); len(regions) != 1 || len(snap["replicas"].([]uiReplica)) != 1 {
		t.Errorf("a fleet of one: regions %v, replicas %v", snap["regions"], snap["replicas"])
	}
}
