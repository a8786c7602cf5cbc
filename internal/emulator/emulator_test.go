package emulator

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/prompt"
)

// start runs an emulated replica of the paper's engine on loopback.
func start(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	if cfg.Profile.Name == "" {
		p, err := engine.LookupProfile("paper")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Profile = p
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ts.Close()
		cancel()
		<-done
	})
	return s, ts.URL
}

func post(t *testing.T, url, body string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

type chunk struct {
	Object  string `json:"object"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// readSSE parses a stream into chunks, checking it ends with [DONE].
func readSSE(t *testing.T, r io.Reader) []chunk {
	t.Helper()
	var out []chunk
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if done {
			t.Fatalf("data after [DONE]: %q", line)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var c chunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		out = append(out, c)
	}
	if !done {
		t.Fatal("stream did not end with data: [DONE]")
	}
	return out
}

const chatBody = `{"model":"gorgo-emulated","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"%s"}],"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`

func chat(prompt string, maxTokens int) string {
	return strings.Replace(strings.Replace(chatBody, "%s", prompt, 1), "%d", itoa(maxTokens), 1)
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestStreamingChatAndCachedTokens(t *testing.T) {
	_, url := start(t, Config{Speedup: 20})
	text := strings.Repeat("tell me about the sea and the ships on it. ", 100) // ~1,100 tokens
	var cached []int
	for range 2 {
		resp := post(t, url+"/v1/chat/completions", chat(text, 5))
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		chunks := readSSE(t, resp.Body)
		resp.Body.Close()
		var content []string
		var usage *chunk
		for i := range chunks {
			c := chunks[i]
			if c.Object != "chat.completion.chunk" {
				t.Fatalf("object %q", c.Object)
			}
			if c.Usage != nil {
				usage = &chunks[i]
				if len(c.Choices) != 0 {
					t.Errorf("usage chunk carries choices")
				}
				continue
			}
			if d := c.Choices[0].Delta.Content; d != "" {
				content = append(content, d)
			}
		}
		if len(content) != 5 || chunks[0].Choices[0].Delta.Role != "assistant" {
			t.Fatalf("%d content chunks (want 5), first chunk %+v", len(content), chunks[0])
		}
		if f := chunks[len(chunks)-2].Choices[0].FinishReason; f == nil || *f != "length" {
			t.Errorf("last content chunk has no finish_reason length")
		}
		if usage == nil || usage.Usage.CompletionTokens != 5 || usage.Usage.PromptTokens < 1000 {
			t.Fatalf("usage %+v", usage)
		}
		cached = append(cached, usage.Usage.PromptTokensDetails.CachedTokens)
	}
	if cached[0] != 0 || cached[1] < 1000 {
		t.Errorf("cached tokens %v: want 0, then most of the prompt", cached)
	}
}

func TestNonStreamingAndCompletions(t *testing.T) {
	_, url := start(t, Config{Speedup: 50})
	resp := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"hi there"}]}],"max_tokens":3}`)
	var body struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d, %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if body.Object != "chat.completion" || len(strings.Fields(body.Choices[0].Message.Content)) != 3 || body.Usage.CompletionTokens != 3 {
		t.Errorf("body %+v", body)
	}
	resp = post(t, url+"/v1/completions", `{"prompt":"once upon a time","max_tokens":4,"stream":true}`)
	chunks := readSSE(t, resp.Body)
	resp.Body.Close()
	if len(chunks) != 4 || chunks[0].Object != "text_completion" || chunks[0].Choices[0].Text == "" {
		t.Errorf("completion chunks %+v", chunks)
	}
}

// A request for n answers gets n, each max_tokens long, in one stream
// (each chunk one choice, by its index) or one body; its usage counts the
// prompt once and every answer's tokens. A completion's best_of has the
// engine generate more than it answers with, and the usage count the
// answers' tokens alone, as vLLM does. The engine computes the prompt
// once: its siblings find it in the cache.
func TestManyAnswers(t *testing.T) {
	s, url := start(t, Config{Speedup: 50})
	resp := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"n":3,"stream":true,"stream_options":{"include_usage":true}}`)
	chunks := readSSE(t, resp.Body)
	resp.Body.Close()
	tokens, roles, finished := map[int]int{}, map[int]int{}, map[int]int{}
	var usage *chunk
	for i, c := range chunks {
		if c.Usage != nil {
			usage = &chunks[i]
			continue
		}
		if len(c.Choices) != 1 {
			t.Fatalf("chunk %d has %d choices", i, len(c.Choices))
		}
		ch := c.Choices[0]
		if ch.Delta.Content != "" {
			tokens[ch.Index]++
		}
		if ch.Delta.Role == "assistant" {
			roles[ch.Index]++
		}
		if ch.FinishReason != nil {
			finished[ch.Index]++
		}
	}
	for i := range 3 {
		if tokens[i] != 4 || roles[i] != 1 || finished[i] != 1 {
			t.Errorf("answer %d: %d tokens, %d role chunks, %d finishes; want 4, 1, 1", i, tokens[i], roles[i], finished[i])
		}
	}
	if len(tokens) != 3 || usage == nil || usage.Usage.CompletionTokens != 12 {
		t.Errorf("answers %v, usage %+v; want 3 answers and 12 completion tokens", tokens, usage)
	}

	resp = post(t, url+"/v1/completions", `{"prompt":"once upon a time","max_tokens":3,"n":2,"best_of":4}`)
	var body struct {
		Choices []struct {
			Index int    `json:"index"`
			Text  string `json:"text"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d, %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if len(body.Choices) != 2 || body.Choices[1].Index != 1 || len(strings.Fields(body.Choices[1].Text)) != 3 || body.Usage.CompletionTokens != 6 {
		t.Errorf("best_of 4, n 2: %+v; want 2 answers of 3 tokens, 6 in the usage", body)
	}
	if g, _ := s.drv.gauges(); g.GeneratedTokens != 12+12 {
		t.Errorf("the engine generated %d tokens, want 24: three answers of 4, four sequences of 3", g.GeneratedTokens)
	}

	long := strings.Repeat("a long prompt that the four answers share ", 50)
	before, _ := s.drv.gauges()
	resp = post(t, url+"/v1/completions", `{"prompt":"`+long+`","max_tokens":2,"n":4}`)
	resp.Body.Close()
	after, _ := s.drv.gauges()
	prompt, cached := after.PromptTokens-before.PromptTokens, after.CachedTokens-before.CachedTokens
	if resp.StatusCode != 200 || prompt-cached > prompt/4+int64(s.page) {
		t.Errorf("n 4: status %d, the engine computed %d of the %d prompt tokens of four sequences; want one prompt's", resp.StatusCode, prompt-cached, prompt)
	}

	resp = post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"n":1000}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("n 1000: status %d, want 400", resp.StatusCode)
	}
}

