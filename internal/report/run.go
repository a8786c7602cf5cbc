package report

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Record is one request's measurements. Times are in milliseconds; TTFT and
// E2E run from the request's arrival at the router to its first and last
// token back at the router.
type Record struct {
	Index   int     `json:"index"`
	Session string  `json:"session,omitempty"`
	Replica string  `json:"replica,omitempty"`
	Arrival float64 `json:"arrival_ms"` // when the client meant to send it
	Slip    float64 `json:"slip_ms"`    // how much later it was sent
	RTT     float64 `json:"rtt_ms,omitempty"`
	TTFT    float64 `json:"ttft_ms"`
	E2E     float64 `json:"e2e_ms"`
	// ITL is the mean inter-token latency; 0 with fewer than two tokens,
	// or not measured (Whole).
	ITL          float64 `json:"itl_ms"`
	PromptTokens int     `json:"prompt_tokens"`
	CachedTokens int     `json:"cached_tokens"`
	// EstCachedTokens is the router's estimate of CachedTokens, when
	// Estimated (the record comes from a router that keeps a prefix index).
	EstCachedTokens int  `json:"est_cached_tokens,omitempty"`
	Estimated       bool `json:"-"`
	OutputTokens    int  `json:"output_tokens"`
	// ExpectedOutputTokens is the answer length the router expected when it
	// decided (0 when unknown: a live client's record).
	ExpectedOutputTokens int  `json:"expected_output_tokens,omitempty"`
	Failed               bool `json:"failed,omitempty"`
	// Rejected: refused by admission (a 429), a kind of failure.
	Rejected bool   `json:"rejected,omitempty"`
	Error    string `json:"error,omitempty"`
	// Status is the HTTP status of a live request; 0 when there was none
	// (simulated, or the connection failed).
	Status int `json:"status,omitempty"`
	// Model is the model the request named ("" for none).
	Model string `json:"model,omitempty"`
	// Tenant and Priority are whose request it was and the priority it
	// asked for ("" for none).
	Tenant   string `json:"tenant,omitempty"`
	Priority string `json:"priority,omitempty"`
	// TTFTSLO is the TTFT SLO (ms) the request's tenant held it to, where
	// it had its own (zero: the run's).
	TTFTSLO float64 `json:"ttft_slo_ms,omitempty"`
	// NewConn: a live request sent over a connection opened for it (its
	// TTFT holds the connection's setup, one round trip of the client's
	// leg or more).
	NewConn bool `json:"new_conn,omitempty"`
	// Whole: its answer was asked whole, not streamed (gorgo replay and
	// gorgo sim --unstreamed). A live record's TTFT is then its E2E, as
	// its client sees it, and its ITL is not measured; a simulated
	// record's are the engine's.
	Whole bool `json:"whole,omitempty"`
	// WarmUp: it arrived before the run began scoring (gorgo sim
	// --score-from): routed and recorded, not in the run's summary.
	WarmUp bool `json:"warm_up,omitempty"`
}

