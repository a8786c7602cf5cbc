package enginemetrics

import (
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
)

// captureDir holds real engine dumps, shared outside the project.
const captureDir = "../../../shared/data/engines/metrics"

// readCapture returns a real capture, skipping the test when it is absent.
func readCapture(tb testing.TB, name string) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(captureDir, name))
	if errors.Is(err, os.ErrNotExist) {
		tb.Skipf("capture %s not found in %s (shared data not checked out next to the project)", name, captureDir)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func parse(t *testing.T, text string) Metrics {
	t.Helper()
	em, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return em
}

func checkMetrics(t *testing.T, got, want Metrics) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestParseSGLangCapture(t *testing.T) {
	b := readCapture(t, "sglang-2026-qwen3.5.txt")
	want := Metrics{
		Format:                FormatSGLang,
		Running:               0,
		Waiting:               0,
		KVUsedTokens:          0,
		KVUsage:               0,      // sglang:token_usage 0.0 (full_token_usage is not read)
		KVCapacityTokens:      788766, // sglang:max_total_num_tokens 788766.0
		CacheHitRate:          0,
		PromptTokensTotal:     92,
		GenerationTokensTotal: 9,
		GenThroughput:         0,
		Model:                 "Qwen/Qwen3.5-35B-A3B-FP8",
	}
	em, err := Parse(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	checkMetrics(t, em, want)

	// The capture as SGLang served it, without its final newline.
	em, err = Parse(bytes.NewReader(bytes.TrimRight(b, "\n")))
	if err != nil {
		t.Fatalf("without the final newline: %v", err)
	}
	checkMetrics(t, em, want)

	// Load it: the same dump with a busy scheduler.
	busy := string(b)
	for _, r := range []struct{ name, v string }{
		{"num_running_reqs", "12.0"}, {"num_queue_reqs", "3.0"}, {"num_used_tokens", "394383.0"},
		{"token_usage", "0.5"}, {"cache_hit_rate", "0.75"}, {"gen_throughput", "812.5"},
	} {
		line := "sglang:" + r.name + `{engine_type="unified",model_name="Qwen/Qwen3.5-35B-A3B-FP8",moe_ep_rank="0",pp_rank="0",tp_rank="0"} `
		if !strings.Contains(busy, line+"0.0\n") {
			t.Fatalf("capture has no line %q", line)
		}
		busy = strings.Replace(busy, line+"0.0\n", line+r.v+"\n", 1)
	}
	want.Running, want.Waiting, want.KVUsedTokens, want.KVUsage, want.CacheHitRate, want.GenThroughput = 12, 3, 394383, 0.5, 0.75, 812.5
	checkMetrics(t, parse(t, busy), want)
}

func TestParseVLLMV1Capture(t *testing.T) {
	b := readCapture(t, "vllm-0.29-v1.txt")
	want := Metrics{
		Format:                FormatVLLM,
		KVCapacityTokens:      322944, // kv_cache_size_tokens="322944" (= 20184 blocks × 16)
		CacheHitRate:          432.0 / 530.0,
		PrefixQueriesTotal:    530,
		PrefixHitsTotal:       432,
		PromptTokensTotal:     530,
		GenerationTokensTotal: 584,
		Model:                 "qwen2.5-1.5b",
		StartTime:             1.78990180866e+09, // process_start_time_seconds
	}
	em, err := Parse(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	checkMetrics(t, em, want)

	busy := string(b)
	for _, r := range []struct{ name, v string }{
		{"num_requests_running", "7.0"}, {"num_requests_waiting", "2.0"}, {"kv_cache_usage_perc", "0.25"},
	} {
		line := "vllm:" + r.name + `{engine="0",model_name="qwen2.5-1.5b"} `
		if !strings.Contains(busy, line+"0.0\n") {
			t.Fatalf("capture has no line %q", line)
		}
		busy = strings.Replace(busy, line+"0.0\n", line+r.v+"\n", 1)
	}
	want.Running, want.Waiting, want.KVUsage, want.KVUsedTokens = 7, 2, 0.25, 80736 // 0.25 × 322944
	checkMetrics(t, parse(t, busy), want)
}

func TestParseVLLMV0Excerpt(t *testing.T) {
	b := readCapture(t, "vllm-0.7-v0-excerpt.txt")
	// The excerpt ends inside vllm:iteration_tokens_total (no +Inf bucket,
	// no _count), but at a line boundary: it parses, and every gauge read
	// comes before the cut.
	want := Metrics{
		Format:                FormatVLLMV0,
		KVCapacityTokens:      81767 * 16, // num_gpu_blocks × block_size; V0 has no kv_cache_size_tokens
		CacheHitRate:          0,          // gpu_prefix_cache_hit_rate is −1: not computed
		PromptTokensTotal:     148,
		GenerationTokensTotal: 955,
		Model:                 "Qwen/Qwen2.5-Coder-1.5B-Instruct",
	}
	em, err := Parse(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	checkMetrics(t, em, want)

	// Cut inside the last line's labels: an error, not a guess.
	cut := b[:bytes.LastIndex(b, []byte("model_name"))+8]
	_, err = Parse(bytes.NewReader(cut))
	var pe expfmt.ParseError
	if !errors.As(err, &pe) {
		t.Errorf("cut inside labels: error %v, want an expfmt.ParseError", err)
	}

	busy := strings.NewReplacer(
		`vllm:gpu_cache_usage_perc{model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct"} 0.0`,
		`vllm:gpu_cache_usage_perc{model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct"} 0.5`,
		`vllm:gpu_prefix_cache_hit_rate{model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct"} -1.0`,
		`vllm:gpu_prefix_cache_hit_rate{model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct"} 0.4`,
		`vllm:num_requests_waiting{model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct"} 0.0`,
		`vllm:num_requests_waiting{model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct"} 9.0`,
	).Replace(string(b))
	// The V0 capacity has no engine label and the usage a model_name: one
	// capacity, paired with the one usage.
	want.KVUsage, want.KVUsedTokens, want.CacheHitRate, want.Waiting = 0.5, 81767*16/2, 0.4, 9
	checkMetrics(t, parse(t, busy), want)
}

func TestParseFormatDetection(t *testing.T) {
	for _, c := range []struct{ name, text, format string }{
		{"sglang", "sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\n", FormatSGLang},
		{"vllm v1", "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n", FormatVLLM},
		{"vllm v1 before the rename", "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.1\n" +
			"vllm:gpu_prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 4\n", FormatVLLM},
		{"vllm v0 by hit rate gauge", "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:gpu_prefix_cache_hit_rate 0.5\n", FormatVLLMV0},
		{"vllm v0 by swapped", "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:num_requests_swapped 0\n", FormatVLLMV0},
	} {
		t.Run(c.name, func(t *testing.T) {
			em := parse(t, c.text)
			if em.Format != c.format || em.Running != 1 {
				t.Errorf("format %q running %d, want %q 1", em.Format, em.Running, c.format)
			}
		})
	}
	// V1 before the rename: the gpu_ counters give the hit rate.
	em := parse(t, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.1\n"+
		"vllm:gpu_prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 4\n")
	if em.CacheHitRate != 0.4 || em.KVUsage != 0.1 {
		t.Errorf("old V1 names: hit rate %v usage %v, want 0.4 0.1", em.CacheHitRate, em.KVUsage)
	}
}

func TestParseSGLangSumsLabelSets(t *testing.T) {
	// Two data-parallel ranks of one model and a second model.
	const text = `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="a",dp_rank="0"} 3
sglang:num_running_reqs{model_name="a",dp_rank="1"} 4
sglang:num_running_reqs{model_name="b",dp_rank="0"} 1
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="a",dp_rank="0"} 2
sglang:num_queue_reqs{model_name="a",dp_rank="1"} 0
sglang:num_queue_reqs{model_name="b",dp_rank="0"} 5
sglang:num_used_tokens{model_name="a",dp_rank="0"} 1000
sglang:num_used_tokens{model_name="a",dp_rank="1"} 3000
sglang:num_used_tokens{model_name="b",dp_rank="0"} 0
sglang:max_total_num_tokens{model_name="a",dp_rank="0"} 4000
sglang:max_total_num_tokens{model_name="a",dp_rank="1"} 4000
sglang:max_total_num_tokens{model_name="b",dp_rank="0"} 2000
sglang:token_usage{model_name="a",dp_rank="0"} 0.25
sglang:token_usage{model_name="a",dp_rank="1"} 0.75
sglang:token_usage{model_name="b",dp_rank="0"} 0
sglang:cache_hit_rate{model_name="a",dp_rank="0"} 0.5
sglang:cache_hit_rate{model_name="a",dp_rank="1"} 0.25
sglang:cache_hit_rate{model_name="b",dp_rank="0"} NaN
sglang:gen_throughput{model_name="a",dp_rank="0"} 100.5
sglang:gen_throughput{model_name="a",dp_rank="1"} 50
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="a"} 1e6
sglang:prompt_tokens_total{model_name="b"} 10
sglang:generation_tokens_total{model_name="a"} 20
`
	checkMetrics(t, parse(t, text), Metrics{
		Format: FormatSGLang, Running: 8, Waiting: 7, KVUsedTokens: 4000,
		KVUsage:           0.75, // the fullest rank
		KVCapacityTokens:  10000,
		CacheHitRate:      0.375, // mean of the usable samples (NaN ignored)
		PromptTokensTotal: 1000010, GenerationTokensTotal: 20, GenThroughput: 150.5,
		Model: "a,b",
	})
}

func TestParseSGLangFallbacks(t *testing.T) {
	// No max_total_num_tokens: cache_config_info pages × page size; no
	// num_used_tokens: usage × capacity.
	em := parse(t, `sglang:num_running_reqs 1
sglang:num_queue_reqs 0
sglang:cache_config_info{num_pages="1000",page_size="16"} 1
sglang:token_usage 0.5
`)
	if em.KVCapacityTokens != 16000 || em.KVUsedTokens != 8000 || em.KVUsage != 0.5 {
		t.Errorf("capacity %d used %d usage %v, want 16000 8000 0.5", em.KVCapacityTokens, em.KVUsedTokens, em.KVUsage)
	}
	// No token_usage: used / capacity.
	em = parse(t, "sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\nsglang:num_used_tokens 250\nsglang:max_total_num_tokens 1000\n")
	if em.KVUsage != 0.25 {
		t.Errorf("usage %v, want 0.25", em.KVUsage)
	}
}

func TestParseVLLMSumsEngines(t *testing.T) {
	// Two data-parallel engines; counters exposed OpenMetrics-style (TYPE
	// without _total) parse as untyped and count. Each engine's
	// cache_config_info is the front end's, whose num_gpu_blocks vLLM sums
	// over the engines (1,500 = 2 × 750): the replica's, once.
	const text = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2
vllm:num_requests_running{engine="1",model_name="m"} 3
vllm:num_requests_waiting{engine="0",model_name="m"} 1
vllm:num_requests_waiting{engine="1",model_name="m"} 1
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.1
vllm:cache_config_info{engine="0",block_size="16",num_gpu_blocks="1500",kv_cache_size_tokens="None"} 1
vllm:cache_config_info{engine="1",block_size="16",num_gpu_blocks="1500",kv_cache_size_tokens="None"} 1
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 300
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 100
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 150
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 50
vllm:prompt_tokens_total{engine="0",model_name="m"} 400
vllm:generation_tokens_total{engine="0",model_name="m"} 40
vllm:generation_tokens_total{engine="1",model_name="m"} 2
`
	checkMetrics(t, parse(t, text), Metrics{
		Format: FormatVLLM, Running: 5, Waiting: 2,
		KVUsedTokens:     7200, // 0.5 × 12000 + 0.1 × 12000
		KVUsage:          0.5,
		KVCapacityTokens: 24000,
		CacheHitRate:     0.5, PrefixQueriesTotal: 400, PrefixHitsTotal: 200,
		PromptTokensTotal: 400, GenerationTokensTotal: 42, Model: "m",
	})
}

func TestParseVLLMWithoutCapacity(t *testing.T) {
	em := parse(t, "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.3\n")
	if em.KVUsedTokens != 0 || em.KVCapacityTokens != 0 || em.KVUsage != 0.3 || em.CacheHitRate != 0 {
		t.Errorf("got %+v, want used 0, capacity 0, usage 0.3, hit rate 0 (no queries)", em)
	}
}

func TestParseIgnoresUnusableSamples(t *testing.T) {
	em := parse(t, `sglang:num_running_reqs{tp_rank="0"} 2
sglang:num_running_reqs{tp_rank="1"} NaN
sglang:num_running_reqs{tp_rank="2"} +Inf
sglang:num_running_reqs{tp_rank="3"} -4
sglang:num_queue_reqs 1e300
sglang:token_usage 1.5
sglang:cache_hit_rate -1
`)
	if em.Running != 2 || em.Waiting != maxCount || em.KVUsage != 1 || em.CacheHitRate != 0 {
		t.Errorf("got %+v, want running 2, waiting %d, usage 1, hit rate 0", em, maxCount)
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct {
		name, text string
		unknown    bool   // wraps ErrUnknownEngine
		mention    string // the message says
	}{
		{"json", `{"num_running_reqs": 1}`, false, "parse metrics exposition"},
		{"html", "<html><body>404 page not found</body></html>\n", false, "parse metrics exposition"},
		{"bad value", "sglang:num_running_reqs one\n", false, "parse metrics exposition"},
		{"bad labels", "sglang:num_running_reqs{tp_rank=0} 1\n", false, "parse metrics exposition"},
		{"empty", "", true, "expected sglang:num_running_reqs (SGLang) or vllm:num_requests_running (vLLM), found an empty exposition"},
		{"go process only", "# TYPE go_goroutines gauge\ngo_goroutines 12\nprocess_open_fds 9\n", true,
			"found 2 metric families (go_goroutines, process_open_fds)"},
		{"sglang without scheduler gauges", "sglang:prompt_tokens_total 3\n", true, "found sglang: metrics without sglang:num_running_reqs"},
		{"vllm without running", "vllm:kv_cache_usage_perc 0.5\n", true, "found vllm: metrics without vllm:num_requests_running"},
		{"sglang without queue", "sglang:num_running_reqs 1\n", false, "sglang exposition lacks sglang:num_queue_reqs"},
		{"vllm without waiting", "vllm:num_requests_running 1\n", false, "vllm exposition lacks vllm:num_requests_waiting"},
		{"both engines", "sglang:num_running_reqs 1\nvllm:num_requests_running 1\n", false, "both"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(c.text))
			if err == nil {
				t.Fatal("no error")
			}
			if errors.Is(err, ErrUnknownEngine) != c.unknown {
				t.Errorf("errors.Is(ErrUnknownEngine) = %v, want %v (%v)", !c.unknown, c.unknown, err)
			}
			if !strings.Contains(err.Error(), c.mention) {
				t.Errorf("error %q does not say %q", err, c.mention)
			}
		})
	}
}

// oneByteReader hands out its input a byte at a time, to exercise the
// final-newline reader at every boundary.
type oneByteReader struct{ s string }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0] = r.s[0]
	r.s = r.s[1:]
	return 1, nil
}

func TestParseWithoutFinalNewline(t *testing.T) {
	for _, text := range []string{
		"sglang:num_running_reqs 2\nsglang:num_queue_reqs 1",
		"sglang:num_running_reqs 2\nsglang:num_queue_reqs 1\n",
	} {
		em, err := Parse(&oneByteReader{text})
		if err != nil || em.Running != 2 || em.Waiting != 1 {
			t.Errorf("%q: %+v, %v", text, em, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("sglang:num_running_reqs 1\nsglang:num_queue_reqs 2\nsglang:token_usage 0.5\n"))
	f.Add([]byte("vllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n" +
		"vllm:cache_config_info{engine=\"0\",block_size=\"16\",num_gpu_blocks=\"99\"} 1\n"))
	f.Add([]byte("# TYPE x histogram\nx_bucket{le=\"1\"} 1\nx_count 1\n"))
	f.Add([]byte(vllmBase + `vllm:lora_requests_info{max_lora="2",running_lora_adapters="a, b",waiting_lora_adapters=""} 5` + "\n"))
	f.Add([]byte("sglang:num_running_reqs 1\nsglang:num_queue_reqs 2\nsglang:lora_pool_slots_total 8\nsglang:lora_pool_slots_used 3\n"))
	for _, name := range []string{"sglang-2026-qwen3.5.txt", "vllm-0.29-v1.txt", "vllm-0.7-v0-excerpt.txt"} {
		if b, err := os.ReadFile(filepath.Join(captureDir, name)); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		em, err := Parse(bytes.NewReader(b))
		if err != nil {
			return
		}
		switch {
		case em.Format != FormatSGLang && em.Format != FormatVLLM && em.Format != FormatVLLMV0:
			t.Errorf("format %q", em.Format)
		case em.Running < 0 || em.Waiting < 0 || em.KVUsedTokens < 0 || em.KVCapacityTokens < 0,
			em.Running > maxCount || em.Waiting > maxCount || em.KVUsedTokens > maxCount || em.KVCapacityTokens > maxCount:
			t.Errorf("counts out of range: %+v", em)
		case !(em.KVUsage >= 0 && em.KVUsage <= 1) || !(em.CacheHitRate >= 0 && em.CacheHitRate <= 1):
			t.Errorf("fractions out of [0, 1]: %+v", em)
		case math.IsNaN(em.PromptTokensTotal) || em.PromptTokensTotal < 0 || math.IsNaN(em.GenThroughput) || em.GenThroughput < 0:
			t.Errorf("totals: %+v", em)
		case em.MaxLoRAs < 0 || em.MaxLoRAs > maxCount || em.RunningAdapterCount < 0 || em.RunningAdapterCount > maxCount,
			len(em.RunningAdapters) > MaxAdapterNames || len(em.WaitingAdapters) > MaxAdapterNames:
			t.Errorf("adapters out of range: %+v", em)
		}
		for _, n := range slices.Concat(em.RunningAdapters, em.WaitingAdapters) {
			if n == "" || len(n) > MaxAdapterNameBytes || strings.Contains(n, ",") || strings.TrimSpace(n) != n {
				t.Errorf("adapter name %q", n)
			}
		}
	})
}

// A new engine's dialect is a row of the table: an engine with names of its
// own parses once its row is there.
func TestANewDialectIsARow(t *testing.T) {
	const text = "acme:busy{rank=\"0\"} 2\nacme:busy{rank=\"1\"} 1\nacme:queued 4\nacme:kv_tokens_max 1000\nacme:kv_fraction 0.25\nacme:hit_fraction 0.5\n"
	if _, err := Parse(strings.NewReader(text)); !errors.Is(err, ErrUnknownEngine) {
		t.Fatalf("before its row: %v, want ErrUnknownEngine", err)
	}
	saved := Dialects
	t.Cleanup(func() { Dialects = saved })
	Dialects = append(slices.Clone(saved), Dialect{Format: "acme", Engine: "Acme", Marker: "acme:busy",
		Running: "acme:busy", Waiting: "acme:queued", Capacity: []Capacity{{Family: "acme:kv_tokens_max"}},
		Usage: []string{"acme:kv_fraction"}, HitRate: "acme:hit_fraction"})
	checkMetrics(t, parse(t, text), Metrics{Format: "acme", Running: 3, Waiting: 4, KVCapacityTokens: 1000,
		KVUsedTokens: 250, KVUsage: 0.25, CacheHitRate: 0.5})
}