// A completion of several prompts is answered as so many requests: each
// prompt its own sequences, prompt tokens and cache, its choices indexed
// prompt by prompt, as vLLM does.
func TestBatchOfPrompts(t *testing.T) {
	_, url := start(t, Config{Speedup: 50})
	usageOf := func(body string) (prompt, cached int) {
		t.Helper()
		resp := post(t, url+"/v1/completions", body)
		chunks := readSSE(t, resp.Body)
		resp.Body.Close()
		for _, c := range chunks {
			if c.Usage != nil {
				return c.Usage.PromptTokens, c.Usage.PromptTokensDetails.CachedTokens
			}
		}
		t.Fatalf("%s: no usage", body)
		return 0, 0
	}
	long := strings.Repeat("a long and winding shared story ", 40)
	const opts = `,"max_tokens":1,"stream":true,"stream_options":{"include_usage":true}}`
	short, _ := usageOf(`{"prompt":"hello there"` + opts)
	longTokens, _ := usageOf(`{"prompt":"` + long + `"` + opts)

	resp := post(t, url+"/v1/completions", `{"prompt":["hello there","`+long+`"],"n":2,"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`)
	chunks := readSSE(t, resp.Body)
	resp.Body.Close()
	tokens, finished := map[int]int{}, map[int]int{}
	var usage *chunk
	for i, c := range chunks {
		if c.Usage != nil {
			usage = &chunks[i]
			continue
		}
		for _, ch := range c.Choices {
			if ch.Text != "" {
				tokens[ch.Index]++
			}
			if ch.FinishReason != nil {
				finished[ch.Index]++
			}
		}
	}
	for i := range 4 {
		if tokens[i] != 3 || finished[i] != 1 {
			t.Errorf("choice %d: %d tokens, %d finishes; want 3, 1", i, tokens[i], finished[i])
		}
	}
	if len(tokens) != 4 || usage == nil {
		t.Fatalf("choices %v, usage %+v; want 4 choices and a usage", tokens, usage)
	}
	u := usage.Usage
	if u.PromptTokens != short+longTokens || u.CompletionTokens != 12 {
		t.Errorf("usage %+v; want %d prompt tokens (%d and %d) and 12 completion tokens", *u, short+longTokens, short, longTokens)
	}
	// The long prompt, last, was served before: its blocks are cached, as
	// its own, not as a suffix of the short one. The usage gives the last
	// prompt's cached tokens, as vLLM's does, not the batch's sum.
	if u.PromptTokensDetails.CachedTokens == 0 {
		t.Errorf("cached tokens 0; want the long prompt's blocks served before")
	}
	resp = post(t, url+"/v1/completions", `{"prompt":["`+long+`","`+long+`"],"max_tokens":1}`)
	var twice struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&twice); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if c := twice.Usage.PromptTokensDetails.CachedTokens; c == 0 || c >= longTokens {
		t.Errorf("a batch of the cached prompt twice: %d cached tokens, want the last prompt's, under its %d", c, longTokens)
	}

	resp = post(t, url+"/v1/completions", `{"prompt":["hello",""],"max_tokens":3}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a batch with an empty prompt: status %d, want 400", resp.StatusCode)
	}
	resp = post(t, url+"/v1/completions", `{"prompt":["a","b","c"],"n":50,"max_tokens":3}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("3 prompts of 50 answers: status %d, want 400 (over %d sequences)", resp.StatusCode, maxSeqs)
	}
}

