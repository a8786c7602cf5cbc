package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/gorgo-llm/gorgo/internal/jsonrecipe"
)

// fromEvent is the Peek that ParseChunk's reading of data implies.
func fromEvent(t *testing.T, data []byte, ev Event) Peek {
	t.Helper()
	p := Peek{Token: ev.HasToken(), Finish: ev.FinishReason != "", End: ev.End, Abort: ev.FinishReason == "abort", Usage: ev.Usage != nil, CachedTokens: -1, ResponseID: ev.ResponseID}
	if u := ev.Usage; u != nil {
		p.CompletionTokens, p.CachedTokens = u.CompletionTokens, u.CachedTokens
	}
	// ParseChunk's Err is the error's message, which may be empty: read
	// what it decides on.
	var c struct {
		Object string          `json:"object"`
		Type   string          `json:"type"`
		Error  json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("%q: ParseChunk accepts it, encoding/json does not: %v", data, err)
	}
	p.Error = len(c.Error) > 0 && string(c.Error) != "null" || c.Object == "error" || c.Type == "error" || c.Type == "response.failed"
	return p
}

// checkPeek compares PeekChunk with ParseChunk on one chunk that ParseChunk
// accepts, and returns the Peek.
func checkPeek(t *testing.T, data []byte) Peek {
	t.Helper()
	got := PeekChunk(data)
	ev, err := ParseChunk(data)
	if err != nil {
		t.Fatalf("ParseChunk(%q): %v", data, err)
	}
	if want := fromEvent(t, data, ev); got != want {
		t.Fatalf("PeekChunk(%q) = %+v, ParseChunk reads %+v", data, got, want)
	}
	return got
}

