package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// BenchmarkLiveView is a streamed ~1k-token request through the proxy to
// a canned upstream, one at a time, with the live view closed and open (a
// page reading /admin/ui/stream, a snapshot a second).
func BenchmarkLiveView(b *testing.B) {
	up := servetest.Canned(b)
	cfg := testConfig{Fleet: fleet.Config{ProbeInterval: time.Second, ScrapeInterval: time.Hour}}
	for i := range 16 {
		cfg.Fleet.Replicas = append(cfg.Fleet.Replicas, fleet.ReplicaConfig{ID: fmt.Sprintf("r%d", i), URL: up, Region: fmt.Sprintf("g%d", i%3), Profile: "paper"})
	}
	s := startAdmin(b, cfg)
	url, admin := s.client, s.adminURL
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	body := servetest.ChatBody(strings.Repeat("a few words of a prompt ", 160), 17, true)
	run := func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	b.Run("view=closed", run)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, admin+"/admin/ui/stream", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	var snapshots atomic.Int64
	go func() {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<24)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: ") {
				snapshots.Add(1)
			}
		}
	}()
	b.Run("view=open", run)
	if snapshots.Load() == 0 {
		b.Error("the open view received no snapshot")
	}
}

// BenchmarkLiveViewSnapshot is the live view's snapshot of a 1,000-replica
// fleet (built and encoded once a second per page open), with 15 minutes
// of history and 50 decisions.
func BenchmarkLiveViewSnapshot(b *testing.B) {
	up := servetest.Canned(b)
	cfg := testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, ScrapeInterval: time.Hour}}
	for i := range 1000 {
		cfg.Fleet.Replicas = append(cfg.Fleet.Replicas, fleet.ReplicaConfig{ID: fmt.Sprintf("r%04d", i), URL: up, Region: fmt.Sprintf("g%d", i%12), Profile: "paper"})
	}
	s := startAdmin(b, cfg).admin
	now := time.Now()
	for i := range historyPoints {
		share := map[string]float64{}
		for j := range 8 {
			share[fmt.Sprintf("r%04d", (i+j)%1000)] = 0.125
		}
		s.view.mu.Lock()
		s.view.points = append(s.view.points[:min(len(s.view.points), historyPoints-1)], point{T: now.Unix() - int64(historyPoints-i), RPS: 100, Share: share})
		s.view.mu.Unlock()
	}
	var size int
	b.ReportAllocs()
	for b.Loop() {
		data, err := json.Marshal(s.snapshot(now.Unix() - 1))
		if err != nil {
			b.Fatal(err)
		}
		size = len(data)
	}
	b.ReportMetric(float64(size), "bytes/snapshot")
}