func TestErrorsAreOpenAIShaped(t *testing.T) {
	p, _ := engine.LookupProfile("paper")
	p.MaxContextTokens = 1000
	_, url := start(t, Config{Profile: p, Speedup: 50})
	cases := []struct {
		path, body string
		status     int
		want       string
	}{
		{"/v1/chat/completions", `{"messages": [`, 400, "malformed JSON"},
		{"/v1/chat/completions", `{"messages": []}`, 400, "at least one message"},
		{"/v1/chat/completions", `{"messages": [{"content": "x"}]}`, 400, "role is required"},
		{"/v1/chat/completions", `{"model": "gpt-9", "messages": [{"role":"user","content":"x"}]}`, 404, "does not exist"},
		{"/v1/chat/completions", `{"messages": [{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`, 400, "maximum context length is 1000"},
		{"/v1/chat/completions", `{"messages": [{"role":"user","content":"x"}], "max_tokens": 0}`, 400, "max_tokens"},
		{"/v1/completions", `{"prompt": 3}`, 400, "prompt"},
		// The sampling parameters the router reads only as hints are
		// checked as vLLM checks them.
		{"/v1/completions", `{"prompt":"x","n":3,"best_of":2}`, 400, "best_of must be greater than or equal to n"},
		{"/v1/completions", `{"prompt":"x","n":0}`, 400, "n must be an integer of at least 1"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":2.5}`, 400, "n must be an integer"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":"two"}`, 400, "n must be an integer"},
		{"/v1/completions", `{"prompt":"x","n":"3","best_of":"2"}`, 400, "best_of must be greater than or equal to n, got n=3 and best_of=2"},
		{"/v1/completions", `{"prompt":"x","n":70000}`, 400, "at most"},
		{"/v1/completions", `{"prompt":"x","min_tokens":-1}`, 400, "min_tokens must be an integer of at least 0"},
		{"/v1/completions", `{"prompt":"x","min_tokens":9,"max_tokens":8}`, 400, "min_tokens must be less than or equal to max_tokens=8"},
		// 2026-12-07, a user's test: a negative max_tokens was told of
		// min_tokens, and a huge one's total was capped.
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":-5}`, 400, "max_tokens must be at least 1, got -5"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":300000}`, 400, "you requested 300002 tokens (2 in the messages, 300000 in the completion)"},
	}
	for _, c := range cases {
		resp := post(t, url+c.path, c.body)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		err := json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if err != nil || resp.StatusCode != c.status || e.Error.Code != c.status || !strings.Contains(e.Error.Message, c.want) {
			t.Errorf("%s %s: status %d, error %+v (%v); want %d containing %q", c.path, c.body[:min(len(c.body), 40)], resp.StatusCode, e.Error, err, c.status, c.want)
		}
	}
}

