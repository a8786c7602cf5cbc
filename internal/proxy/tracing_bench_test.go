package proxy

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/tracing/tracingtest"
)

// BenchmarkProxyOverheadTracing is BenchmarkProxyOverhead with tracing off
// and on side by side: each iteration sends one request straight to an
// emulated replica, one through a proxy without tracing and one through a
// proxy tracing every request (ratio 1.0, a batch every 50 ms) to an OTLP
// receiver in the same process, each with a fresh prompt.
func BenchmarkProxyOverheadTracing(b *testing.B) {
	rep := startReplica(b, 0, emulator.Faults{})
	_, off := startProxy(b, testConfig{}, rep)
	rc := tracingtest.Start(b)
	traced, on := startProxy(b, testConfig{}, rep)
	tr := startTracing(b, rc, 1)
	traced.Core().SetTracer(tr.Tracer())
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for _, tokens := range []int{1000, 16000} {
		b.Run(map[int]string{1000: "prompt=1k", 16000: "prompt=16k"}[tokens], func(b *testing.B) {
			var direct, untraced, tracedTTFT []float64
			i := 0
			filler := strings.Repeat("word ", tokens*4/5)
			for b.Loop() {
				i++
				direct = append(direct, float64(ttft(b, client, rep.URL, chatBody(fmt.Sprintf("direct %d %s", i, filler), 2, true)))/1e6)
				untraced = append(untraced, float64(ttft(b, client, off, chatBody(fmt.Sprintf("off %d %s", i, filler), 2, true)))/1e6)
				tracedTTFT = append(tracedTTFT, float64(ttft(b, client, on, chatBody(fmt.Sprintf("on %d %s", i, filler), 2, true)))/1e6)
			}
			for _, s := range [][]float64{direct, untraced, tracedTTFT} {
				slices.Sort(s)
			}
			p := report.Percentile
			b.ReportMetric(p(untraced, 0.5)-p(direct, 0.5), "off-added-p50-ms")
			b.ReportMetric(p(untraced, 0.99)-p(direct, 0.99), "off-added-p99-ms")
			b.ReportMetric(p(tracedTTFT, 0.5)-p(direct, 0.5), "on-added-p50-ms")
			b.ReportMetric(p(tracedTTFT, 0.99)-p(direct, 0.99), "on-added-p99-ms")
			b.ReportMetric(p(direct, 0.5), "direct-p50-ms")
		})
	}
}
