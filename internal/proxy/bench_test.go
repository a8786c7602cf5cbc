package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/report"
)

// ttft sends a streaming request and returns the time to its first content chunk.
func ttft(b *testing.B, client *http.Client, url, body string) time.Duration {
	start := time.Now()
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var first time.Duration
	for sc.Scan() {
		if first == 0 && strings.Contains(sc.Text(), `"content":" `) {
			first = time.Since(start)
		}
	}
	return first
}

// BenchmarkProxyOverhead measures what the proxy adds to a request's TTFT:
// the same requests, one at a time, to an emulated replica directly and
// through the proxy (parsing, hashing, routing, forwarding, streaming back).
func BenchmarkProxyOverhead(b *testing.B) {
	rep := startReplica(b, 0, emulator.Faults{})
	_, url := startProxy(b, Config{}, rep)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for _, tokens := range []int{1000, 16000} {
		b.Run(map[int]string{1000: "prompt=1k", 16000: "prompt=16k"}[tokens], func(b *testing.B) {
			var direct, proxied []float64
			i := 0
			for b.Loop() {
				// A fresh prompt each time (it starts with a counter), so
				// neither path hits a cache.
				filler := strings.Repeat("word ", tokens*4/5)
				i++
				direct = append(direct, float64(ttft(b, client, rep.url, chatBody(fmt.Sprintf("direct %d %s", i, filler), 2, true)))/1e6)
				proxied = append(proxied, float64(ttft(b, client, url, chatBody(fmt.Sprintf("proxied %d %s", i, filler), 2, true)))/1e6)
			}
			slices.Sort(direct)
			slices.Sort(proxied)
			b.ReportMetric(report.Percentile(proxied, 0.5)-report.Percentile(direct, 0.5), "added-p50-ms")
			b.ReportMetric(report.Percentile(proxied, 0.99)-report.Percentile(direct, 0.99), "added-p99-ms")
			b.ReportMetric(report.Percentile(direct, 0.5), "direct-p50-ms")
		})
	}
}

