package emulator

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/replay"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/sim"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// The emulator agrees with the simulator: the same workload replayed
// through one emulated replica and simulated on one replica of the same
// profile gives p50 and p95 TTFT within 10%.
func TestEmulatorAgreesWithSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("runs about 5 s of wall time")
	}
	if raceEnabled {
		t.Skip("a timing check: the race detector slows the emulator's driver and the replayer")
	}
	const speedup = 10
	// 20 s of the synthetic workload at a third of its rate: one replica busy but not overloaded.
	reqs, err := trace.Generate(trace.GenConfig{Preset: "artchat", Seed: 3, Duration: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	model := trace.Apply(reqs, trace.Window{}, 3)
	wall := trace.Apply(reqs, trace.Window{}, 3.0/speedup)

	p, _ := engine.LookupProfile("paper")
	res, err := sim.Run(sim.Config{Replicas: []sim.Replica{{ID: "one", Profile: p}}, Requests: model,
		Policy: mustPolicy(t, "round-robin"), MaxInflight: 64, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}

	_, url := start(t, Config{Profile: p, Speedup: speedup, Spin: true})
	out, err := replay.Run(context.Background(), replay.Config{Target: url, Requests: wall, MaxInflight: 64})
	if err != nil {
		t.Fatal(err)
	}
	// Wall milliseconds at 10x are model milliseconds / 10.
	for i := range out.Records {
		out.Records[i].TTFT *= speedup
	}
	emu := report.NewRun("emulator", out.Records, nil)
	if emu.Failed != 0 || emu.Completed != len(model) {
		t.Fatalf("emulator: %d completed, %d failed of %d", emu.Completed, emu.Failed, len(model))
	}
	t.Logf("TTFT p50/p95 ms: simulator %.0f/%.0f, emulator %.0f/%.0f; hit %.3f vs %.3f",
		res.Run.TTFT.P50, res.Run.TTFT.P95, emu.TTFT.P50, emu.TTFT.P95, res.Run.CacheHitRatio, emu.CacheHitRatio)
	for _, c := range []struct {
		name     string
		sim, emu float64
	}{{"p50", res.Run.TTFT.P50, emu.TTFT.P50}, {"p95", res.Run.TTFT.P95, emu.TTFT.P95}} {
		if math.Abs(c.emu-c.sim) > 0.10*c.sim {
			t.Errorf("TTFT %s: emulator %.0f ms, simulator %.0f ms: more than 10%% apart", c.name, c.emu, c.sim)
		}
	}
}

func mustPolicy(t *testing.T, name string) policy.Policy {
	t.Helper()
	p, err := policy.New(name, policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
