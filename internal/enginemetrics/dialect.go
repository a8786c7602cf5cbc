package enginemetrics

// A Dialect is one engine's names for the gauges gorgo reads off its
// /metrics: a new engine (or a rename) is a new row of Dialects, not code.
// Wherever a field lists several names, the first family the exposition
// has is read; a family missing leaves its figure 0.
type Dialect struct {
	// Format names the dialect, as Metrics.Format reports it; Engine is
	// the engine's name, for errors.
	Format, Engine string
	// Marker is the family that says an exposition is this engine's; When
	// refines it: the dialect applies only if one of these families is
	// present too (vLLM V0 against V1, which share a marker). Dialects
	// sharing a marker are tried in order, so the refined one comes first.
	Marker string
	When   []string
	// Running and Waiting are the request gauges (summed over label sets);
	// both are required.
	Running, Waiting string
	// Capacity is how the KV cache's size in tokens is read: the first
	// rule that yields one.
	Capacity []Capacity
	// EngineLabel, if set, is the label that tells a replica's engines
	// apart (vLLM's data-parallel "engine"): each usage sample is paired
	// with its engine's capacity. Without it, the usage of the fullest
	// label set scales the whole capacity.
	EngineLabel string
	// RankLabels are labels that tell apart copies of one engine's
	// figures: SGLang's schedulers of one tensor- or pipeline-parallel
	// group each write the group's batch under their own rank
	// (--enable-metrics-for-all-schedulers). Of samples that differ only
	// in them, the one of greatest value is read.
	RankLabels []string
	// Usage is the fraction of the KV cache in use; Used, if the engine
	// reports it, the tokens in use (summed), else derived from Usage.
	Usage []string
	Used  string
	// HitRate is a prefix-cache hit-rate gauge (the mean over label sets);
	// or, for engines that count, Hits over Queries (cumulative tokens).
	HitRate       string
	Hits, Queries []string
	// PromptTokens and GenerationTokens are cumulative token counters,
	// Throughput a generated-tokens-per-second gauge.
	PromptTokens, GenerationTokens, Throughput string
	// LoRA adapters, in one of two ways. LoRAInfo is an info gauge whose
	// labels name them (vLLM's lora_requests_info): its sample of greatest
	// value is read (the value is when the engine set it, and the label
	// sets of earlier states linger), the adapter slots from its
	// LoRAMaxLabel, the adapters of the running and waiting requests from
	// LoRARunningLabel and LoRAWaitingLabel, comma-separated.
	// LoRASlotsTotal and LoRASlotsUsed are gauges of the slots and of the
	// distinct adapters the running requests use (SGLang's
	// lora_pool_slots_total and _used).
	LoRAInfo                                         string
	LoRAMaxLabel, LoRARunningLabel, LoRAWaitingLabel string
	LoRASlotsTotal, LoRASlotsUsed                    string
}

// families calls add with each family the dialect reads (latest for one
// of which only the sample of greatest value is read). A field read from
// an exposition must be named here: Parse hands the text parser only
// these families.
func (d *Dialect) families(add func(name string, latest bool)) {
	for _, n := range [][]string{{d.Marker, d.Running, d.Waiting, d.Used, d.HitRate, d.PromptTokens, d.GenerationTokens,
		d.Throughput, d.LoRASlotsTotal, d.LoRASlotsUsed}, d.When, d.Usage, d.Hits, d.Queries} {
		for _, name := range n {
			add(name, false)
		}
	}
	for _, c := range d.Capacity {
		add(c.Family, false)
	}
	add(d.LoRAInfo, true)
}

// A Capacity rule reads the KV capacity from a family: a sample's value,
// or, for an info metric, the product of the first of Labels' lists of
// labels that all hold positive whole numbers (num_pages × page_size).
type Capacity struct {
	Family string
	Labels [][]string
	// Total says each sample is the replica's whole capacity, repeated
	// under each engine's label, not that engine's share: vLLM's
	// cache_config_info is the front end's CacheConfig, whose
	// num_gpu_blocks sums its data-parallel engines'. It is read once and
	// split evenly among the engines.
	Total bool
}

// Formats of the dialects gorgo knows.
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

// vllmCapacity is vLLM's cache_config_info: kv_cache_size_tokens, or
// num_gpu_blocks × block_size.
var vllmCapacity = []Capacity{{Family: "vllm:cache_config_info", Labels: [][]string{{"kv_cache_size_tokens"}, {"num_gpu_blocks", "block_size"}}, Total: true}}

// Dialects are the engines Parse recognises.
var Dialects = []Dialect{
	{
		Format: FormatSGLang, Engine: "SGLang",
		Marker:  "sglang:num_running_reqs",
		Running: "sglang:num_running_reqs", Waiting: "sglang:num_queue_reqs",
		RankLabels: []string{"tp_rank", "pp_rank", "moe_ep_rank", "pid"},
		Capacity: []Capacity{{Family: "sglang:max_total_num_tokens"},
			{Family: "sglang:cache_config_info", Labels: [][]string{{"num_pages", "page_size"}}}},
		Usage: []string{"sglang:token_usage"}, Used: "sglang:num_used_tokens",
		HitRate:      "sglang:cache_hit_rate",
		PromptTokens: "sglang:prompt_tokens_total", GenerationTokens: "sglang:generation_tokens_total",
		Throughput:     "sglang:gen_throughput",
		LoRASlotsTotal: "sglang:lora_pool_slots_total", LoRASlotsUsed: "sglang:lora_pool_slots_used",
	},
	{
		Format: FormatVLLMV0, Engine: "vLLM",
		Marker:  "vllm:num_requests_running",
		When:    []string{"vllm:gpu_prefix_cache_hit_rate", "vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc"},
		Running: "vllm:num_requests_running", Waiting: "vllm:num_requests_waiting",
		Capacity: vllmCapacity, EngineLabel: "engine",
		Usage:        []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
		HitRate:      "vllm:gpu_prefix_cache_hit_rate",
		PromptTokens: "vllm:prompt_tokens_total", GenerationTokens: "vllm:generation_tokens_total",
		LoRAInfo:     "vllm:lora_requests_info",
		LoRAMaxLabel: "max_lora", LoRARunningLabel: "running_lora_adapters", LoRAWaitingLabel: "waiting_lora_adapters",
	},
	{
		Format: FormatVLLM, Engine: "vLLM",
		Marker:  "vllm:num_requests_running",
		Running: "vllm:num_requests_running", Waiting: "vllm:num_requests_waiting",
		Capacity: vllmCapacity, EngineLabel: "engine",
		Usage:        []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
		Hits:         []string{"vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"},
		Queries:      []string{"vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"},
		PromptTokens: "vllm:prompt_tokens_total", GenerationTokens: "vllm:generation_tokens_total",
		LoRAInfo:     "vllm:lora_requests_info",
		LoRAMaxLabel: "max_lora", LoRARunningLabel: "running_lora_adapters", LoRAWaitingLabel: "waiting_lora_adapters",
	},
}