// Run summarises one policy's run over a workload.
type Run struct {
	Policy    string `json:"policy"`
	Requests  int    `json:"requests"`
	Completed int    `json:"completed"`
	Failed    int    `json:"failed"`
	TTFT      Dist   `json:"ttft_ms"`
	E2E       Dist   `json:"e2e_ms"`
	ITL       Dist   `json:"itl_ms"`
	// ITLRequests is how many requests the ITL is over: those of two
	// tokens or more whose gaps were measured (0: ITL is no measure, all
	// zeros; every answer whole, as its client sees it).
	ITLRequests int  `json:"itl_requests"`
	Slip        Dist `json:"slip_ms"`
	// CacheHitRatio is cached / prompt tokens over completed requests, as
	// the engines report; EstCacheHitRatio is the router's estimate, when
	// the records carry one (nil for a replay from outside the router).
	CacheHitRatio    float64  `json:"cache_hit_ratio"`
	EstCacheHitRatio *float64 `json:"est_cache_hit_ratio,omitempty"`
	// ReplicaShare is the fraction of requests sent to each replica.
	ReplicaShare map[string]float64 `json:"replica_share"`
	// Rejected counts the failures that admission refused (429).
	Rejected int `json:"rejected,omitempty"`
	// With a TTFT SLO (see ScoreSLO): the SLO, the TPOT SLO if any, how
	// many requests completed within them, and those per second of the
	// workload's span (goodput).
	SLO     float64 `json:"ttft_slo_ms,omitempty"`
	TPOTSLO float64 `json:"tpot_slo_ms,omitempty"`
	SLOMet  int     `json:"slo_met"`     // omitted without an SLO (MarshalJSON)
	Goodput float64 `json:"goodput_rps"` // likewise
	// Models counts the requests naming each model (those naming none
	// under ""), when any names one; nil otherwise.
	Models map[string]int `json:"models,omitempty"`
	// With LoRA adapters (see ScoreAdapters): the requests the engines ran
	// with an adapter, and the share of them whose adapter was resident
	// (no load); nil without adapter requests.
	AdapterRequests int64    `json:"adapter_requests,omitempty"`
	AdapterHitRatio *float64 `json:"adapter_hit_ratio,omitempty"`
}

// MarshalJSON writes the run as its fields' tags say, and with an SLO its
// slo_met and goodput_rps even where they are 0: omitted, a script reading
// them broke on the worst policy alone (2026-12-06, a researcher's test).
func (r Run) MarshalJSON() ([]byte, error) {
	type plain Run // without the method; its fields in their order
	if r.SLO > 0 {
		return json.Marshal(plain(r))
	}
	return json.Marshal(struct {
		plain
		SLOMet  int     `json:"slo_met,omitempty"` // 0 without an SLO: left out
		Goodput float64 `json:"goodput_rps,omitempty"`
	}{plain: plain(r)})
}

// ScoreAdapters sets the adapter figures from the engines' counts over
// the run: requests admitted with an adapter, and adapter loads they
// needed. The hit ratio is 1 − loads/requests; nil without requests.
func (r *Run) ScoreAdapters(requests, loads int64) {
	r.AdapterRequests, r.AdapterHitRatio = requests, nil
	if requests > 0 {
		h := 1 - float64(min(max(loads, 0), requests))/float64(requests)
		r.AdapterHitRatio = &h
	}
}

// SLO is the TTFT SLO (ms) the record is held to: its own, else the run's.
func (r *Record) SLO(runMS float64) float64 {
	if r.TTFTSLO > 0 {
		return r.TTFTSLO
	}
	return runMS
}

// ScoreSLO counts the records that completed with a TTFT within sloMS (or
// the record's own TTFTSLO), as the client sees it (from when it meant to
// send the request: slip plus TTFT), and, if tpotMS is positive, a time
// per output token (the mean gap between its tokens, ITL) within tpotMS;
// and sets the goodput: those per second of spanS, the workload's span
// (the same for every policy, so goodputs compare). An answer of one token
// has no TPOT to miss.
func (r *Run) ScoreSLO(recs []Record, sloMS, tpotMS, spanS float64) {
	r.SLO, r.TPOTSLO, r.SLOMet = sloMS, max(tpotMS, 0), 0
	for i := range recs {
		rec := &recs[i]
		if !rec.Failed && rec.Slip+rec.TTFT <= rec.SLO(sloMS) && (tpotMS <= 0 || rec.OutputTokens < 2 || rec.ITL <= tpotMS) {
			r.SLOMet++
		}
	}
	if spanS > 0 {
		r.Goodput = float64(r.SLOMet) / spanS
	}
}