var peekCases = []struct {
	data string
	want Peek
}{
	{`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		Peek{CachedTokens: -1}},
	{`{"choices":[{"index":0,"delta":{"content":"The"},"finish_reason":null}]}`, Peek{Token: true, CachedTokens: -1}},
	{`{"choices":[{"index":0,"delta":{},"finish_reason":"abort"}]}`, Peek{Finish: true, Abort: true, CachedTokens: -1}},
	{`{"choices":[{"index":0,"delta":{},"finish_reason":"abort","finish_reason":null}]}`, Peek{Finish: true, Abort: true, CachedTokens: -1}},
	{`{"choices":[{"index":0,"delta":{},"finish_reason":"abort","finish_reason":"stop"}]}`, Peek{Finish: true, CachedTokens: -1}},
	{`{"choices":[{"delta":{"content":"\n"}}]}`, Peek{Token: true, CachedTokens: -1}},
	{`{"choices":[{"delta":{"content":null,"reasoning_content":"hmm"}}]}`, Peek{Token: true, CachedTokens: -1}},
	{`{"choices":[{"delta":{"reasoning":"so"}}]}`, Peek{Token: true, CachedTokens: -1}},
	// A tool call's deltas are generated tokens (found in review: a
	// streamed tool call never had a first token).
	{`{"choices":[{"delta":{"reasoning":"","tool_calls":[{"function":{"arguments":"{\"a\""}}]}}]}`, Peek{Token: true, CachedTokens: -1}},
	{`{"choices":[{"delta":{"content":null,"tool_calls":[]}}]}`, Peek{CachedTokens: -1}},
	{`{"choices":[{"delta":{"tool_calls":[{}],"tool_calls":null}}]}`, Peek{CachedTokens: -1}},
	// Responses API events.
	{`{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}`, Peek{Token: true, CachedTokens: -1}},
	{`{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"{\""}`, Peek{Token: true, CachedTokens: -1}},
	{`{"type":"response.output_text.delta","delta":""}`, Peek{CachedTokens: -1}},
	{`{"type":"response.output_text.delta","delta":"a","delta":null}`, Peek{CachedTokens: -1}},
	{`{"type":"response.created","response":{"id":"resp_1","status":"in_progress"}}`, Peek{CachedTokens: -1, ResponseID: "resp_1"}},
	{`{"type":"response.created","response":{"id":"resp_1","ID":"resp_2"}}`, Peek{CachedTokens: -1, ResponseID: "resp_2"}},
	{`{"type":"response.created","response":{"id":"resp_1"},"response":null}`, Peek{CachedTokens: -1}},
	{`{"type":"response.created","response":{"id":"resp_1","id":null}}`, Peek{CachedTokens: -1, ResponseID: "resp_1"}},
	{`{"type":"response.output_item.added","item":{"id":"msg_1","type":"message"}}`, Peek{CachedTokens: -1}},
	{`{"type":"response.output_text.done","delta":"x"}`, Peek{CachedTokens: -1}},
	{`{"type":"response.completed","response":{"id":"resp_1","status":"completed","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":8},"output_tokens":40,"total_tokens":49}}}`,
		Peek{End: true, Usage: true, CompletionTokens: 40, CachedTokens: 8, ResponseID: "resp_1"}},
	{`{"type":"response.completed","response":{"usage":{"output_tokens":4}},"response":null}`, Peek{End: true, CachedTokens: -1}},
	{`{"type":"response.incomplete","response":{"status":"incomplete"}}`, Peek{End: true, CachedTokens: -1}},
	{`{"type":"response.in_progress","response":{"status":"in_progress"}}`, Peek{CachedTokens: -1}},
	{`{"usage":{"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":-1}},"response":{"usage":{"output_tokens":4,"input_tokens_details":{"cached_tokens":3}}}}`,
		Peek{End: true, Usage: true, CompletionTokens: 2, CachedTokens: -1}},
	{`{"choices":[{"text":" fib","index":0,"logprobs":null,"finish_reason":null}],"usage":null}`, Peek{Token: true, CachedTokens: -1}},
	{`{"choices":[{"text":"","finish_reason":"length"}]}`, Peek{Finish: true, CachedTokens: -1}},
	{`{"choices":[{"delta":{"content":" serene"},"finish_reason":"length","stop_reason":null}]}`, Peek{Token: true, Finish: true, CachedTokens: -1}},
	{`{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":8}}}`,
		Peek{End: true, Usage: true, CompletionTokens: 2, CachedTokens: 8}},
	{`{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":null}}`, Peek{End: true, Usage: true, CompletionTokens: 2, CachedTokens: -1}},
	{`{"choices":[],"usage":{"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":null}}}`, Peek{End: true, Usage: true, CompletionTokens: 2, CachedTokens: -1}},
	{`{"choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":1}}`, Peek{Token: true, Usage: true, CompletionTokens: 1, CachedTokens: -1}},
	{`{"error":{"message":"engine died","code":500}}`, Peek{Error: true, CachedTokens: -1}},
	{`{"object":"error","message":"out of memory","code":500}`, Peek{Error: true, CachedTokens: -1}},
	{`{"error":null,"choices":[{"delta":{"content":"a"}}]}`, Peek{Token: true, CachedTokens: -1}},
	{`{"error":""}`, Peek{Error: true, CachedTokens: -1}},
	// encoding/json's rules: keys fold case, later duplicates win, null
	// leaves a string as it was, a second object is merged.
	{`{"Choices":[{"DELTA":{"Content":"x"}}]}`, Peek{Token: true, CachedTokens: -1}},
	{`{"choices":[{"delta":{"content":"x","content":""}}]}`, Peek{CachedTokens: -1}},
	{`{"choices":[{"delta":{"content":"x","content":null}}]}`, Peek{Token: true, CachedTokens: -1}},
	{`{"choices":[{"delta":{"content":"x"}}],"choices":[{"finish_reason":"stop"}]}`, Peek{Token: true, Finish: true, CachedTokens: -1}},
	{`{"choices":[{"delta":{"content":"x"}}],"choices":[]}`, Peek{CachedTokens: -1}},
	{`{"choices":[{"delta":{"content":"x"}}],"choices":null,"choices":[null]}`, Peek{CachedTokens: -1}},
	{`{"usage":{"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":2}},"usage":{"prompt_tokens_details":{}}}`, Peek{End: true, Usage: true, CompletionTokens: 3, CachedTokens: 2}},
	{`{"usage":{"completion_tokens":3},"usage":null}`, Peek{CachedTokens: -1}},
	{`{"usage":{"completion_tokens":3},"usage":null,"usage":{}}`, Peek{End: true, Usage: true, CachedTokens: -1}},
	{`{"object":"error","object":null}`, Peek{Error: true, CachedTokens: -1}},
	{`{"object":"err\u006fr"}`, Peek{Error: true, CachedTokens: -1}},
	{`{"type":"error","code":"server_error","message":"EngineCore died","param":null,"sequence_number":7}`, Peek{Error: true, CachedTokens: -1}},
	{`{"type":"response.failed","response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"boom"}}}`, Peek{Error: true, CachedTokens: -1, ResponseID: "resp_1"}},
	{`{"type":"error","type":null}`, Peek{Error: true, CachedTokens: -1}},
	{`{"type":"error","type":"response.in_progress"}`, Peek{CachedTokens: -1}},
	{`{"type":"response.output_text.delta","delta":"error"}`, Peek{Token: true, CachedTokens: -1}},
	{`null`, Peek{CachedTokens: -1}},
	{`{}`, Peek{CachedTokens: -1}},
}