// A path it has no route for is answered as both engines' servers
// (FastAPI) answer it, and so is SGLang's /generate on a vLLM replica: the
// router tells such a 404 from an engine's error about the request
// (wire.NoRoute).
func TestNoRouteIsFastAPIs(t *testing.T) {
	_, sglang := start(t, Config{Speedup: 50})
	_, vllm := start(t, Config{Speedup: 50, MetricsFormat: "vllm"})
	for _, c := range []struct {
		url, path string
		status    int
	}{
		{sglang, "/v2/everything", 404},
		{vllm, "/v2/everything", 404},
		{vllm, "/generate", 404},
		{sglang, "/generate", 200},
	} {
		resp := post(t, c.url+c.path, `{"text":"hi","sampling_params":{"max_new_tokens":2}}`)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || c.status == 404 && string(body) != `{"detail":"Not Found"}` {
			t.Errorf("%s on %s: %d %s, want %d (FastAPI's body for a 404)", c.path, c.url, resp.StatusCode, body, c.status)
		}
	}
}

func TestQueueFullGives503(t *testing.T) {
	p, _ := engine.LookupProfile("paper")
	p.MaxRunning = 1
	s, url := start(t, Config{Profile: p, MaxWaiting: 1})
	// One long request runs (in real time), one waits; the next is refused.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for want := 1; want <= 2; want++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chat("hello", 5000)))
		go func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		deadline := time.Now().Add(5 * time.Second)
		for {
			g, _ := s.drv.gauges()
			if g.Running+g.Waiting == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("request %d never entered the engine: %+v", want, g)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	resp := post(t, url+"/v1/chat/completions", chat("hello", 2))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status %d with a full waiting queue, want 503", resp.StatusCode)
	}
}

func metricFamilies(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	names := map[string]bool{}
	for n := range fams {
		names[n] = true
	}
	return names
}

func TestMetricsParseWithEngineNames(t *testing.T) {
	for format, want := range map[string][]string{
		"sglang": {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens", "sglang:token_usage",
			"sglang:cache_hit_rate", "sglang:max_total_num_tokens", "sglang:gen_throughput", "sglang:time_to_first_token_seconds",
			"sglang:e2e_request_latency_seconds", "sglang:cache_config_info"},
		"vllm": {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
			"vllm:prefix_cache_hits_total", "vllm:cache_config_info", "vllm:time_to_first_token_seconds"},
	} {
		_, url := start(t, Config{MetricsFormat: format, Speedup: 50})
		resp := post(t, url+"/v1/chat/completions", chat("warm up", 2))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got := metricFamilies(t, url)
		for _, n := range want {
			if !got[n] {
				t.Errorf("%s: /metrics lacks %s", format, n)
			}
		}
	}
}

func TestFaults(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, Faults: Faults{FailFraction: 1}})
	resp := post(t, url+"/v1/chat/completions", chat("x", 1))
	resp.Body.Close()
	if resp.StatusCode != 500 {
		t.Errorf("fail fraction 1: status %d", resp.StatusCode)
	}

	_, url = start(t, Config{Speedup: 50, Faults: Faults{HangAfter: 1}})
	resp = post(t, url+"/v1/chat/completions", chat("x", 1))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	client := http.Client{Timeout: 300 * time.Millisecond}
	if _, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chat("x", 1))); err == nil {
		t.Error("request after the hang point was answered")
	}
	if _, err := client.Get(url + "/health"); err == nil {
		t.Error("health answered after the hang point")
	}

	s, url := start(t, Config{Speedup: 50, Faults: Faults{ExitAfter: 1}})
	resp = post(t, url+"/v1/chat/completions", chat("x", 1))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	go func() {
		if resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chat("x", 1))); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-s.exit:
	case <-time.After(5 * time.Second):
		t.Error("exit fault did not fire")
	}
	if err := s.Run(context.Background()); !errors.Is(err, ErrExitFault) {
		t.Errorf("Run after the exit fault: %v", err)
	}
}

func TestClientDisconnectFreesTheEngine(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) { testClientDisconnect(t, n) })
	}
}

