package enginemetrics

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

// ErrUnknownEngine is wrapped by Parse when an exposition is
// valid Prometheus text but carries neither SGLang's nor vLLM's request
// gauges.
var ErrUnknownEngine = errors.New("no SGLang or vLLM engine metrics")

// Metrics is what the router reads off a replica's /metrics. Where an
// engine exports a metric under several label sets (tensor- or
// data-parallel ranks, vLLM's engine label, several models), counts, token
// totals and capacities are summed over them; see each field for the rest.
type Metrics struct {
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
	// names are sorted and joined with ",": the first MaxModelNames met,
	// names longer than MaxModelNameBytes left out. Empty if there is none.
	Model string
	// StartTime is the engine process's start (process_start_time_seconds,
	// Unix seconds), 0 if not exposed: a change means a restart.
	StartTime float64

	// LoRAKnown says the engine reports LoRA enabled, with its adapters:
	// vLLM's lora_requests_info with a positive max_lora or some adapter
	// named (vLLM V0 exposes it with max_lora="0" when LoRA is off),
	// SGLang's lora_pool_slots_total or _used positive (SGLang exposes
	// them only with LoRA on). The fields below are 0 without it.
	LoRAKnown bool
	// MaxLoRAs is the engine's adapter slots: vLLM's max_lora label,
	// SGLang's lora_pool_slots_total (the largest over label sets). 0 if
	// not reported.
	MaxLoRAs int
	// RunningAdapters and WaitingAdapters are the adapters of the running
	// and the waiting requests, as vLLM's lora_requests_info names them
	// (its most recent label set), without duplicates, at most
	// MaxAdapterNames names of at most MaxAdapterNameBytes bytes each
	// (longer ones are left out). nil for SGLang.
	RunningAdapters, WaitingAdapters []string
	// RunningAdapterCount is how many distinct adapters the running
	// requests use: len(RunningAdapters) for vLLM, SGLang's
	// lora_pool_slots_used (the largest over label sets).
	RunningAdapterCount int
}

// Bounds on the adapter names read from one exposition: a hostile replica
// must not grow the router.
const (
	MaxAdapterNames     = 256
	MaxAdapterNameBytes = 256
	MaxModelNames       = 16
	MaxModelNameBytes   = 256
)

// maxCount bounds the integer fields: larger values (and the float sums
// behind them) are not exact in a float64 anyway.
const maxCount = 1 << 53

