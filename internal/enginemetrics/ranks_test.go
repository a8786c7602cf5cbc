package enginemetrics

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// vLLM V1 with data parallelism (--data-parallel-size 2, one API server):
// the front end sums the engines' num_gpu_blocks during the handshake
// (vllm/v1/engine/utils.py: "Sum values from all engines in DP case") and
// PrometheusStatLogger.log_metrics_info then writes that same CacheConfig
// under every engine label. Each engine here has 1000 blocks of 16 tokens;
// the exposition shows num_gpu_blocks="2000" for engine 0 and engine 1.
func TestParseVLLMDataParallelCapacityCountedOnce(t *testing.T) {
	const text = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_running{engine="1",model_name="m"} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2000",num_gpu_blocks_override="None"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2000",num_gpu_blocks_override="None"} 1.0
`
	em := parse(t, text)
	// The replica holds 2 × 16000 tokens; engine 0 uses half of its 16000.
	if em.KVCapacityTokens != 32000 || em.KVUsedTokens != 8000 {
		t.Errorf("DP=2: capacity %d, used %d; want 32000 (2000 blocks × 16, the replica's total, once) and 8000 (0.5 × 16000)",
			em.KVCapacityTokens, em.KVUsedTokens)
	}
}

// SGLang with --enable-metrics-for-all-schedulers: every TP rank's
// scheduler (current_scheduler_metrics_enabled = attn_tp_rank == 0 or
// enable_metrics_for_all_schedulers) exports the same batch under its own
// tp_rank label. Those ranks run one batch; only dp_rank separates queues.
func TestParseSGLangRanksAreOneEngine(t *testing.T) {
	series := func(dp bool) string {
		var b strings.Builder
		for _, f := range []struct {
			name string
			v    [2]string // by DP group
		}{
			{"num_running_reqs", [2]string{"5.0", "3.0"}}, {"num_queue_reqs", [2]string{"2.0", "0.0"}},
			{"num_used_tokens", [2]string{"1000.0", "3000.0"}}, {"max_total_num_tokens", [2]string{"100000.0", "100000.0"}},
			{"token_usage", [2]string{"0.01", "0.03"}}, {"gen_throughput", [2]string{"300.0", "100.0"}},
		} {
			fmt.Fprintf(&b, "# HELP sglang:%s x\n# TYPE sglang:%s gauge\n", f.name, f.name)
			for tp := range 4 {
				g, dpl := 0, ""
				if dp { // --dp 2 --enable-dp-attention --tp 4: ranks 0,1 are DP group 0, 2,3 group 1
					g, dpl = tp/2, fmt.Sprintf(`dp_rank="%d",`, tp/2)
				}
				fmt.Fprintf(&b, "sglang:%s{%sengine_type=\"unified\",model_name=\"m\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"%d\"} %s\n",
					f.name, dpl, tp, f.v[g])
			}
		}
		return b.String()
	}
	t.Run("tp4", func(t *testing.T) {
		em := parse(t, series(false))
		if em.Running != 5 || em.Waiting != 2 || em.KVUsedTokens != 1000 || em.KVCapacityTokens != 100000 || em.GenThroughput != 300 {
			t.Errorf("TP=4: running %d waiting %d used %d capacity %d throughput %v; want 5 2 1000 100000 300 (one engine's batch, not 4 copies)",
				em.Running, em.Waiting, em.KVUsedTokens, em.KVCapacityTokens, em.GenThroughput)
		}
	})
	t.Run("dp2-attn-tp2", func(t *testing.T) {
		em := parse(t, series(true))
		if em.Running != 8 || em.Waiting != 2 || em.KVUsedTokens != 4000 || em.KVCapacityTokens != 200000 || em.GenThroughput != 400 {
			t.Errorf("DP=2×TP=2: running %d waiting %d used %d capacity %d throughput %v; want 8 2 4000 200000 400 (summed over dp_rank only)",
				em.Running, em.Waiting, em.KVUsedTokens, em.KVCapacityTokens, em.GenThroughput)
		}
	})
}

// The text parser accepts blanks between a sample's name and its label
// set ("name {a="1"} 1"). The filter, reading such a line, sees no labels,
// so neither MaxLabels nor labelWork applies, and the parser's duplicate
// label check is quadratic in the labels of a sample. The same line
// without the blank is refused at once.
func TestFilterBoundsLabelsAfterABlank(t *testing.T) {
	const n = 3000 // MaxLabels is 128
	var labels strings.Builder
	for i := range n {
		fmt.Fprintf(&labels, "l%d=\"\",", i)
	}
	for _, sep := range []string{"", " ", "\t"} {
		text := "sglang:num_running_reqs" + sep + "{" + labels.String() + "} 1\nsglang:num_queue_reqs 0\n"
		start := time.Now()
		_, err := Parse(strings.NewReader(text))
		took := time.Since(start)
		if err == nil || !strings.Contains(err.Error(), "labels") {
			t.Errorf("separator %q: %d labels (%d bytes) parsed in %v, error %v; want the MaxLabels error", sep, n, len(text), took, err)
		}
	}
}