func TestPeekChunk(t *testing.T) {
	for _, tt := range peekCases {
		if got := checkPeek(t, []byte(tt.data)); got != tt.want {
			t.Errorf("PeekChunk(%s) = %+v, want %+v", tt.data, got, tt.want)
		}
	}
}

func TestPeekChunkDoesNotAllocate(t *testing.T) {
	for _, tt := range peekCases {
		data := []byte(tt.data)
		if bytes.IndexByte(data, '\\') >= 0 {
			continue // gjson unescapes strings with escapes
		}
		if n := testing.AllocsPerRun(100, func() { PeekChunk(data) }); n != 0 {
			t.Errorf("PeekChunk(%s): %v allocations", data, n)
		}
	}
}

func TestParseChunkReadsLegacyCompletions(t *testing.T) {
	ev, err := ParseChunk([]byte(`{"id":"cmpl-1","object":"text_completion","choices":[{"text":" fib","index":0,"logprobs":null,"finish_reason":null}],"usage":null}`))
	if err != nil || ev.Content != " fib" || !ev.HasToken() {
		t.Errorf("ParseChunk: %+v, %v", ev, err)
	}
}

// dataLines returns the data of each event of an SSE body but [DONE]
// (every capture here has one line per event).
func dataLines(body []byte) [][]byte {
	var out [][]byte
	for _, line := range bytes.Split(body, []byte("\n")) {
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data:"))
		if data = bytes.TrimSpace(data); ok && len(data) > 0 && string(data) != "[DONE]" {
			out = append(out, data)
		}
	}
	return out
}

// cassettes returns the recorded OpenAI exchanges (request URL, response
// body) in the shared data, or skips.
func cassettes(t *testing.T) (urls []string, bodies [][]byte) {
	t.Helper()
	dir := filepath.Join(engines, "openai")
	files, _ := filepath.Glob(filepath.Join(dir, "openai-recorded-*.yaml"))
	if len(files) == 0 {
		t.Skipf("no recorded OpenAI exchanges in %s (they live in ../shared/data, outside the project)", dir)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			Interactions []struct {
				Request struct {
					URL string `yaml:"url"`
				} `yaml:"request"`
				Response struct {
					Body string `yaml:"body"`
				} `yaml:"response"`
			} `yaml:"interactions"`
		}
		if err := yaml.Unmarshal(data, &c); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, in := range c.Interactions {
			urls = append(urls, filepath.Base(f))
			bodies = append(bodies, []byte(in.Response.Body))
		}
	}
	return urls, bodies
}

func TestPeekChunkOnRealStreams(t *testing.T) {
	var streams [][]byte
	for _, f := range []string{"vllm-0.6-chat-stream-usage.sse", "vllm-0.8-chat-stream-tail.sse", "sglang-2025-chat-stream-tail.sse"} {
		streams = append(streams, readCapture(t, "sse", f))
	}
	_, bodies := cassettes(t)
	streams = append(streams, bodies...)
	var chunks, tokens, usages, escaped int
	for _, s := range streams {
		for _, data := range dataLines(s) {
			if _, err := ParseChunk(data); err != nil {
				continue // an error body, not a stream
			}
			p := checkPeek(t, data)
			chunks++
			if p.Token {
				tokens++
			}
			if p.Usage {
				usages++
			}
			n := testing.AllocsPerRun(20, func() { PeekChunk(data) })
			switch {
			case bytes.IndexByte(data, '\\') >= 0:
				escaped++
				t.Logf("%v allocations for a chunk with escapes: %.120s", n, data)
			case n != 0:
				t.Errorf("PeekChunk(%s): %v allocations", data, n)
			}
		}
	}
	t.Logf("%d chunks (%d with escapes), %d with a token, %d with usage", chunks, escaped, tokens, usages)
	if chunks < 40 || tokens < 30 || usages < 4 {
		t.Errorf("too few chunks read: %d, %d tokens, %d usages", chunks, tokens, usages)
	}
}