// testClientDisconnect: a client asking for n answers goes away; the
// engine lets go of all n.
func testClientDisconnect(t *testing.T, n int) {
	s, url := start(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	body := strings.Replace(chat("a long story please", 5000), `"stream":true`, `"stream":true,"n":`+itoa(n), 1)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the first chunk
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		g, _ := s.drv.gauges()
		if g.Running == 0 && g.Waiting == 0 && driverHolds(s.drv) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine still holds the request: %+v; the driver %d sequences or streams", g, driverHolds(s.drv))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// driverHolds counts what the driver keeps for requests: streams, and
// sequences waiting for their prompt.
func driverHolds(d *driver) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.streams) + len(d.held) + len(d.ready)
}

// A request's later sequences wait for its first's first token; a client
// gone before that leaves nothing behind, held or running.
func TestSiblingsLeaveWithTheirClient(t *testing.T) {
	s, _ := start(t, Config{Speedup: 0.001}) // no first token while the test looks
	blocks := make([]uint64, (20000+s.page-1)/s.page)
	for i := range blocks {
		blocks[i] = uint64(i + 1)
	}
	r := engine.Request{PromptTokens: 20000, OutputTokens: 4, Blocks: blocks}
	_, first, err := s.drv.submit([]engine.Request{r, r, r, r, r, r}, []int{-1, 0, 0, -1, 3, 3}) // two prompts of three
	if err != nil {
		t.Fatal(err)
	}
	s.drv.mu.Lock()
	e := s.drv.eng.Gauges()
	s.drv.mu.Unlock()
	if e.Running+e.Waiting != 2 {
		t.Errorf("%d sequences in the engine, want 2: each prompt's first", e.Running+e.Waiting)
	}
	// The metrics count all six, as an engine that queues a request's n at
	// once does.
	if g, _ := s.drv.gauges(); g.Running+g.Waiting != 6 {
		t.Errorf("%d sequences in the gauges, want 6", g.Running+g.Waiting)
	}
	s.drv.cancel(first, 6)
	if g, _ := s.drv.gauges(); g.Running+g.Waiting != 0 || driverHolds(s.drv) != 0 {
		t.Errorf("after the client left: %d sequences in the engine, %d in the driver", g.Running+g.Waiting, driverHolds(s.drv))
	}
}

// Siblings the engine's queue cannot take yet wait in the driver, in
// order, and enter as it frees, as do a batch's later prompts: one running
// and one waiting at most, three answers all come. A client gone while one
// waits leaves nothing behind.
func TestSiblingsWaitForRoomInTheQueue(t *testing.T) {
	p, _ := engine.LookupProfile("paper")
	p.MaxRunning = 1
	s, url := start(t, Config{Profile: p, Speedup: 50, MaxWaiting: 1})
	client := &http.Client{Timeout: time.Minute} // a sibling dropped would hang the answer
	answers := func(body string) int {
		t.Helper()
		resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct{ Choices []struct{ Text string } }
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: status %d (%v)", body, resp.StatusCode, err)
		}
		return len(out.Choices)
	}
	if n := answers(`{"prompt":"once upon a time","max_tokens":3,"n":3}`); n != 3 {
		t.Errorf("%d answers, want 3", n)
	}
	// A batch's later prompts wait their turn as well: the request is
	// refused only when its first cannot get in.
	if n := answers(`{"prompt":["once","upon","a time"],"max_tokens":3}`); n != 3 {
		t.Errorf("a batch of three: %d answers, want 3", n)
	}

	// A leader that runs for minutes of the model's time holds the one
	// running slot while the test looks.
	r := engine.Request{PromptTokens: 16, OutputTokens: 100000, Blocks: []uint64{7}}
	_, first, err := s.drv.submit([]engine.Request{r, r, r}, []int{-1, 0, 0})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.drv.mu.Lock()
		ready := len(s.drv.ready)
		s.drv.mu.Unlock()
		if ready == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d siblings waiting for room, want 1", ready)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.drv.cancel(first, 3)
	if g, _ := s.drv.gauges(); g.Running+g.Waiting != 0 || driverHolds(s.drv) != 0 {
		t.Errorf("after the client left: %d sequences in the engine, %d in the driver", g.Running+g.Waiting, driverHolds(s.drv))
	}
}

