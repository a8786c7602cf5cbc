package signal

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Engine formats that ParseEngineMetrics recognises, as reported in
// EngineMetrics.Format.
const (
	// FormatSGLang is SGLang's exposition (sglang:num_running_reqs, ...).
	FormatSGLang = "sglang"
	// FormatVLLM is vLLM V1's exposition (vllm:num_requests_running with
	// vllm:kv_cache_usage_perc, or vllm:gpu_cache_usage_perc before the
	// rename, and prefix-cache query and hit counters).
	FormatVLLM = "vllm"
	// FormatVLLMV0 is vLLM V0's exposition, recognised by the gauges V1
	// dropped: vllm:gpu_prefix_cache_hit_rate, vllm:num_requests_swapped,
	// vllm:cpu_cache_usage_perc.
	FormatVLLMV0 = "vllm-v0"
)

// ErrUnknownEngine is wrapped by ParseEngineMetrics when an exposition is
// valid Prometheus text but carries neither SGLang's nor vLLM's request
// gauges.
var ErrUnknownEngine = errors.New("no SGLang or vLLM engine metrics")

// EngineMetrics is what the router reads off a replica's /metrics. Where an
// engine exports a metric under several label sets (tensor- or
// data-parallel ranks, vLLM's engine label, several models), counts, token
// totals and capacities are summed over them; see each field for the rest.
type EngineMetrics struct {
	// Format is FormatSGLang, FormatVLLM or FormatVLLMV0.
	Format string
	// Running and Waiting are the requests in the running batch and in the
	// waiting queue (SGLang num_running_reqs and num_queue_reqs, vLLM
	// num_requests_running and num_requests_waiting).
	Running, Waiting int
	// KVUsedTokens is how many tokens the KV cache holds. SGLang reports it
	// (num_used_tokens; without it, KVUsage × KVCapacityTokens). For vLLM
	// it is each engine's usage fraction times the capacity with the same
	// engine label (or the only capacity there is), summed and rounded; 0
	// when the capacity is unknown.
	KVUsedTokens int
	// KVUsage is the fraction of the KV cache in use, in [0, 1]: the
	// largest over label sets (SGLang token_usage, vLLM kv_cache_usage_perc
	// or gpu_cache_usage_perc), so that one full data-parallel rank shows.
	// The capacity-weighted mean is KVUsedTokens / KVCapacityTokens.
	KVUsage float64
	// KVCapacityTokens is how many tokens the KV cache holds when full:
	// SGLang max_total_num_tokens (else cache_config_info num_pages ×
	// page_size); vLLM cache_config_info kv_cache_size_tokens (else
	// num_gpu_blocks × block_size). 0 if unknown.
	KVCapacityTokens int
	// CacheHitRate is the prefix-cache hit rate in [0, 1], tokens hit over
	// tokens queried. SGLang: cache_hit_rate (the engine's recent window;
	// mean over label sets). vLLM V1: PrefixHitsTotal / PrefixQueriesTotal,
	// cumulative since the engine started, 0 before any query. vLLM V0:
	// gpu_prefix_cache_hit_rate (mean over label sets), 0 while the engine
	// reports −1 (not computed yet, or prefix caching off).
	CacheHitRate float64
	// PrefixQueriesTotal and PrefixHitsTotal are vLLM V1's cumulative
	// prefix-cache counters, in tokens (prefix_cache_queries_total and
	// prefix_cache_hits_total, or gpu_prefix_cache_* before the rename);
	// the caller derives the hit rate between two scrapes from them. 0 for
	// SGLang and vLLM V0.
	PrefixQueriesTotal, PrefixHitsTotal float64
	// PromptTokensTotal and GenerationTokensTotal are the engine's
	// cumulative prompt (prefill) and generated tokens, for throughput
	// between scrapes.
	PromptTokensTotal, GenerationTokensTotal float64
	// GenThroughput is SGLang's gen_throughput, generated tokens per second
	// (summed over label sets). 0 for vLLM: derive it from
	// GenerationTokensTotal.
	GenThroughput float64
	// Model is the model_name label of the series read; several distinct
	// names are sorted and joined with ",". Empty if there is none.
	Model string
	// StartTime is the engine process's start (process_start_time_seconds,
	// Unix seconds), 0 if not exposed: a change means a restart.
	StartTime float64
}

// maxCount bounds the integer fields: larger values (and the float sums
// behind them) are not exact in a float64 anyway.
const maxCount = 1 << 53