func FuzzPeekChunk(f *testing.F) {
	for _, tt := range peekCases {
		f.Add([]byte(tt.data))
	}
	f.Add([]byte(`{"choices":[{"delta":{"content":"\"}"}}],"usage":{"completion_tokens":-9223372036854775808}}`))
	f.Add([]byte(`{"choices":[{"delta":{"ſontent":"x"}}],"usage":{"completion_tokens":1e3}}`))
	f.Add([]byte(`{"choices":[{"delta":{"content":"x`))
	f.Fuzz(func(t *testing.T, data []byte) {
		// The data as a chunk, and as the recipe of a valid chunk made of
		// the keys and values that matter.
		for _, chunk := range [][]byte{data, recipe(data)} {
			p := PeekChunk(chunk) // must not panic, whatever the data
			ev, err := ParseChunk(chunk)
			if err != nil {
				continue
			}
			if want := fromEvent(t, chunk, ev); p != want {
				t.Fatalf("PeekChunk(%q) = %+v, ParseChunk reads %+v", chunk, p, want)
			}
		}
	})
}

var (
	recipeKeys = []string{`"choices"`, `"delta"`, `"content"`, `"reasoning_content"`, `"reasoning"`, `"text"`, `"finish_reason"`,
		`"usage"`, `"completion_tokens"`, `"prompt_tokens_details"`, `"cached_tokens"`, `"error"`, `"object"`, `"message"`,
		`"tool_calls"`, `"type"`, `"Tool_Calls"`, `"response"`, `"output_tokens"`, `"input_tokens_details"`, `"input_tokens"`,
		`"CHOICES"`, `"Delta"`, `"Usage"`, `"\u0063ontent"`, `"ſtream"`, `"x"`, `"\ud800usage"`}
	recipeScalars = []string{`"response.output_text.delta"`, `"abort"`, `"\u0061bort"`, `"response.completed"`, `"error"`, `"err\u006fr"`, `""`, `"\n"`, `"a"`, "\"\xff\"", `"\ud800"`,
		`0`, `1`, `-1`, `-0`, `7`, `1.0`, `1e3`, `9223372036854775807`, `9223372036854775808`, `true`, `false`, `null`}
)

// recipe builds a valid JSON object from fuzz data out of recipeKeys and
// recipeScalars.
func recipe(data []byte) []byte {
	r := jsonrecipe.Recipe{Data: data, Keys: recipeKeys, Scalars: recipeScalars, MaxDepth: 5, MaxItems: 4}
	return r.Object(nil)
}

