package proxy

import (
	"bufio"
	"bytes"
	"context"
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
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/servetest"
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
	_, url := startProxy(b, testConfig{}, rep)
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
				direct = append(direct, float64(ttft(b, client, rep.URL, chatBody(fmt.Sprintf("direct %d %s", i, filler), 2, true)))/1e6)
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

// BenchmarkProxyRequests is the proxy's request path under concurrent
// load, against a canned upstream: ~1k-token chat requests (4 KB bodies),
// non-streaming and streaming (21 events), through 1 or 16 replicas. The
// figure is the client's, upstream's and proxy's CPU together (one
// process); profile it to see the proxy's share.
func BenchmarkProxyRequests(b *testing.B) {
	up := servetest.Canned(b)
	for _, replicas := range []int{1, 16} {
		var cfg fleet.Config
		for i := range replicas {
			cfg.Replicas = append(cfg.Replicas, fleet.ReplicaConfig{ID: fmt.Sprint("r", i), URL: up, Profile: "paper"})
		}
		cfg.ProbeInterval, cfg.ScrapeInterval = time.Hour, time.Hour
		reg := prometheus.NewRegistry()
		f, err := fleet.New(cfg, fleet.Options{Registry: reg})
		if err != nil {
			b.Fatal(err)
		}
		s, err := New(f, Config{}, reg, reg, nil)
		if err != nil {
			b.Fatal(err)
		}
		f.ProbeOnce(context.Background())
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
	_, url := startProxy(b, testConfig{Proxy: Config{MaxInFlight: 2000}}, reps...)
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
	_, url := startProxy(b, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, fakeReplica(up.URL))
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