// ParseEngineMetrics reads a Prometheus text exposition (format 0.0.4) and
// recognises the engine by its metric names: sglang:num_running_reqs for
// SGLang, vllm:num_requests_running for vLLM (V0 or V1, see the Format
// constants). The request gauges (running and waiting) are required; every
// other field is 0 when its metrics are absent.
//
// Samples that are NaN, infinite or negative are ignored (vLLM V0 exports
// −1 for a hit rate it has not computed). A malformed exposition is an
// error wrapping the parser's expfmt.ParseError; one with neither engine's
// names wraps ErrUnknownEngine. A missing final newline is tolerated (the
// last line is taken as complete). The text format has no end marker, so an
// exposition cut at a line boundary parses: what was cut off reads as absent.
func ParseEngineMetrics(r io.Reader) (EngineMetrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(&newlineTerminated{r: r})
	if err != nil {
		return EngineMetrics{}, fmt.Errorf("parse metrics exposition: %w", err)
	}
	sg := fams["sglang:num_running_reqs"] != nil
	vl := fams["vllm:num_requests_running"] != nil
	switch {
	case sg && vl:
		return EngineMetrics{}, errors.New("parse engine metrics: exposition has both sglang:num_running_reqs and vllm:num_requests_running")
	case sg:
		return parseSGLang(fams)
	case vl:
		return parseVLLM(fams)
	}
	return EngineMetrics{}, unknownEngine(fams)
}

// unknownEngine says what was expected and what was found instead.
func unknownEngine(fams map[string]*dto.MetricFamily) error {
	names := make([]string, 0, len(fams))
	for n := range fams {
		names = append(names, n)
	}
	slices.Sort(names)
	found := "an empty exposition"
	if len(names) > 0 {
		noun := "families"
		if len(names) == 1 {
			noun = "family"
		}
		found = fmt.Sprintf("%d metric %s (%s", len(names), noun, strings.Join(names[:min(len(names), 3)], ", "))
		if len(names) > 3 {
			found += ", ..."
		}
		found += ")"
	}
	for _, want := range []string{"sglang:num_running_reqs", "vllm:num_requests_running"} {
		prefix := want[:strings.IndexByte(want, ':')+1]
		if i, _ := slices.BinarySearch(names, prefix); i < len(names) && strings.HasPrefix(names[i], prefix) {
			found = fmt.Sprintf("%s metrics without %s", prefix, want)
		}
	}
	return fmt.Errorf("%w: expected sglang:num_running_reqs (SGLang) or vllm:num_requests_running (vLLM), found %s", ErrUnknownEngine, found)
}

// stat aggregates the usable samples of one metric over its label sets.
type stat struct {
	present bool    // the family exists
	n       int     // usable samples
	sum     float64 // their sum
	max     float64 // their maximum (0 if none)
}

func (s stat) mean() float64 {
	if s.n == 0 {
		return 0
	}
	return s.sum / float64(s.n)
}

// reader reads metric families and remembers the model names it meets.
type reader struct {
	fams   map[string]*dto.MetricFamily
	models map[string]bool
}

// samples calls f with each usable sample of the named family: gauge,
// counter or untyped (a counter exposed OpenMetrics-style, with a TYPE line
// for its name without _total, parses as untyped).
func (rd *reader) samples(name string, f func(m *dto.Metric, v float64)) bool {
	mf := rd.fams[name]
	if mf == nil {
		return false
	}
	for _, m := range mf.GetMetric() {
		var v float64
		switch {
		case m.GetGauge() != nil:
			v = m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			v = m.GetCounter().GetValue()
		case m.GetUntyped() != nil:
			v = m.GetUntyped().GetValue()
		default:
			continue
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			continue
		}
		if mn := label(m, "model_name"); mn != "" {
			rd.models[mn] = true
		}
		f(m, v)
	}
	return true
}

// stat aggregates the named family.
func (rd *reader) stat(name string) stat {
	var s stat
	s.present = rd.samples(name, func(_ *dto.Metric, v float64) {
		s.n++
		s.sum += v
		s.max = max(s.max, v)
	})
	return s
}

// first returns the stat of the first of names whose family exists.
func (rd *reader) first(names ...string) stat {
	for _, n := range names {
		if s := rd.stat(n); s.present {
			return s
		}
	}
	return stat{}
}

