package report

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// TenantRun summarises one tenant's requests in a run.
type TenantRun struct {
	Tenant   string `json:"tenant"`
	Requests int    `json:"requests"`
	// Completed and Rejected count its requests served and refused by
	// flow control (a 429).
	Completed int `json:"completed"`
	Rejected  int `json:"rejected"`
	// Tokens are the prompt and output tokens of its completed requests,
	// Share its part of all tenants' served tokens.
	Tokens int64   `json:"served_tokens"`
	Share  float64 `json:"token_share"`
	TTFT   Dist    `json:"ttft_ms"`
	E2E    Dist    `json:"e2e_ms"`
	// SLOMet counts its completed requests with a TTFT within their SLO
	// (see ByTenant).
	SLOMet int `json:"slo_met,omitempty"`
}

// ByTenant summarises records per tenant ("default" for requests of
// none), ordered by name; a record meets the SLO when it completed with
// slip plus TTFT within its own TTFT SLO, else sloMS (0: not counted).
func ByTenant(recs []Record, sloMS float64) []TenantRun {
	by := map[string]*TenantRun{}
	ttft, e2e := map[string][]float64{}, map[string][]float64{}
	var total int64
	for i := range recs {
		r := &recs[i]
		name := r.Tenant
		if name == "" {
			name = "default"
		}
		t := by[name]
		if t == nil {
			t = &TenantRun{Tenant: name}
			by[name] = t
		}
		t.Requests++
		if r.Rejected {
			t.Rejected++
		}
		if r.Failed {
			continue
		}
		t.Completed++
		n := int64(r.PromptTokens + r.OutputTokens)
		t.Tokens += n
		total += n
		ttft[name] = append(ttft[name], r.TTFT)
		e2e[name] = append(e2e[name], r.E2E)
		if slo := r.SLO(sloMS); slo > 0 && r.Slip+r.TTFT <= slo {
			t.SLOMet++
		}
	}
	out := make([]TenantRun, 0, len(by))
	for name, t := range by {
		t.TTFT, t.E2E = Summarize(ttft[name]), Summarize(e2e[name])
		if total > 0 {
			t.Share = float64(t.Tokens) / float64(total)
		}
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b TenantRun) int { return cmp.Compare(a.Tenant, b.Tenant) })
	return out
}

// WriteTenants prints one row per tenant of a run; with an SLO (sloMS as
// ByTenant had it), how many of each tenant's requests met it.
func WriteTenants(w io.Writer, policy string, ts []TenantRun, sloMS float64) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "policy\ttenant\trequests\tdone\trefused\ttoken share\tTTFT p50\tp95\tp99\tE2E p50\tp95\t"
	if sloMS > 0 {
		head += "met SLO\t"
	}
	fmt.Fprintln(tw, head)
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.1f%%\t%s\t%s\t%s\t%s\t%s\t", policy, t.Tenant, t.Requests, t.Completed, t.Rejected,
			100*t.Share, ms(t.TTFT.P50), ms(t.TTFT.P95), ms(t.TTFT.P99), ms(t.E2E.P50), ms(t.E2E.P95))
		if sloMS > 0 {
			fmt.Fprintf(tw, "%d\t", t.SLOMet)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}
