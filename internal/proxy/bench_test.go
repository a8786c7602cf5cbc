package proxy

import (
	"bufio"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

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