// min_tokens lengthens an answer that has no max_tokens past the default.
func TestMinTokensLengthensTheDefault(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, DefaultMaxTokens: 4})
	resp := post(t, url+"/v1/completions", `{"prompt":"x","min_tokens":7,"n":null,"best_of":null}`)
	var body struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 || body.Usage.CompletionTokens != 7 {
		t.Errorf("min_tokens 7 over a default of 4: status %d, %d tokens (%v); want 7", resp.StatusCode, body.Usage.CompletionTokens, err)
	}
	resp.Body.Close()
}

// Token chunks are written by hand: they must stay valid JSON whatever the
// model's name holds.
func TestTokenChunksAreValidJSONForAnyModelName(t *testing.T) {
	name := "m\x7f\"q\\é\U000e0001"
	_, url := start(t, Config{Speedup: 50, Model: name})
	resp := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`)
	defer resp.Body.Close()
	chunks := readSSE(t, resp.Body) // fails on invalid JSON
	if len(chunks) != 4 {
		t.Errorf("%d chunks, want a role chunk and 3 tokens", len(chunks))
	}
}

// A batch's prompt that shares its opening with an earlier one finds the
// opening cached: it enters once the earlier has its first token, as
// SGLang holds it back (vLLM caches each block as it fills); the engine
// computes the opening once.
func TestBatchSharesItsOpening(t *testing.T) {
	_, url := start(t, Config{Speedup: 50})
	shared := strings.Repeat("shared instructions of an evaluation's few shots ", 20)
	resp := post(t, url+"/v1/completions", `{"prompt":["`+shared+`question one","`+shared+`question two"],"max_tokens":1,"stream":true,"stream_options":{"include_usage":true}}`)
	chunks := readSSE(t, resp.Body)
	resp.Body.Close()
	cached := -1
	for _, c := range chunks {
		if c.Usage != nil {
			cached = c.Usage.PromptTokensDetails.CachedTokens
		}
	}
	if opening := len(shared) / 4; cached < opening/2 {
		t.Fatalf("a fresh batch sharing a %d-token opening: %d cached tokens in its usage; want the last prompt to find most of it cached", opening, cached)
	}
}

// A batch's prompt the engine would refuse (too large for its KV cache)
// refuses the request whole, with a 400, whether or not it waits for an
// earlier prompt whose opening it shares: it does not leave the client
// waiting for a prompt that never enters, nor answer it empty.
func TestBatchWithARefusedPromptIsRefused(t *testing.T) {
	p, err := engine.LookupProfile("paper")
	if err != nil {
		t.Fatal(err)
	}
	p.KVCapacityTokens = 2000
	_, url := start(t, Config{Profile: p, Speedup: 50})
	shared := strings.Repeat("shared instructions of an evaluation's few shots ", 20)
	long := strings.Repeat("x", 12000)
	for _, n := range []string{"1", "2"} {
		for _, first := range []string{"another opening " + shared, shared + "question one"} {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions",
				strings.NewReader(`{"prompt":["`+first+`","`+shared+long+`"],"max_tokens":4,"n":`+n+`}`))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Errorf("n %s, first %.20q: %v", n, first, err)
				cancel()
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			cancel()
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("n %s, first %.20q: %d %.200s; want a 400, the prompt too large for the KV cache", n, first, resp.StatusCode, b)
			}
		}
	}
}

// The emulator counts a chat's media as the router does: an audio clip its
// seconds' tokens, a video its tokens, from the same estimator.
func TestMediaArePromptTokens(t *testing.T) {
	_, url := start(t, Config{Speedup: 100, Estimator: prompt.Estimator{AudioTokensPerSecond: 20, VideoTokens: 700}})
	body := `{"model":"gorgo-emulated","max_tokens":2,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":[` +
		`{"type":"audio_url","audio_url":{"url":"https://x/a.wav"}},{"type":"video_url","video_url":"https://x/v.mp4"},{"type":"text","text":"and?"}]}]}`
	resp := post(t, url+"/v1/chat/completions", body)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	chunks := readSSE(t, resp.Body)
	u := chunks[len(chunks)-1].Usage
	// user, a newline, 10 s of audio at 20 a second, the video's 700, "and?", a newline.
	if want := (len("user\n") + 200*4 + 700*4 + len("and?\n") + 3) / 4; u == nil || u.PromptTokens != want {
		t.Errorf("usage %+v, want %d prompt tokens", u, want)
	}
}
