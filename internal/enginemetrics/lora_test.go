package enginemetrics

import (
	"strings"
	"testing"
)

// vllmBase is the least of a vLLM V1 exposition.
const vllmBase = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"

// vLLM's lora_requests_info: the sample of greatest value is the engine's
// current state; the label sets of earlier states linger with older
// values, and are not read.
func TestParseVLLMLoRAInfoTakesTheLatest(t *testing.T) {
	text := vllmBase +
		"# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n" +
		`vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters="x,y"} 1.7382173358407154e+09` + "\n" +
		`vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql, code,,sql",waiting_lora_adapters=" chat "} 1.7382173418407154e+09` + "\n" +
		`vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7382173398407154e+09` + "\n"
	m := parse(t, text)
	checkMetrics(t, m, Metrics{Format: FormatVLLM, Running: 1, LoRAKnown: true, MaxLoRAs: 4,
		RunningAdapters: []string{"sql", "code"}, WaitingAdapters: []string{"chat"}, RunningAdapterCount: 2})

	// The same with the empty label set the latest: nothing runs.
	text = strings.Replace(text, "} 1.7382173398407154e+09", "} 1.7382173500000000e+09", 1)
	checkMetrics(t, parse(t, text), Metrics{Format: FormatVLLM, Running: 1, LoRAKnown: true, MaxLoRAs: 4})
}

// vLLM with LoRA off exposes lora_requests_info with max_lora="0": not
// known. Without the family, not known either.
func TestParseVLLMLoRAOff(t *testing.T) {
	off := vllmBase + `vllm:lora_requests_info{max_lora="0",running_lora_adapters="",waiting_lora_adapters=""} 1.7e+09` + "\n"
	for _, text := range []string{vllmBase, off} {
		checkMetrics(t, parse(t, text), Metrics{Format: FormatVLLM, Running: 1})
	}
}

// A hostile replica's lists are bounded: at most MaxAdapterNames names,
// none longer than MaxAdapterNameBytes.
func TestParseVLLMLoRABounded(t *testing.T) {
	var names []string
	for i := range 1000 {
		names = append(names, "a"+strings.Repeat("x", i%5)+string(rune('A'+i%26))+strings.Repeat("0", i/26))
	}
	long := strings.Repeat("z", MaxAdapterNameBytes+1)
	text := vllmBase + `vllm:lora_requests_info{max_lora="9",running_lora_adapters="` + long + "," + strings.Join(names, ",") +
		`",waiting_lora_adapters="ok,` + long + `"} 2` + "\n"
	m := parse(t, text)
	if len(m.RunningAdapters) != MaxAdapterNames || m.RunningAdapterCount != MaxAdapterNames || m.RunningAdapters[0] != names[0] {
		t.Errorf("%d running adapters (count %d), first %q; want %d, from %q", len(m.RunningAdapters), m.RunningAdapterCount,
			m.RunningAdapters[0], MaxAdapterNames, names[0])
	}
	if len(m.WaitingAdapters) != 1 || m.WaitingAdapters[0] != "ok" || m.MaxLoRAs != 9 {
		t.Errorf("waiting %q, max %d; want [ok], 9", m.WaitingAdapters, m.MaxLoRAs)
	}
}

// SGLang counts: the slots and those in use, the largest over label sets
// (every tensor-parallel rank reports the same pool).
func TestParseSGLangLoRASlots(t *testing.T) {
	const base = "sglang:num_running_reqs 3\nsglang:num_queue_reqs 0\n"
	text := base +
		`sglang:lora_pool_slots_total{model_name="m",tp_rank="0"} 8` + "\n" + `sglang:lora_pool_slots_total{model_name="m",tp_rank="1"} 8` + "\n" +
		`sglang:lora_pool_slots_used{model_name="m",tp_rank="0"} 3` + "\n" + `sglang:lora_pool_slots_used{model_name="m",tp_rank="1"} 3` + "\n"
	checkMetrics(t, parse(t, text), Metrics{Format: FormatSGLang, Running: 3, Model: "m", LoRAKnown: true, MaxLoRAs: 8, RunningAdapterCount: 3})
	checkMetrics(t, parse(t, base), Metrics{Format: FormatSGLang, Running: 3})
}