// scanBody is the proxy's reading of a non-streaming body's usage that
// PeekBody replaces.
func scanBody(data []byte) (tokens, cached int) {
	type details *struct {
		Cached *int `json:"cached_tokens"`
	}
	var v struct {
		Usage *struct {
			CompletionTokens int     `json:"completion_tokens"`
			OutputTokens     int     `json:"output_tokens"`
			Details          details `json:"prompt_tokens_details"`
			InputDetails     details `json:"input_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(data, &v) != nil || v.Usage == nil {
		return 0, -1
	}
	u := v.Usage
	cached = -1
	switch {
	case u.Details != nil && u.Details.Cached != nil:
		cached = *u.Details.Cached
	case u.InputDetails != nil && u.InputDetails.Cached != nil:
		cached = *u.InputDetails.Cached
	}
	return u.CompletionTokens + u.OutputTokens, cached
}

func checkBody(t *testing.T, data []byte) (int, int) {
	t.Helper()
	n, c := PeekBody(data)
	if wn, wc := scanBody(data); n != wn || c != wc {
		t.Fatalf("PeekBody(%q) = %d, %d; scanBody reads %d, %d", data, n, c, wn, wc)
	}
	return n, c
}

var bodyCases = []struct {
	body           string
	tokens, cached int
}{
	{`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi\nthere"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":8}}}`, 2, 8},
	{`{"usage":{"prompt_tokens":3606,"total_tokens":3646,"completion_tokens":40,"prompt_tokens_details":null}}`, 40, -1},
	{`{"usage":{"completion_tokens":40,"prompt_tokens_details":{"cached_tokens":null}}}`, 40, -1},
	{`{"usage":{"completion_tokens":40,"prompt_tokens_details":{}}}`, 40, -1},
	{`{"usage":null}`, 0, -1},
	{`{}`, 0, -1},
	{`null`, 0, -1},
	{`[]`, 0, -1},
	{`{"usage":{"completion_tokens":4`, 0, -1},
	{`{"usage":{"completion_tokens":4.5,"prompt_tokens_details":{"cached_tokens":1}}}`, 0, -1},
	{`{"usage":{"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":"1"}}}`, 0, -1},
	{`{"usage":{"completion_tokens":4,"prompt_tokens_details":[]}}`, 0, -1},
	{`{"usage":7}`, 0, -1},
	{`{"usage":{"prompt_tokens":"many","completion_tokens":4}}`, 4, -1},
	{`{"Usage":{"Completion_Tokens":4},"usage":{"prompt_tokens_details":{"cached_tokens":2}}}`, 4, 2},
	{`{"usage":{"completion_tokens":4},"usage":null,"usage":{"prompt_tokens_details":{"cached_tokens":2}}}`, 0, 2},
	{`{"choices":` + strings.Repeat("[", 20000) + `}`, 0, -1},
	// The Responses API's usage.
	{`{"id":"resp_1","object":"response","output":[],"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":8},"output_tokens":40}}`, 40, 8},
	{`{"usage":{"output_tokens":40,"input_tokens_details":null}}`, 40, -1},
	{`{"usage":{"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":-1},"input_tokens_details":{"cached_tokens":3}}}`, 5, -1},
}

func TestPeekBody(t *testing.T) {
	for _, tt := range bodyCases {
		if n, c := checkBody(t, []byte(tt.body)); n != tt.tokens || c != tt.cached {
			t.Errorf("PeekBody(%.80s) = %d, %d; want %d, %d", tt.body, n, c, tt.tokens, tt.cached)
		}
	}
	body := readCapture(t, "openai", "vllm-chat-nonstream-2025.json")
	if n, c := checkBody(t, body); n != 40 || c != -1 {
		t.Errorf("vLLM body: %d, %d", n, c)
	}
	if n := testing.AllocsPerRun(20, func() { PeekBody(body) }); n != 0 {
		t.Errorf("PeekBody: %v allocations", n)
	}
	urls, bodies := cassettes(t)
	for i, b := range bodies {
		if len(dataLines(b)) == 0 {
			n, c := checkBody(t, b)
			t.Logf("%s: %d completion tokens, %d cached", urls[i], n, c)
		}
	}
}

func FuzzPeekBody(f *testing.F) {
	for _, tt := range bodyCases {
		if len(tt.body) < 1000 { // long seeds slow the fuzzer down
			f.Add([]byte(tt.body))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkBody(t, data)
		checkBody(t, recipe(data))
	})
}

func TestParseIntAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range []string{"0", "-0", "7", "-7", "9223372036854775807", "-9223372036854775808", "9223372036854775808",
		"-9223372036854775809", "18446744073709551616", "99999999999999999999", "1.0", "1e3", "1E-2", "-1.5"} {
		var want int
		werr := json.Unmarshal([]byte(s), &want)
		got, ok := parseInt(s)
		if ok != (werr == nil) || ok && got != want {
			t.Errorf("parseInt(%q) = %d, %v; encoding/json: %d, %v", s, got, ok, want, werr)
		}
	}
}

var sink Peek

func BenchmarkPeekChunk(b *testing.B) {
	chunks := [][]byte{
		[]byte(`{"id":"chatcmpl-81667d8b92f74ae8ad207009cc1d2a5b","object":"chat.completion.chunk","created":1727154331,"model":"meta-llama/Meta-Llama-3-70B-Instruct","choices":[{"index":0,"delta":{"content":" image"},"logprobs":null,"finish_reason":null}]}`),
		[]byte(`{"id":"chatcmpl-81667d8b92f74ae8ad207009cc1d2a5b","object":"chat.completion.chunk","created":1727154331,"model":"meta-llama/Meta-Llama-3-70B-Instruct","choices":[{"index":0,"delta":{"content":".\n\n"},"logprobs":null,"finish_reason":null}]}`),
		[]byte(`{"id":"chatcmpl-81667d8b92f74ae8ad207009cc1d2a5b","object":"chat.completion.chunk","created":1727154331,"model":"meta-llama/Meta-Llama-3-70B-Instruct","choices":[],"usage":{"prompt_tokens":6421,"total_tokens":6426,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":6400}}}`),
	}
	for i, name := range []string{"token", "escaped-token", "usage"} {
		data := chunks[i]
		b.Run("ParseChunk/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ev, err := ParseChunk(data)
				if err != nil {
					b.Fatal(err)
				}
				sink.Token = ev.HasToken()
			}
		})
		b.Run("PeekChunk/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sink = PeekChunk(data)
			}
		})
	}
}