// Parse reads a Prometheus text exposition (format 0.0.4) and recognises
// the engine by its metric names (Dialects: sglang:num_running_reqs for
// SGLang, vllm:num_requests_running for vLLM V0 or V1, see the Format
// constants). The request gauges (running and waiting) are required; every
// other field is 0 when its metrics are absent.
//
// Only the families the dialects read are parsed (see MaxReadBytes): the
// others' lines are skipped once their name is read, so a malformed line
// of theirs goes unnoticed, and their label sets cost no memory. The
// families read are bounded: more than MaxSeries label sets of one, or
// more than MaxReadBytes of their lines, are an error.
//
// Samples that are NaN, infinite or negative are ignored (vLLM V0 exports
// −1 for a hit rate it has not computed). A malformed exposition is an
// error wrapping the parser's expfmt.ParseError (its line the
// exposition's); one with no dialect's names wraps ErrUnknownEngine. A
// missing final newline is tolerated (the last line is taken as complete).
// The text format has no end marker, so an exposition cut at a line
// boundary parses: what was cut off reads as absent.
func Parse(r io.Reader) (Metrics, error) {
	kept, err := filter(r, wanted())
	if err != nil {
		return Metrics{}, fmt.Errorf("parse metrics exposition: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(&kept.text)
	if err != nil {
		// The line of the exposition, not of the lines kept.
		if pe := (expfmt.ParseError{}); errors.As(err, &pe) && pe.Line >= 1 && pe.Line <= len(kept.lines) {
			pe.Line = kept.lines[pe.Line-1]
			err = pe
		}
		return Metrics{}, fmt.Errorf("parse metrics exposition: %w", err)
	}
	d, err := detect(fams, &kept.names)
	if err != nil {
		return Metrics{}, err
	}
	return d.read(fams)
}

// detect returns the dialect of an exposition: the first of Dialects whose
// marker (and refinement) it has. Two engines' markers are an error.
func detect(fams map[string]*dto.MetricFamily, names *familyNames) (*Dialect, error) {
	var found *Dialect
	for i := range Dialects {
		d := &Dialects[i]
		switch {
		case fams[d.Marker] == nil:
		case found != nil && found.Marker != d.Marker:
			return nil, fmt.Errorf("parse engine metrics: exposition has both %s and %s", found.Marker, d.Marker)
		case found == nil && (len(d.When) == 0 || firstPresent(fams, d.When) != ""):
			found = d
		}
	}
	if found == nil {
		return nil, unknownEngine(names)
	}
	return found, nil
}

// firstPresent returns the first of names the exposition has, "" if none.
func firstPresent(fams map[string]*dto.MetricFamily, names []string) string {
	for _, n := range names {
		if fams[n] != nil {
			return n
		}
	}
	return ""
}

// read reads an exposition in the dialect.
func (d *Dialect) read(fams map[string]*dto.MetricFamily) (Metrics, error) {
	rd := &reader{fams: fams, models: map[string]bool{}, ranks: d.RankLabels}
	for _, n := range []string{d.Running, d.Waiting} {
		if fams[n] == nil {
			return Metrics{}, fmt.Errorf("parse engine metrics: %s exposition lacks %s", d.Format, n)
		}
	}
	m := Metrics{Format: d.Format}
	m.Running = count(rd.stat(d.Running).sum)
	m.Waiting = count(rd.stat(d.Waiting).sum)

	capacity, total := rd.capacity(d)
	m.KVCapacityTokens = count(total)
	// Usage: the fullest label set's, and (with engine labels) each
	// engine's usage times its own capacity (or the only one there is).
	var usage, raw, scaled float64
	n := 0
	if name := firstPresent(fams, d.Usage); name != "" {
		rd.samples(name, func(s *dto.Metric, v float64) {
			n++
			raw = max(raw, v)
			v = fraction(v)
			usage = max(usage, v)
			if d.EngineLabel != "" {
				c, ok := capacity[label(s, d.EngineLabel)]
				if !ok && len(capacity) == 1 {
					c = total
				}
				scaled += v * c
			}
		})
	}
	var used stat
	if d.Used != "" {
		used = rd.stat(d.Used)
	}
	switch {
	case used.present:
		m.KVUsedTokens = count(used.sum)
	case n > 0 && d.EngineLabel != "":
		m.KVUsedTokens = count(min(scaled, total))
	case n > 0:
		m.KVUsedTokens = count(raw * float64(m.KVCapacityTokens))
	}
	switch {
	case n > 0:
		m.KVUsage = usage
	case m.KVCapacityTokens > 0:
		m.KVUsage = fraction(float64(m.KVUsedTokens) / float64(m.KVCapacityTokens))
	}

	switch {
	case d.HitRate != "":
		m.CacheHitRate = fraction(rd.stat(d.HitRate).mean())
	case len(d.Queries) > 0:
		m.PrefixQueriesTotal = rd.first(d.Queries...).sum
		m.PrefixHitsTotal = rd.first(d.Hits...).sum
		if m.PrefixQueriesTotal > 0 {
			m.CacheHitRate = fraction(m.PrefixHitsTotal / m.PrefixQueriesTotal)
		}
	}
	m.PromptTokensTotal = rd.sum(d.PromptTokens)
	m.GenerationTokensTotal = rd.sum(d.GenerationTokens)
	m.GenThroughput = rd.sum(d.Throughput)
	rd.lora(d, &m)
	m.Model = rd.model()
	m.StartTime = rd.stat("process_start_time_seconds").max
	return m, nil
}

// lora reads the dialect's LoRA families into m.
func (rd *reader) lora(d *Dialect, m *Metrics) {
	if d.LoRAInfo != "" {
		// The sample of greatest value: the engine's latest state.
		var latest *dto.Metric
		best := math.Inf(-1)
		rd.samples(d.LoRAInfo, func(s *dto.Metric, v float64) {
			if v > best {
				latest, best = s, v
			}
		})
		if latest != nil {
			if n, ok := labelCount(latest, d.LoRAMaxLabel); ok {
				m.MaxLoRAs = count(n)
			}
			m.RunningAdapters = adapterList(label(latest, d.LoRARunningLabel))
			m.WaitingAdapters = adapterList(label(latest, d.LoRAWaitingLabel))
			m.RunningAdapterCount = len(m.RunningAdapters)
			m.LoRAKnown = m.MaxLoRAs > 0 || m.RunningAdapters != nil || m.WaitingAdapters != nil
			return
		}
	}
	var total, used stat
	if d.LoRASlotsTotal != "" {
		total = rd.stat(d.LoRASlotsTotal)
	}
	if d.LoRASlotsUsed != "" {
		used = rd.stat(d.LoRASlotsUsed)
	}
	m.MaxLoRAs = count(total.max)
	m.RunningAdapterCount = count(used.max)
	m.LoRAKnown = m.MaxLoRAs > 0 || m.RunningAdapterCount > 0
}

// adapterList splits a comma-separated list of adapter names: spaces
// trimmed, empty names and duplicates dropped, names longer than
// MaxAdapterNameBytes left out, at most MaxAdapterNames of them (the
// rest of the label is not looked at).
func adapterList(v string) []string {
	var names []string
	for v != "" && len(names) < MaxAdapterNames {
		var name string
		name, v, _ = strings.Cut(v, ",")
		name = strings.TrimSpace(name)
		if name == "" || len(name) > MaxAdapterNameBytes || slices.Contains(names, name) {
			continue
		}
		names = append(names, strings.Clone(name)) // not the whole label's memory
	}
	return names
}

// capacity reads the KV capacity by the first of the dialect's rules that
// yields one: per engine label value ("" without one), and in all.
func (rd *reader) capacity(d *Dialect) (map[string]float64, float64) {
	for _, rule := range d.Capacity {
		by, total := map[string]float64{}, 0.0
		rd.samples(rule.Family, func(s *dto.Metric, v float64) {
			if len(rule.Labels) > 0 {
				var ok bool
				if v, ok = labelProduct(s, rule.Labels); !ok {
					return
				}
			}
			key := ""
			if d.EngineLabel != "" {
				key = label(s, d.EngineLabel)
			}
			if rule.Total {
				by[key], total = 0, max(total, v)
				return
			}
			by[key] += v
			total += v
		})
		if rule.Total {
			for k := range by {
				by[k] = total / float64(len(by))
			}
		}
		if total > 0 {
			return by, total
		}
	}
	return map[string]float64{}, 0
}

// labelProduct is the product of the first list of labels that all hold
// positive whole numbers.
func labelProduct(s *dto.Metric, lists [][]string) (float64, bool) {
next:
	for _, names := range lists {
		p := 1.0
		for _, n := range names {
			v, ok := labelCount(s, n)
			if !ok {
				continue next
			}
			p *= v
		}
		return p, true
	}
	return 0, false
}

// unknownEngine says what was expected and what was found instead.
func unknownEngine(fams *familyNames) error {
	names := fams.sorted()
	found := "an empty exposition"
	if len(names) > 0 {
		noun := "families"
		if len(names) == 1 && !fams.more {
			noun = "family"
		}
		count := fmt.Sprint(len(names))
		if fams.more {
			count = "more than " + count
		}
		found = fmt.Sprintf("%s metric %s (%s", count, noun, strings.Join(names[:min(len(names), 3)], ", "))
		if len(names) > 3 || fams.more {
			found += ", ..."
		}
		found += ")"
	}
	var expected []string
	seen := map[string]bool{}
	for _, d := range Dialects {
		if seen[d.Marker] {
			continue
		}
		seen[d.Marker] = true
		expected = append(expected, fmt.Sprintf("%s (%s)", d.Marker, d.Engine))
		prefix := d.Marker[:strings.IndexByte(d.Marker, ':')+1]
		if i, _ := slices.BinarySearch(names, prefix); i < len(names) && strings.HasPrefix(names[i], prefix) {
			found = fmt.Sprintf("%s metrics without %s", prefix, d.Marker)
		}
	}
	return fmt.Errorf("%w: expected %s, found %s", ErrUnknownEngine, strings.Join(expected, " or "), found)
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
	ranks  []string // Dialect.RankLabels
}

// samples calls f with each usable sample of the named family: gauge,
// counter or untyped (a counter exposed OpenMetrics-style, with a TYPE line
// for its name without _total, parses as untyped).
func (rd *reader) samples(name string, f func(m *dto.Metric, v float64)) bool {
	mf := rd.fams[name]
	if mf == nil {
		return false
	}
	for _, m := range rd.oneRank(mf.GetMetric()) {
		v, ok := value(m)
		if !ok {
			continue
		}
		if mn := label(m, "model_name"); mn != "" && len(mn) <= MaxModelNameBytes && len(rd.models) < MaxModelNames {
			rd.models[mn] = true
		}
		f(m, v)
	}
	return true
}

// value is a sample's value, if it is a gauge's, a counter's or an
// untyped one and a finite number not below 0.
func value(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	return v, !math.IsNaN(v) && !math.IsInf(v, 0) && v >= 0
}

// oneRank keeps, of the samples that differ only in the reader's rank
// labels (copies of one engine's figures, each rank's scheduler writing
// its own), the one of greatest value; samples without them are kept as
// they are.
func (rd *reader) oneRank(ms []*dto.Metric) []*dto.Metric {
	if len(rd.ranks) == 0 || !slices.ContainsFunc(ms, func(m *dto.Metric) bool {
		return slices.ContainsFunc(m.GetLabel(), func(lp *dto.LabelPair) bool { return slices.Contains(rd.ranks, lp.GetName()) })
	}) {
		return ms
	}
	kept := make([]*dto.Metric, 0, len(ms))
	vals := make([]float64, 0, len(ms)) // kept's values
	at := make(map[string]int, len(ms)) // a group's key → its index in kept
	var key strings.Builder
	for _, m := range ms {
		v, ok := value(m)
		if !ok {
			continue
		}
		key.Reset()
		for _, lp := range m.GetLabel() { // the parser sorts them by name
			if !slices.Contains(rd.ranks, lp.GetName()) {
				key.WriteString(lp.GetName())
				key.WriteByte(0)
				key.WriteString(lp.GetValue())
				key.WriteByte(0)
			}
		}
		i, seen := at[key.String()]
		switch {
		case !seen:
			at[key.String()] = len(kept)
			kept, vals = append(kept, m), append(vals, v)
		case v > vals[i]:
			kept[i], vals[i] = m, v
		}
	}
	return kept
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

// sum is the named family's sum, 0 for none ("").
func (rd *reader) sum(name string) float64 {
	if name == "" {
		return 0
	}
	return rd.stat(name).sum
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