func (rd *reader) model() string {
	names := make([]string, 0, len(rd.models))
	for n := range rd.models {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}

// label returns the value of a metric's label, "" if it has none.
func label(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// labelCount parses a label holding a positive whole number ("None" and
// anything else is not one).
func labelCount(m *dto.Metric, name string) (float64, bool) {
	v, err := strconv.ParseUint(label(m, name), 10, 64)
	if err != nil || v == 0 {
		return 0, false
	}
	return float64(v), true
}

// count rounds a non-negative sum to an int, bounded by maxCount.
func count(x float64) int {
	if !(x > 0) {
		return 0
	}
	return int(math.Round(min(x, maxCount)))
}

// fraction bounds x to [0, 1]; NaN is 0.
func fraction(x float64) float64 {
	if !(x > 0) {
		return 0
	}
	return min(x, 1)
}

func required(rd *reader, format string, names ...string) error {
	for _, n := range names {
		if rd.fams[n] == nil {
			return fmt.Errorf("parse engine metrics: %s exposition lacks %s", format, n)
		}
	}
	return nil
}

func parseSGLang(fams map[string]*dto.MetricFamily) (EngineMetrics, error) {
	rd := &reader{fams: fams, models: map[string]bool{}}
	if err := required(rd, FormatSGLang, "sglang:num_running_reqs", "sglang:num_queue_reqs"); err != nil {
		return EngineMetrics{}, err
	}
	em := EngineMetrics{Format: FormatSGLang}
	em.Running = count(rd.stat("sglang:num_running_reqs").sum)
	em.Waiting = count(rd.stat("sglang:num_queue_reqs").sum)

	capacity := rd.stat("sglang:max_total_num_tokens").sum
	if capacity == 0 {
		rd.samples("sglang:cache_config_info", func(m *dto.Metric, _ float64) {
			pages, ok1 := labelCount(m, "num_pages")
			size, ok2 := labelCount(m, "page_size")
			if ok1 && ok2 {
				capacity += pages * size
			}
		})
	}
	em.KVCapacityTokens = count(capacity)

	usage := rd.stat("sglang:token_usage")
	used := rd.stat("sglang:num_used_tokens")
	switch {
	case used.present:
		em.KVUsedTokens = count(used.sum)
	case usage.n > 0:
		em.KVUsedTokens = count(usage.max * float64(em.KVCapacityTokens))
	}
	switch {
	case usage.n > 0:
		em.KVUsage = fraction(usage.max)
	case em.KVCapacityTokens > 0:
		em.KVUsage = fraction(float64(em.KVUsedTokens) / float64(em.KVCapacityTokens))
	}

	em.CacheHitRate = fraction(rd.stat("sglang:cache_hit_rate").mean())
	em.PromptTokensTotal = rd.stat("sglang:prompt_tokens_total").sum
	em.GenerationTokensTotal = rd.stat("sglang:generation_tokens_total").sum
	em.GenThroughput = rd.stat("sglang:gen_throughput").sum
	em.Model = rd.model()
	em.StartTime = rd.stat("process_start_time_seconds").max
	return em, nil
}

func parseVLLM(fams map[string]*dto.MetricFamily) (EngineMetrics, error) {
	rd := &reader{fams: fams, models: map[string]bool{}}
	em := EngineMetrics{Format: FormatVLLM}
	if fams["vllm:gpu_prefix_cache_hit_rate"] != nil || fams["vllm:num_requests_swapped"] != nil ||
		fams["vllm:cpu_cache_usage_perc"] != nil {
		em.Format = FormatVLLMV0
	}
	if err := required(rd, em.Format, "vllm:num_requests_running", "vllm:num_requests_waiting"); err != nil {
		return EngineMetrics{}, err
	}
	em.Running = count(rd.stat("vllm:num_requests_running").sum)
	em.Waiting = count(rd.stat("vllm:num_requests_waiting").sum)

	// Capacity per engine label ("" when there is none, as in V0), so that
	// each engine's usage fraction meets its own capacity.
	capacity := map[string]float64{}
	var total float64
	rd.samples("vllm:cache_config_info", func(m *dto.Metric, _ float64) {
		c, ok := labelCount(m, "kv_cache_size_tokens")
		if !ok {
			blocks, ok1 := labelCount(m, "num_gpu_blocks")
			size, ok2 := labelCount(m, "block_size")
			if !ok1 || !ok2 {
				return
			}
			c = blocks * size
		}
		capacity[label(m, "engine")] += c
		total += c
	})
	em.KVCapacityTokens = count(total)

	usageName := "vllm:kv_cache_usage_perc"
	if fams[usageName] == nil {
		usageName = "vllm:gpu_cache_usage_perc"
	}
	var used, usage float64
	rd.samples(usageName, func(m *dto.Metric, v float64) {
		v = fraction(v)
		usage = max(usage, v)
		c, ok := capacity[label(m, "engine")]
		if !ok && len(capacity) == 1 {
			c = total
		}
		used += v * c
	})
	em.KVUsage = usage
	em.KVUsedTokens = count(min(used, total))

	if em.Format == FormatVLLMV0 {
		em.CacheHitRate = fraction(rd.stat("vllm:gpu_prefix_cache_hit_rate").mean())
	} else {
		em.PrefixQueriesTotal = rd.first("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total").sum
		em.PrefixHitsTotal = rd.first("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total").sum
		if em.PrefixQueriesTotal > 0 {
			em.CacheHitRate = fraction(em.PrefixHitsTotal / em.PrefixQueriesTotal)
		}
	}
	em.PromptTokensTotal = rd.stat("vllm:prompt_tokens_total").sum
	em.GenerationTokensTotal = rd.stat("vllm:generation_tokens_total").sum
	em.Model = rd.model()
	em.StartTime = rd.stat("process_start_time_seconds").max
	return em, nil
}

// newlineTerminated passes a reader through and adds a final newline if
// the input is not empty and does not end with one (the text parser rejects
// a last line without it).
type newlineTerminated struct {
	r      io.Reader
	seen   bool // some input was read
	lastNL bool // the last byte read was a newline
	eof    bool
}

func (n *newlineTerminated) Read(p []byte) (int, error) {
	if n.eof {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	k, err := n.r.Read(p)
	if k > 0 {
		n.seen, n.lastNL = true, p[k-1] == '\n'
	}
	if err != io.EOF {
		return k, err
	}
	if n.seen && !n.lastNL {
		if k == len(p) {
			return k, nil // no room: the newline comes with the next call
		}
		p[k] = '\n'
		k++
	}
	n.eof = true
	return k, nil
}