// NewRun summarises records. replicas names every replica of the fleet, so
// that one that got nothing shows a share of 0.
func NewRun(policy string, recs []Record, replicas []string) Run {
	r := Run{Policy: policy, Requests: len(recs), ReplicaShare: make(map[string]float64, len(replicas))}
	for _, id := range replicas {
		r.ReplicaShare[id] = 0
	}
	var ttft, e2e, itl, slip []float64
	var prompt, cached, est int
	hasEst := false
	for i := range recs {
		rec := &recs[i]
		if rec.Model != "" && r.Models == nil {
			r.Models = map[string]int{}
		}
		slip = append(slip, rec.Slip)
		if rec.Replica != "" {
			r.ReplicaShare[rec.Replica]++
		}
		if rec.Failed {
			r.Failed++
			if rec.Rejected {
				r.Rejected++
			}
			continue
		}
		r.Completed++
		ttft = append(ttft, rec.TTFT)
		e2e = append(e2e, rec.E2E)
		if rec.OutputTokens > 1 && rec.ITL > 0 { // 0: not measured (a whole answer's client sees no gaps)
			itl = append(itl, rec.ITL)
		}
		prompt += rec.PromptTokens
		cached += rec.CachedTokens
		est += rec.EstCachedTokens
		hasEst = hasEst || rec.Estimated
	}
	if r.Models != nil {
		for i := range recs {
			r.Models[recs[i].Model]++
		}
	}
	for id := range r.ReplicaShare {
		if len(recs) > 0 {
			r.ReplicaShare[id] /= float64(len(recs))
		}
	}
	r.TTFT, r.E2E, r.ITL, r.Slip = Summarize(ttft), Summarize(e2e), Summarize(itl), Summarize(slip)
	r.ITLRequests = len(itl)
	if prompt > 0 {
		r.CacheHitRatio = float64(cached) / float64(prompt)
		if hasEst {
			e := float64(est) / float64(prompt)
			r.EstCacheHitRatio = &e
		}
	}
	return r
}

// WriteTable prints runs side by side, one row per policy. The adapter
// hit column (the share of adapter requests whose adapter was resident)
// shows only when some run had adapter requests, and the SLO columns only
// when some run had an SLO.
func WriteTable(w io.Writer, runs []Run) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	slo := slices.ContainsFunc(runs, func(r Run) bool { return r.SLO > 0 })
	adapters := slices.ContainsFunc(runs, func(r Run) bool { return r.AdapterHitRatio != nil })
	head := "policy\tdone\tfail\tTTFT p50\tp90\tp95\tp99\tmean\tE2E p50\tp95\tp99\tITL mean\tslip p99\thit\test\t"
	if adapters {
		head += "adapter hit\t"
	}
	head += "share\t"
	if slo {
		head += "rej\tmet SLO\tgoodput/s\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range runs {
		est := "-"
		if r.EstCacheHitRatio != nil {
			est = fmt.Sprintf("%.1f%%", 100**r.EstCacheHitRatio)
		}
		lat, itl := ms, ms
		if r.Completed == 0 {
			lat = func(float64) string { return "-" } // no latency, not a perfect one
		}
		if r.ITLRequests == 0 { // none measured: every answer whole, or of one token
			itl = func(float64) string { return "-" }
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%s\t",
			r.Policy, r.Completed, r.Failed,
			lat(r.TTFT.P50), lat(r.TTFT.P90), lat(r.TTFT.P95), lat(r.TTFT.P99), lat(r.TTFT.Mean),
			lat(r.E2E.P50), lat(r.E2E.P95), lat(r.E2E.P99), itl(r.ITL.Mean), ms(r.Slip.P99),
			100*r.CacheHitRatio, est)
		if adapters {
			hit := "-"
			if r.AdapterHitRatio != nil {
				hit = fmt.Sprintf("%.1f%%", 100**r.AdapterHitRatio)
			}
			fmt.Fprintf(tw, "%s\t", hit)
		}
		fmt.Fprintf(tw, "%s\t", shares(r.ReplicaShare))
		if slo {
			fmt.Fprintf(tw, "%d\t%d\t%.2f\t", r.Rejected, r.SLOMet, r.Goodput)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// ms formats milliseconds compactly: "37.2" below 100, "1,234" above.
func ms(v float64) string {
	if v < 100 {
		return fmt.Sprintf("%.1f", v)
	}
	s := fmt.Sprintf("%.0f", v)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func shares(m map[string]float64) string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("%s %.0f%%", id, 100*m[id])
	}
	return strings.Join(parts, " ")
}