func BenchmarkPeekBody(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-233dc076-9044-4c75-9cad-142004caa379","object":"chat.completion","created":1760064805,"model":"qwen-vl","choices":[{"index":0,"message":{"role":"assistant","reasoning_content":null,"content":"` +
		strings.Repeat(`The image shows a dog on a beach.\n`, 200) + `","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":3606,"total_tokens":3646,"completion_tokens":40,"prompt_tokens_details":{"cached_tokens":3584}},"prompt_logprobs":null}`)
	b.Run("scanBody", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			scanBody(body)
		}
	})
	b.Run("PeekBody", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			PeekBody(body)
		}
	})
}

func TestPeekTail(t *testing.T) {
	for tail, want := range map[string][2]int{
		`...very long content"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":4000,"prompt_tokens_details":{"cached_tokens":8}}}`: {4000, 8},
		`"logprobs":{"content":[]}}],"usage": {"completion_tokens": 12}}` + "\n":                                                                            {12, -1},
		`xx","usage":{"completion_tokens":3`: {0, -1}, // cut: not whole
		`no usage here`:                      {0, -1},
		`{"usage":{"completion_tokens":5}},"usage":{"completion_tokens":"x"}}`:                              {5, -1}, // the last whole, well-typed one
		`"content":"he said \"usage\": {}"}],"usage":{"completion_tokens":7,"prompt_tokens_details":null}}`: {7, -1},
	} {
		if c, k := PeekTail([]byte(tail)); c != want[0] || k != want[1] {
			t.Errorf("PeekTail(%s) = %d, %d; want %d, %d", tail, c, k, want[0], want[1])
		}
	}
}

