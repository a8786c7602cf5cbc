package sim

import (
	"math"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

const mooncakePath = "../../../shared/data/traces/mooncake_conversation_trace.jsonl"

func loadMooncake(tb testing.TB) []trace.Request {
	tb.Helper()
	if _, err := os.Stat(mooncakePath); err != nil {
		tb.Skipf("Mooncake trace not available at %s (it lives in ../shared/data on developer machines and CI): %v", mooncakePath, err)
	}
	reqs, err := trace.ReadFile(mooncakePath, trace.FormatMooncake)
	if err != nil {
		tb.Fatal(err)
	}
	return reqs
}

// On one replica large enough never to evict, the cache hit ratio is the
// trace's block reuse (37.4%), less what concurrency costs: a prefix still
// being prefilled by one request is not yet cached for the next.
func TestMooncakeHitRatioOnOneLargeReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("long: simulates the whole Mooncake trace")
	}
	reqs := loadMooncake(t)
	p := profile(t, "paper")
	p.KVCapacityTokens = 1 << 30
	// Four times faster than the paper's engine, so one replica keeps up.
	p.PrefillUSPerToken /= 4
	p.StepBaseUS /= 4
	reps := []Replica{{ID: "big", RTT: 10 * time.Millisecond, Profile: p}}
	res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: newPolicy(t, "round-robin"), MaxInflight: 64})
	if err != nil {
		t.Fatal(err)
	}
	if res.Run.Failed != 0 {
		t.Fatalf("%d requests failed", res.Run.Failed)
	}
	got := res.Run.CacheHitRatio
	t.Logf("hit ratio %.4f, TTFT p50 %.0f ms p95 %.0f ms", got, res.Run.TTFT.P50, res.Run.TTFT.P95)
	if math.Abs(got-0.374) > 0.01 {
		t.Errorf("cache hit ratio %.4f, want 0.374 ± 0.01 (the trace's block reuse)", got)
	}
}

// BenchmarkSimMooncake simulates the whole Mooncake conversation trace over
// the paper topology, once per policy.
func BenchmarkSimMooncake(b *testing.B) {
	reqs := loadMooncake(b)
	top, _ := LoadTopology("paper")
	reps, err := top.Resolve()
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"round-robin", "gorgo", "clairvoyant"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var events, steps int64
			var peak uint64
			for b.Loop() {
				p, err := policy.New(name, policy.Options{})
				if err != nil {
					b.Fatal(err)
				}
				res, err := Run(Config{Replicas: reps, Requests: reqs, Policy: p, MaxInflight: 64, Seed: 1})
				if err != nil {
					b.Fatal(err)
				}
				events, steps = res.Events, res.Steps+res.OracleSteps
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				peak = max(peak, ms.HeapSys)
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(float64(events)/sec, "events/s")
			b.ReportMetric(float64(len(reqs))/sec, "requests/s")
			b.ReportMetric(float64(steps), "steps/op")
			b.ReportMetric(float64(peak)/(1<<20), "heap-MiB")
		})
	}
}
