package emulator

import (
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/engine"
)

// metrics exposes the engine's state under SGLang's or vLLM's metric
// names and labels (as in real dumps of SGLang 2026 and vLLM 0.29 V1).
// Gauges and counters are read from the model at scrape time; latency
// histograms are observed as requests progress, in model seconds.
type metrics struct {
	s      *Server
	format string
	labels prometheus.Labels
	descs  map[string]*prometheus.Desc
	ttft   prometheus.Histogram
	e2e    prometheus.Histogram
	itl    prometheus.Histogram
	// lastToken remembers each request's previous token time for ITL.
	lastToken map[uint64]time.Duration

	// LoRA (exposed while the server's LoRA is on): vLLM's
	// lora_requests_info, an info gauge whose value is when its labels
	// (the adapters of the running and waiting requests) were last true;
	// as in vLLM, the label sets of earlier states linger, the most
	// recent maxLoRAStates of them. SGLang's lora_pool_slots_* gauges.
	maxLoRA   string
	loraInfo  *prometheus.Desc
	loraSlots []*prometheus.Desc // used, total, utilization
	loraMu    sync.Mutex
	loraSets  []loraState
}

// loraState is one label set of vllm:lora_requests_info and its value.
type loraState struct {
	running, waiting string
	at               float64
}

// maxLoRAStates bounds the label sets of vllm:lora_requests_info kept.
const maxLoRAStates = 16

// Latency buckets (seconds), as SGLang's.
var latencyBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
var itlBuckets = []float64{0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5}

type metricSpec struct{ name, help string }

func newMetrics(s *Server) *metrics {
	m := &metrics{s: s, format: s.cfg.MetricsFormat, descs: map[string]*prometheus.Desc{}, lastToken: map[uint64]time.Duration{}}
	var specs []metricSpec
	ns := "sglang:"
	switch m.format {
	case "vllm":
		ns = "vllm:"
		m.labels = prometheus.Labels{"engine": "0", "model_name": s.cfg.Model}
		specs = []metricSpec{
			{name: "num_requests_running", help: "Number of requests in model execution batches."},
			{name: "num_requests_waiting", help: "Number of requests waiting to be processed."},
			{name: "kv_cache_usage_perc", help: "KV-cache usage. 1 means 100 percent usage."},
			{name: "prefix_cache_queries_total", help: "Prefix cache queries, in terms of number of queried tokens."},
			{name: "prefix_cache_hits_total", help: "Prefix cache hits, in terms of number of cached tokens."},
			{name: "prompt_tokens_total", help: "Number of prefill tokens processed."},
			{name: "generation_tokens_total", help: "Number of generation tokens processed."},
			{name: "request_success_total", help: "Count of successfully processed requests."},
			{name: "cache_config_info", help: "Information of the LLMEngine CacheConfig"},
		}
	default:
		m.labels = prometheus.Labels{"engine_type": "unified", "model_name": s.cfg.Model, "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
		specs = []metricSpec{
			{name: "num_running_reqs", help: "The number of running requests."},
			{name: "num_queue_reqs", help: "The number of requests in the waiting queue."},
			{name: "num_used_tokens", help: "The number of used tokens."},
			{name: "token_usage", help: "The token usage."},
			{name: "cache_hit_rate", help: "The prefix cache hit rate."},
			{name: "max_total_num_tokens", help: "Maximum total number of tokens in the KV cache pool."},
			{name: "gen_throughput", help: "The generation throughput (token/s)."},
			{name: "utilization", help: "The utilization."},
			{name: "prompt_tokens_total", help: "Number of prefill tokens processed."},
			{name: "generation_tokens_total", help: "Number of generation tokens processed."},
			{name: "num_requests_total", help: "Number of requests processed."},
			{name: "cache_config_info", help: "Cache configuration information."},
		}
	}
	for _, sp := range specs {
		labels := m.labels
		if sp.name == "cache_config_info" {
			labels = m.cacheConfigLabels()
		}
		m.descs[sp.name] = prometheus.NewDesc(ns+sp.name, sp.help, nil, labels)
	}
	m.maxLoRA = strconv.Itoa(s.drv.eng.MaxLoRAs())
	if m.format == "vllm" {
		m.loraInfo = prometheus.NewDesc("vllm:lora_requests_info", "Running stats on lora requests.",
			[]string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, nil)
	} else {
		m.loraSlots = []*prometheus.Desc{
			prometheus.NewDesc("sglang:lora_pool_slots_used", "Number of LoRA adapter slots in use by running requests.", nil, m.labels),
			prometheus.NewDesc("sglang:lora_pool_slots_total", "Total number of LoRA adapter slots.", nil, m.labels),
			prometheus.NewDesc("sglang:lora_pool_utilization", "LoRA adapter slot utilization ratio.", nil, m.labels),
		}
	}
	histLabels := m.labels
	if m.format == "sglang" {
		histLabels = prometheus.Labels{"model_name": s.cfg.Model}
	}
	m.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{Name: ns + "time_to_first_token_seconds",
		Help: "Histogram of time to first token in seconds.", Buckets: latencyBuckets, ConstLabels: histLabels})
	m.e2e = prometheus.NewHistogram(prometheus.HistogramOpts{Name: ns + "e2e_request_latency_seconds",
		Help: "Histogram of End-to-end request latency in seconds", Buckets: latencyBuckets, ConstLabels: histLabels})
	itlName := ns + "inter_token_latency_seconds"
	m.itl = prometheus.NewHistogram(prometheus.HistogramOpts{Name: itlName,
		Help: "Histogram of inter-token latency in seconds.", Buckets: itlBuckets, ConstLabels: histLabels})
	return m
}