func TestResponseID(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{"id":"resp_1","created_at":1,"model":"m","object":"response","output":[],"usage":{"output_tokens":4}}`, "resp_1"},
		{`{"object":"response","id":"resp_2"}`, "resp_2"},
		{`{"id":"resp_3","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"a long answer cut sh`, "resp_3"},
		{`{"id":"embd-1","object":"list","data":[]}`, ""},
		{`{"id":"chatcmpl-1","object":"chat.completion","choices":[]}`, ""},
		{`{"id":"resp_4"}`, ""},
		{`{"id":7,"object":"response"}`, ""},
		{`[{"id":"resp_5","object":"response"}]`, ""},
		{``, ""},
	} {
		if got := ResponseID([]byte(c.body)); got != c.want {
			t.Errorf("%s: %q, want %q", c.body, got, c.want)
		}
	}
}

// A Responses API stream's error and response.failed events are errors,
// with their message (2026-12-05: read as neither tokens nor errors, so a
// stream that failed so was a served 200).
func TestResponsesErrorEvents(t *testing.T) {
	for data, msg := range map[string]string{
		`{"type":"error","code":"server_error","message":"EngineCore died","param":null,"sequence_number":7}`:                      "EngineCore died",
		`{"type":"response.failed","response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"boom"}}}`: "boom",
	} {
		ev, err := ParseChunk([]byte(data))
		if err != nil || !strings.Contains(ev.Err, msg) || !PeekChunk([]byte(data)).Error {
			t.Errorf("%s: error %q (%v), want %q", data, ev.Err, err, msg)
		}
	}
}

func TestAbortedUnanswered(t *testing.T) {
	for _, c := range []struct {
		body string
		want bool
	}{
		{`{"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"abort"}],"usage":{"prompt_tokens":9,"completion_tokens":0,"total_tokens":9}}`, true},
		{`{"choices":[{"index":0,"text":"","finish_reason":"abort"}]}`, true},
		{`{"choices":[{"index":0,"message":{"role":"assistant","content":"Half an"},"finish_reason":"abort"}],"usage":{"prompt_tokens":9,"completion_tokens":2}}`, false},
		{`{"choices":[{"index":0,"message":{"content":"abort"},"finish_reason":"stop"}],"usage":{"completion_tokens":1}}`, false},
		{`{"choices":[{"finish_reason":"abort"}`, false}, // cut short: not read
		{`[]`, false},
	} {
		if got := AbortedUnanswered([]byte(c.body)); got != c.want {
			t.Errorf("AbortedUnanswered(%s) = %v, want %v", c.body, got, c.want)
		}
	}
}

// A response id that is not valid UTF-8 reads as encoding/json reads it:
// each stray byte a U+FFFD (found by FuzzPeekChunk, 2026-12-05).
func TestPeekResponseIDInvalidUTF8(t *testing.T) {
	if p := checkPeek(t, []byte("{\"response\":{\"id\":\"a\x8bb\xff\"}}")); p.ResponseID != "a\uFFFDb\uFFFD" {
		t.Errorf("ResponseID %q", p.ResponseID)
	}
}

// KeepTail keeps the last TailBytes of all it was given, in order, however
// they come: one byte at a time, in pieces, or one piece longer than it.
func TestKeepTail(t *testing.T) {
	all := make([]byte, 3*TailBytes+7)
	for i := range all {
		all[i] = byte(i % 251)
	}
	want := all[len(all)-TailBytes:]
	for _, piece := range []int{1, 100, TailBytes - 1, TailBytes, len(all)} {
		var tail []byte
		for i := 0; i < len(all); i += piece {
			tail = KeepTail(tail, all[i:min(i+piece, len(all))])
		}
		if !bytes.Equal(tail, want) {
			t.Errorf("in pieces of %d: kept %d bytes, not the last %d", piece, len(tail), TailBytes)
		}
	}
	if got := KeepTail(nil, []byte("short")); string(got) != "short" {
		t.Errorf("a short answer's tail: %q", got)
	}
}

// Counts finds a chunk's last counts however it is cut, its meta_info
// ending in more log-probabilities than TailBytes (SGLang's
// return_logprob), where PeekNativeTail finds none.
func TestCounts(t *testing.T) {
	var lp []string
	for k := range 1200 {
		lp = append(lp, fmt.Sprintf("[-0.123456789,%d,null]", 1000+k))
	}
	chunk := []byte(`data: {"text":"` + strings.Repeat("y", 5000) + `","meta_info":{"id":"x","prompt_tokens":3,"completion_tokens":1234567,"cached_tokens": 89,"output_token_logprobs":[` + strings.Join(lp, ",") + `]}}` + "\n\n")
	if c, _ := PeekNativeTail(chunk[len(chunk)-TailBytes:]); c != 0 {
		t.Fatalf("the tail holds the counts (%d): the case is not the one meant", c)
	}
	for _, piece := range []int{1, 7, 20, countsWindow, 1000, len(chunk)} {
		var c Counts
		c.Feed([]byte(`"completion_tokens":3,`)) // an earlier event's, forgotten at Reset
		c.Reset()
		for i := 0; i < len(chunk); i += piece {
			c.Feed(chunk[i:min(i+piece, len(chunk))])
		}
		if n, cached, ok := c.Last(); !ok || n != 1234567 || cached != 89 {
			t.Errorf("in pieces of %d: %d, %d, %v", piece, n, cached, ok)
		}
	}
	var none Counts
	none.Feed([]byte(`{"text":"\"completion_tokens\": 5"}`))
	if _, cached, ok := none.Last(); ok || cached != -1 {
		t.Error("counts read from a string's escaped text")
	}
}

// gjson's validator recurses once per level of nesting: a client's body
// of a few million '[' overflows the stack and kills the router
// (2026-12-07: an abort body and a /generate body did). Untrusted bytes
// are validated by ValidJSON alone, which hands gjson only what nests
// within encoding/json's 10,000 levels; this keeps a new caller from
// reaching gjson's own (a review found every caller safe by convention).
func TestOnlyValidJSONCallsGJSONsValidator(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n := strings.Count(string(src), "gjson.Valid(") + strings.Count(string(src), "gjson.ValidBytes(")
		if filepath.Base(path) == "peek.go" && filepath.Base(filepath.Dir(path)) == "wire" {
			n-- // ValidJSON's own
		}
		if n > 0 {
			t.Errorf("%s calls gjson's validator %d times: use wire.ValidJSON (gjson's recurses per level of nesting)", path, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
