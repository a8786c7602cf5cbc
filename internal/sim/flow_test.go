package sim

import (
	"math"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// flood is the embedded workload's first 20 minutes compressed 4×, its
// sessions drawn into tenants by mix: 4× the load the paper's fleet
// usually serves.
func flood(t *testing.T, mix string) []trace.Request {
	t.Helper()
	reqs, err := trace.Generate(trace.GenConfig{Preset: "artchat", Seed: 1, Duration: 20 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ts, err := trace.ParseTenants(mix)
	if err != nil {
		t.Fatal(err)
	}
	trace.AssignTenants(reqs, ts, 1)
	return trace.Apply(reqs, trace.Window{}, 0.25)
}

func paperFleet(t *testing.T) []Replica {
	t.Helper()
	top, err := LoadTopology("paper")
	if err != nil {
		t.Fatal(err)
	}
	reps, err := top.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	return reps
}

func runFlow(t *testing.T, reqs []trace.Request, a admit.Config) []report.TenantRun {
	t.Helper()
	if a.SLO > 0 {
		if err := a.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	res, err := Run(Config{Replicas: paperFleet(t), Requests: reqs, Policy: newPolicy(t, "gorgo-e2e"), Seed: 1, Admission: a})
	if err != nil {
		t.Fatal(err)
	}
	return report.ByTenant(res.Records, 0)
}

func tenantRun(t *testing.T, runs []report.TenantRun, name string) report.TenantRun {
	t.Helper()
	for _, r := range runs {
		if r.Tenant == name {
			return r
		}
	}
	t.Fatalf("no tenant %s in %+v", name, runs)
	return report.TenantRun{}
}

// A batch tenant floods at three times the interactive tenant's load.
// With flow control the interactive tenant keeps close to its solo p95
// TTFT (it is never refused); without, it waits minutes with the batch.
func TestFlowControlShieldsInteractiveFromAFlood(t *testing.T) {
	reqs := flood(t, "chat:interactive:0.25,batch:batch:0.75")
	flow := admit.Config{SLO: 5 * time.Second}
	solo := tenantRun(t, runFlow(t, trace.Tenant(reqs, "chat"), admit.Config{}), "chat")
	with := runFlow(t, reqs, flow)
	without := tenantRun(t, runFlow(t, reqs, admit.Config{}), "chat")
	chat := tenantRun(t, with, "chat")
	t.Logf("chat p95 TTFT: solo %.0f ms, flooded with flow control %.0f ms (%+.0f%%), without %.0f ms; batch served %d of %d",
		solo.TTFT.P95, chat.TTFT.P95, 100*(chat.TTFT.P95/solo.TTFT.P95-1), without.TTFT.P95, tenantRun(t, with, "batch").Completed, tenantRun(t, with, "batch").Requests)
	if chat.Rejected != 0 || chat.Completed != solo.Completed {
		t.Errorf("chat: %d of %d served, %d refused", chat.Completed, solo.Completed, chat.Rejected)
	}
	if chat.TTFT.P95 > 1.5*solo.TTFT.P95 {
		t.Errorf("chat's p95 TTFT under the flood %.0f ms, more than 1.5× its solo %.0f ms", chat.TTFT.P95, solo.TTFT.P95)
	}
	if without.TTFT.P95 < 20*chat.TTFT.P95 {
		t.Errorf("without flow control chat's p95 is %.0f ms, with %.0f: the flood should swamp it", without.TTFT.P95, chat.TTFT.P95)
	}
	if b := tenantRun(t, with, "batch"); b.Completed < b.Requests/4 {
		t.Errorf("batch served %d of %d: flow control should let it use what chat leaves", b.Completed, b.Requests)
	}
}

// Two tenants of one band, both flooding: what is served is shared by
// their weights, counted in tokens.
func TestFairSharesUnderSaturation(t *testing.T) {
	reqs := flood(t, "a:batch:0.5,b:batch:0.5")
	runs := runFlow(t, reqs, admit.Config{SLO: 5 * time.Second, Weights: map[string]float64{"a": 3, "b": 1}})
	a := tenantRun(t, runs, "a")
	t.Logf("a's share of the served tokens %.3f (weights 3:1); served a %d, b %d", a.Share, a.Completed, tenantRun(t, runs, "b").Completed)
	if math.Abs(a.Share-0.75) > 0.05 {
		t.Errorf("a got %.3f of the served tokens, want 0.75 ± 0.05", a.Share)
	}
}

// Under saturation sheddable work is refused first: refused at once, more
// of it than of batch work, and none of the interactive tenant's.
func TestSheddableRefusedFirst(t *testing.T) {
	reqs := flood(t, "chat:interactive:0.2,batch:batch:0.4,spare:sheddable:0.4")
	runs := runFlow(t, reqs, admit.Config{SLO: 5 * time.Second})
	chat, batch, spare := tenantRun(t, runs, "chat"), tenantRun(t, runs, "batch"), tenantRun(t, runs, "spare")
	ratio := func(r report.TenantRun) float64 { return float64(r.Rejected) / float64(r.Requests) }
	t.Logf("refused: chat %.3f, batch %.3f, spare (sheddable) %.3f", ratio(chat), ratio(batch), ratio(spare))
	if chat.Rejected != 0 || !(ratio(spare) > ratio(batch)) || spare.Rejected == 0 {
		t.Errorf("refused: chat %d, batch %.3f, sheddable %.3f: want sheddable first", chat.Rejected, ratio(batch), ratio(spare))
	}
}