func (m *metrics) cacheConfigLabels() prometheus.Labels {
	l := prometheus.Labels{}
	for k, v := range m.labels {
		l[k] = v
	}
	kv := m.s.drv.eng.Gauges().KVCapacityTokens
	if m.format == "vllm" {
		l["block_size"] = strconv.Itoa(m.s.page)
		l["num_gpu_blocks"] = strconv.Itoa(kv / m.s.page)
		l["kv_cache_size_tokens"] = strconv.Itoa(kv)
		l["enable_prefix_caching"] = "True"
		return l
	}
	return prometheus.Labels{"num_pages": strconv.Itoa(kv / m.s.page), "page_size": strconv.Itoa(m.s.page)}
}

// observe feeds the latency histograms; the driver calls it under its lock.
func (m *metrics) observe(ev engine.Event, entered time.Duration) {
	switch ev.Kind {
	case engine.EventFirstToken:
		m.ttft.Observe((ev.Time - entered).Seconds())
		m.lastToken[ev.ID] = ev.Time
	case engine.EventToken:
		if last, ok := m.lastToken[ev.ID]; ok {
			m.itl.Observe((ev.Time - last).Seconds())
		}
		m.lastToken[ev.ID] = ev.Time
	case engine.EventFinish:
		m.e2e.Observe((ev.Time - entered).Seconds())
		delete(m.lastToken, ev.ID)
	}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range m.descs {
		ch <- d
	}
	if m.loraInfo != nil {
		ch <- m.loraInfo
	}
	for _, d := range m.loraSlots {
		ch <- d
	}
	m.ttft.Describe(ch)
	m.e2e.Describe(ch)
	m.itl.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	lora := m.s.lora.Load()
	if lora {
		// Scrapes at once (a router's, Prometheus') stamp their adapter
		// states in the order they took them.
		m.loraMu.Lock()
	}
	g, tput, running, waiting := m.s.drv.snapshot(lora)
	if lora {
		m.collectLoRA(ch, running, waiting)
		m.loraMu.Unlock()
	}
	kvFrac := 0.0
	if g.KVCapacityTokens > 0 {
		kvFrac = float64(g.KVUsedTokens) / float64(g.KVCapacityTokens)
	}
	var vals map[string]float64
	if m.format == "vllm" {
		vals = map[string]float64{
			"num_requests_running":       float64(g.Running),
			"num_requests_waiting":       float64(g.Waiting),
			"kv_cache_usage_perc":        kvFrac,
			"prefix_cache_queries_total": float64(g.PromptTokens),
			"prefix_cache_hits_total":    float64(g.CachedTokens),
			"prompt_tokens_total":        float64(g.PromptTokens),
			"generation_tokens_total":    float64(g.GeneratedTokens),
			"request_success_total":      float64(g.Finished),
			"cache_config_info":          1,
		}
	} else {
		util := 0.0 // busy (1) or idle (0) at the scrape
		if g.Running > 0 || g.Waiting > 0 {
			util = 1
		}
		vals = map[string]float64{
			"num_running_reqs":        float64(g.Running),
			"num_queue_reqs":          float64(g.Waiting),
			"num_used_tokens":         float64(g.KVUsedTokens),
			"token_usage":             kvFrac,
			"cache_hit_rate":          g.CacheHitRate,
			"max_total_num_tokens":    float64(g.KVCapacityTokens),
			"gen_throughput":          tput,
			"utilization":             util,
			"prompt_tokens_total":     float64(g.PromptTokens),
			"generation_tokens_total": float64(g.GeneratedTokens),
			"num_requests_total":      float64(g.Finished),
			"cache_config_info":       1,
		}
	}
	for name, d := range m.descs {
		typ := prometheus.GaugeValue
		if len(name) > 6 && name[len(name)-6:] == "_total" {
			typ = prometheus.CounterValue
		}
		ch <- prometheus.MustNewConstMetric(d, typ, vals[name])
	}
	m.ttft.Collect(ch)
	m.e2e.Collect(ch)
	m.itl.Collect(ch)
}

// collectLoRA exposes the adapters of the running and waiting requests.
// Call it with loraMu held.
func (m *metrics) collectLoRA(ch chan<- prometheus.Metric, running, waiting []uint64) {
	if m.format != "vllm" {
		used, total := float64(len(running)), float64(m.s.drv.eng.MaxLoRAs())
		ch <- prometheus.MustNewConstMetric(m.loraSlots[0], prometheus.GaugeValue, used)
		ch <- prometheus.MustNewConstMetric(m.loraSlots[1], prometheus.GaugeValue, total)
		ch <- prometheus.MustNewConstMetric(m.loraSlots[2], prometheus.GaugeValue, used/total)
		return
	}
	c := m.s.models.Load()
	now := loraState{running: strings.Join(c.adapterNames(running), ","), waiting: strings.Join(c.adapterNames(waiting), ",")}
	// The value is the time now, later than any before (vLLM's
	// set_to_current_time), so that the current state is the greatest.
	now.at = float64(time.Now().UnixNano()) / 1e9
	i := -1
	for k, st := range m.loraSets {
		now.at = max(now.at, math.Nextafter(st.at, math.Inf(1)))
		if st.running == now.running && st.waiting == now.waiting {
			i = k
		}
	}
	switch {
	case i >= 0:
		m.loraSets[i].at = now.at
	case len(m.loraSets) < maxLoRAStates:
		m.loraSets = append(m.loraSets, now)
	default: // forget the oldest
		oldest := 0
		for k, st := range m.loraSets {
			if st.at < m.loraSets[oldest].at {
				oldest = k
			}
		}
		m.loraSets[oldest] = now
	}
	for _, st := range m.loraSets {
		ch <- prometheus.MustNewConstMetric(m.loraInfo, prometheus.GaugeValue, st.at, m.maxLoRA, st.running, st.waiting)
	}
}
