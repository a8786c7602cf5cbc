package enginemetrics

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// allocated is what f allocates, in bytes (every goroutine's: run it
// alone).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// hostile is an exposition of size bytes: the engine's gauges, then the
// lines line(i) makes.
func hostile(size int, line func(i int) string) []byte {
	var b bytes.Buffer
	b.WriteString("sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\n")
	for i := 0; b.Len() < size-128; i++ {
		b.WriteString(line(i))
	}
	return b.Bytes()
}

// A hostile replica's exposition, as large as a scrape reads, costs the
// router little memory: a family the router does not read is skipped
// whatever its label sets (parsing them all took 22 times the body's
// size), and one it reads is an error past MaxSeries label sets,
// MaxReadBytes of lines, or too many labels (the text parser's work grows
// with the square of a sample's labels).
func TestParseMemoryIsBounded(t *testing.T) {
	const bound = 32 << 20 // the body is 8 MiB
	for _, c := range []struct {
		name string
		line func(i int) string
		err  string // "": parses
	}{
		{"other family's label sets", func(i int) string { return fmt.Sprintf("x{a=\"%d\"} 1\n", i) }, ""},
		{"other families", func(i int) string { return fmt.Sprintf("x_%d 1\n", i) }, ""},
		{"a read family's label sets", func(i int) string { return fmt.Sprintf("sglang:cache_hit_rate{a=\"%d\"} 1\n", i) }, "label sets"},
		{"a read family's long labels", func(i int) string {
			return fmt.Sprintf("sglang:cache_hit_rate{a=\"%d\",b=\"%s\"} 1\n", i, strings.Repeat("b", 4000))
		}, "bytes"},
		{"a read family's many labels", func(i int) string {
			var l strings.Builder
			fmt.Fprintf(&l, "sglang:cache_hit_rate{i=\"%d\"", i)
			for j := range 150 {
				fmt.Fprintf(&l, ",l%d=\"\"", j)
			}
			return l.String() + "} 1\n"
		}, "labels"},
		{"a label set not closed", func(i int) string {
			switch {
			case i == 0:
				return "x{"
			case i < 90000:
				return fmt.Sprintf("l%d=\"\",", i)
			case i == 90000:
				return "\n"
			}
			return "y 1\n"
		}, "malformed"},
		{"lingering LoRA label sets", func(i int) string {
			return fmt.Sprintf("vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"a%d\",waiting_lora_adapters=\"\"} %d\n", i, i)
		}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := hostile(MaxExpositionBytes, c.line)
			if c.name == "lingering LoRA label sets" {
				body = bytes.Replace(body, []byte("sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\n"), []byte(vllmBase), 1)
			}
			var err error
			n := allocated(func() { _, err = Parse(bytes.NewReader(body)) })
			t.Logf("a %d MiB body: %.1f MiB allocated, %v", len(body)>>20, float64(n)/(1<<20), err)
			if n > bound {
				t.Errorf("Parse allocated %d MiB, want at most %d", n>>20, bound>>20)
			}
			if (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
				t.Errorf("error %v, want one saying %q", err, c.err)
			}
		})
	}
}

// vLLM's lora_requests_info keeps the label set of every state the engine
// was in: past MaxSeries of them, the latest is still the one read.
func TestParseManyLingeringLoRAStates(t *testing.T) {
	var b strings.Builder
	b.WriteString(vllmBase + "# TYPE vllm:lora_requests_info gauge\n")
	for i := range 3 * MaxSeries {
		v := 1000 + i
		if i == MaxSeries+7 {
			v = 9999 // the latest
		}
		fmt.Fprintf(&b, "vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"r%d\",waiting_lora_adapters=\"w%d\"} %d\n", i, i, v)
	}
	m := parse(t, b.String())
	want := fmt.Sprint(MaxSeries + 7)
	if m.MaxLoRAs != 4 || len(m.RunningAdapters) != 1 || m.RunningAdapters[0] != "r"+want || m.WaitingAdapters[0] != "w"+want {
		t.Errorf("%+v, want the adapters of state %s", m, want)
	}
}

// The model names read are bounded: the first MaxModelNames, none longer
// than MaxModelNameBytes.
func TestParseModelNamesBounded(t *testing.T) {
	var b strings.Builder
	fmt.Fprintf(&b, "sglang:num_running_reqs{model_name=%q} 1\n", strings.Repeat("m", MaxModelNameBytes+1))
	for i := range 200 {
		fmt.Fprintf(&b, "sglang:num_running_reqs{model_name=\"m%03d\"} 1\n", i)
	}
	b.WriteString("sglang:num_queue_reqs 0\n")
	m := parse(t, b.String())
	names := strings.Split(m.Model, ",")
	if len(names) != MaxModelNames || names[0] != "m000" || m.Running != 201 {
		t.Errorf("%d model names (%q...), running %d; want %d from m000, 201", len(names), names[0], m.Running, MaxModelNames)
	}
}

// parseWhole is Parse without the filter: every family parsed.
func parseWhole(t *testing.T, text []byte) (Metrics, error) {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return Metrics{}, err
	}
	d, err := detect(fams, &familyNames{})
	if err != nil {
		return Metrics{}, err
	}
	return d.read(fams)
}

// The lines Parse keeps are all it reads: the real captures, and the
// shapes of the text format (HELP and TYPE lines, quoted names, labels
// with braces and quotes, timestamps, blank lines), read the same as when
// the whole exposition is parsed.
func TestParseFilterKeepsWhatIsRead(t *testing.T) {
	texts := map[string][]byte{
		"shapes": []byte("# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 3\n\n" +
			"  # TYPE sglang:num_running_reqs gauge\n" +
			"sglang:num_running_reqs{tp_rank=\"0\",model_name=\"a}b\\\"c\"} 2 1700000000000\n" +
			"{\"sglang:num_running_reqs\",tp_rank=\"1\"} 3\n" +
			"# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n" +
			"\t{\"sglang:num_queue_reqs\"} 4\nsglang:token_usage 0.25\nsglang:max_total_num_tokens 1000\n" +
			"process_start_time_seconds 1.7e9\nsglang:lora_pool_slots_total 8\n"),
		"vllm": []byte(vllmBase + `vllm:lora_requests_info{max_lora="4",running_lora_adapters="a",waiting_lora_adapters=""} 5` + "\n" +
			`vllm:lora_requests_info{max_lora="4",running_lora_adapters="b",waiting_lora_adapters=""} 7` + "\n" +
			"vllm:prefix_cache_queries_total 10\nvllm:prefix_cache_hits_total 4\n"),
	}
	for _, name := range []string{"sglang-2026-qwen3.5.txt", "vllm-0.29-v1.txt", "vllm-0.7-v0-excerpt.txt"} {
		if b, err := os.ReadFile(filepath.Join(captureDir, name)); err == nil {
			texts[name] = b
		}
	}
	for name, text := range texts {
		want, err := parseWhole(t, text)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := Parse(bytes.NewReader(text))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		checkMetrics(t, got, want)
	}
}

// A parse error names the exposition's line, not that of the lines kept.
func TestParseErrorNamesTheLine(t *testing.T) {
	_, err := Parse(strings.NewReader("go_goroutines 1\n# a comment\nx{a=\"1\"} 2\nsglang:num_running_reqs one\n"))
	var pe expfmt.ParseError
	if !errors.As(err, &pe) || pe.Line != 4 {
		t.Errorf("%v, want a parse error on line 4", err)
	}
}