// cannedUpstream answers every completion at once with a canned answer: a
// chat.completion, or 17 content chunks, a finish chunk, a usage chunk and
// [DONE] (21 events), each flushed on its own.
func cannedUpstream(b *testing.B) string {
	b.Helper()
	body := `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"canned"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1000,"completion_tokens":17,"total_tokens":1017,"prompt_tokens_details":{"cached_tokens":0}}}`
	var events []string
	events = append(events, `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n")
	for range 17 {
		events = append(events, `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" tok"}}]}`+"\n\n")
	}
	events = append(events, `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n",
		`data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":17,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\n",
		"data: [DONE]\n\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/health" {
			return
		}
		if !bytes.Contains(data, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, body)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			io.WriteString(w, e)
			w.(http.Flusher).Flush()
		}
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

// BenchmarkProxyRequests is the proxy's request path under concurrent
// load, against a canned upstream: ~1k-token chat requests (4 KB bodies),
// non-streaming and streaming (21 events), through 1 or 16 replicas. The
// figure is the client's, upstream's and proxy's CPU together (one
// process); profile it to see the proxy's share.
func BenchmarkProxyRequests(b *testing.B) {
	up := cannedUpstream(b)
	for _, replicas := range []int{1, 16} {
		var cfg Config
		for i := range replicas {
			cfg.Replicas = append(cfg.Replicas, ReplicaConfig{ID: fmt.Sprint("r", i), URL: up, Profile: "paper"})
		}
		cfg.ProbeInterval, cfg.ScrapeInterval, cfg.Admin.Listen = time.Hour, time.Hour, AdminOff
		s, err := New(cfg, nil, prometheus.NewRegistry(), "", nil)
		if err != nil {
			b.Fatal(err)
		}
		s.ProbeOnce(context.Background())
		ts := httptest.NewServer(s.Handler())
		for _, stream := range []bool{false, true} {
			b.Run(fmt.Sprintf("replicas=%d/stream=%v", replicas, stream), func(b *testing.B) {
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
				var n atomic.Int64
				b.SetParallelism(32)
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						i := n.Add(1)
						body := chatBody(fmt.Sprintf("%d %s", i, strings.Repeat("word ", 800)), 17, stream)
						resp, err := client.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
						if err != nil {
							b.Fatal(err)
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 200 {
							b.Fatalf("status %d", resp.StatusCode)
						}
					}
				})
			})
		}
		ts.Close()
	}
}

// BenchmarkThousandStreams opens 1,000 streams at once through the proxy
// to three emulated replicas and reads them all to [DONE], round after
// round. It reports the streams that did not complete, and how the
// goroutines and the heap grew per round after the first (which fills the
// connection pools: a leak grows with every round, pooled connections do
// not).
func BenchmarkThousandStreams(b *testing.B) {
	reps := []*replica{startReplica(b, 5*time.Millisecond, emulator.Faults{}), startReplica(b, 20*time.Millisecond, emulator.Faults{}),
		startReplica(b, 40*time.Millisecond, emulator.Faults{})}
	_, url := startProxy(b, Config{MaxInFlight: 2000}, reps...)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1000}}
	heap := func() float64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return float64(m.HeapAlloc) / (1 << 20)
	}
	var failed atomic.Int64
	round := func() {
		var wg sync.WaitGroup
		for i := range 1000 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(fmt.Sprintf("stream %d %s", i, strings.Repeat("w ", 200)), 20, true)))
				if err != nil {
					failed.Add(1)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !bytes.Contains(body, []byte("[DONE]")) {
					failed.Add(1)
				}
			}()
		}
		wg.Wait()
	}
	round() // fills the pools
	time.Sleep(100 * time.Millisecond)
	g0, h0 := runtime.NumGoroutine(), heap()
	rounds := 0
	for b.Loop() {
		round()
		rounds++
	}
	time.Sleep(100 * time.Millisecond)
	b.ReportMetric(float64(failed.Load()), "failed")
	b.ReportMetric(float64(runtime.NumGoroutine()-g0)/float64(rounds), "goroutines-growth/round")
	b.ReportMetric((heap()-h0)/float64(rounds), "heap-MiB-growth/round")
}

// BenchmarkCancelOnClientGone measures how long after a client closes a
// stream mid-answer the replica's request is cancelled (the proxy's
// upstream request context ends).
func BenchmarkCancelOnClientGone(b *testing.B) {
	cancelled := make(chan time.Time, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}`+"\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				cancelled <- time.Now()
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}))
	b.Cleanup(up.Close)
	_, url := startProxy(b, Config{ProbeInterval: time.Hour}, &replica{url: up.URL})
	var lat []float64
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(chatBody("go on", 100000, true)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 64)
		resp.Body.Read(buf)
		gone := time.Now()
		cancel()
		resp.Body.Close()
		lat = append(lat, float64((<-cancelled).Sub(gone))/1e6)
	}
	slices.Sort(lat)
	b.ReportMetric(report.Percentile(lat, 0.5), "cancel-p50-ms")
	b.ReportMetric(lat[len(lat)-1], "cancel-max-ms")
}

// BenchmarkLiveView is a streamed ~1k-token request through the proxy to
// a canned upstream, one at a time, with the live view closed and open (a
// page reading /admin/ui/stream, a snapshot a second).
func BenchmarkLiveView(b *testing.B) {
	up := cannedUpstream(b)
	cfg := Config{ProbeInterval: time.Second, ScrapeInterval: time.Hour}
	for i := range 16 {
		cfg.Replicas = append(cfg.Replicas, ReplicaConfig{ID: fmt.Sprintf("r%d", i), URL: up, Region: fmt.Sprintf("g%d", i%3), Profile: "paper"})
	}
	s, url := startProxy(b, cfg)
	admin := adminURL(b, s)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	body := chatBody(strings.Repeat("a few words of a prompt ", 160), 17, true)
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
	up := cannedUpstream(b)
	cfg := Config{ProbeInterval: time.Hour, ScrapeInterval: time.Hour}
	for i := range 1000 {
		cfg.Replicas = append(cfg.Replicas, ReplicaConfig{ID: fmt.Sprintf("r%04d", i), URL: up, Region: fmt.Sprintf("g%d", i%12), Profile: "paper"})
	}
	s, _ := startProxy(b, cfg)
	now := time.Now()
	for i := range historyPoints {
		share := map[string]float64{}
		for j := range 8 {
			share[fmt.Sprintf("r%04d", (i+j)%1000)] = 0.125
		}
		s.dash.mu.Lock()
		s.dash.points = append(s.dash.points[:min(len(s.dash.points), historyPoints-1)], point{T: now.Unix() - int64(historyPoints-i), RPS: 100, Share: share})
		s.dash.mu.Unlock()
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
