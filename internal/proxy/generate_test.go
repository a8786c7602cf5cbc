package proxy

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// SGLang's native API (POST /generate) is served through the router: its
// text (or token ids) is the prompt it is routed on and enters the prefix
// index, its answer in SGLang's shape gives the first token, the answer's
// length and the cached tokens, streamed or whole, a batch's too
// (2026-12-05: a 404).
func TestGenerateThroughTheRouter(t *testing.T) {
	var logs servetest.Log
	a := startReplica(t, 5*time.Millisecond, emulator.Faults{})
	b := startReplica(t, 5*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, AccessLog: slog.New(slog.NewTextHandler(&logs, nil))}, a, b)
	long := strings.Repeat("the same long instructions for every request of this application. ", 40)
	for i, c := range []struct{ body, want string }{
		{`{"text":"` + long + ` first","sampling_params":{"max_new_tokens":4},"stream":true}`, `"finish_reason":{"length":4,"type":"length"}`},
		{`{"text":"` + long + ` second","sampling_params":{"max_new_tokens":4}}`, `"completion_tokens":4`},
		{`{"input_ids":[[1,2,3],[4,5,6]],"sampling_params":{"max_new_tokens":2}}`, `"index":1`},
	} {
		code, body := do(t, "POST", url+"/generate", c.body)
		if code != 200 || !strings.Contains(body, c.want) {
			t.Errorf("request %d: %d %.300s, want %s", i, code, body, c.want)
		}
	}
	if stateOr(s, "a").IndexBlocks+stateOr(s, "b").IndexBlocks == 0 {
		t.Error("the text did not enter the prefix index")
	}
	eventually(t, "three access log lines", func() bool { return strings.Count(logs.String(), "msg=request") == 3 })
	// Each request's line found by what it is: a line is written when its
	// request ends, which may be after its client read the answer and sent
	// the next.
	var stream, whole, batch string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		switch {
		case !strings.Contains(line, "msg=request"):
		case strings.Contains(line, "stream=true"):
			stream = line
		case promptTokens(line) < 100: // the batch's few ids, not the long text
			batch = line
		default:
			whole = line
		}
	}
	if !strings.Contains(stream, "ttft_ms=") || !strings.Contains(stream, "output_tokens=4") {
		t.Errorf("the stream's first token or length not seen: %q", stream)
	}
	if !strings.Contains(whole, "output_tokens=4") || strings.Contains(whole, "cached_tokens=-1") {
		t.Errorf("the whole answer's length or cached tokens not read: %q", whole)
	}
	if !strings.Contains(batch, "output_tokens=4") {
		t.Errorf("the batch's answers not summed: %q", batch)
	}
	for _, id := range []string{"a", "b"} {
		if st := stateOr(s, id); st.InFlight != 0 {
			t.Errorf("%s keeps %d in flight", id, st.InFlight)
		}
	}
	if code, body := do(t, "POST", url+"/generate", `{"sampling_params":{"max_new_tokens":4}}`); code != 400 || !strings.Contains(body, "text or input_ids") {
		t.Errorf("no prompt: %d %s", code, body)
	}
}

// SGLang gives a request up (its abort_request, a pause) with a 200: a
// stream whose only chunk is an abort of no tokens, or a whole answer so:
// tried elsewhere, as the OpenAI API's aborts are.
func TestNativeAbortBeforeTheFirstTokenFailsOver(t *testing.T) {
	abort := `{"text":"","meta_info":{"id":"x","finish_reason":{"type":"abort","message":"Aborted"},"prompt_tokens":3,"completion_tokens":0,"cached_tokens":0}}`
	for _, stream := range []bool{true, false} {
		aborting := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			io.ReadAll(r.Body)
			if stream {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: "+abort+"\n\ndata: [DONE]\n\n")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, abort)
		})
		good := startReplica(t, 20*time.Millisecond, emulator.Faults{})
		_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, aborting, good)
		body := `{"text":"hello","sampling_params":{"max_new_tokens":3},"stream":false}`
		if stream {
			body = strings.Replace(body, "false", "true", 1)
		}
		resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get(ReplicaHeader) != "b" || !strings.Contains(string(got), `"completion_tokens":3`) {
			t.Errorf("stream %v: %d from %q: %.200s, want the other replica's answer", stream, resp.StatusCode, resp.Header.Get(ReplicaHeader), got)
		}
		if aborting.Served() != 1 {
			t.Errorf("stream %v: the aborting replica was sent %d requests, want 1 (it is nearer)", stream, aborting.Served())
		}
	}
}

// SGLang's streamed /generate reports a ValueError of the request (a
// prompt past the context, bad sampling params) as a 200 whose only
// chunk is {"error":{"message":...}}, then [DONE] (http_server.py,
// generate_request); unstreamed, the same error is a 400. Every replica
// would refuse it: it must be relayed, not failed over and charged to
// each replica's health.
func TestNativeStreamRequestErrorIsNotTheReplicas(t *testing.T) {
	const msg = "The input (9000 tokens) is longer than the model's context length (8192 tokens)."
	refusing := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"error":{"message":"`+msg+`"}}`+"\n\ndata: [DONE]\n\n")
	})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	tr, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, refusing, good)
	code, body := do(t, "POST", url+"/generate", `{"text":"hello","sampling_params":{"max_new_tokens":3},"stream":true}`)
	failures, _, _ := tr.Upstream("a").Health()
	if !strings.Contains(body, "context length") || failures != 0 || refusing.Served() != 1 {
		t.Errorf("%d %.300s; a's failures in a row %d: want the request's error relayed from a, a not blamed", code, body, failures)
	}
}

// A fleet of vLLM and SGLang replicas (gorgo supports both; results.md
// measures SGLang beside vLLM): vLLM serves no /generate, and answers it
// FastAPI's 404. A /generate the router sends there is tried on the next
// replica (found in review: the 404 was relayed, though the SGLang replica
// would serve it).
func TestGenerateNotLostToAReplicaWithoutIt(t *testing.T) {
	vllm := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"detail":"Not Found"}`)
	})
	sglang := startReplica(t, 20*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, vllm, sglang)
	code, body := do(t, "POST", url+"/generate", `{"text":"hello","sampling_params":{"max_new_tokens":3}}`)
	if code != 200 {
		t.Errorf("%d %s; want the SGLang replica's answer", code, body)
	}
	if vllm.Served() != 1 {
		t.Errorf("the vLLM replica (the nearer) was sent %d requests, want 1", vllm.Served())
	}
	// Its 404 is remembered: the next requests go to the SGLang replica
	// at once, not a round trip to the vLLM one each first.
	for range 4 {
		if code, body := do(t, "POST", url+"/generate", `{"text":"hello","sampling_params":{"max_new_tokens":3}}`); code != 200 {
			t.Errorf("%d %s", code, body)
		}
	}
	if vllm.Served() != 1 {
		t.Errorf("after its 404 the vLLM replica was sent %d /generate requests, want it passed over", vllm.Served()-1)
	}
}

// A whole native answer too long to hold (past max_answer_bytes) has its
// length read from its last bytes, meta_info's count (found in review: an
// OpenAI usage was looked for, and it was 0 tokens).
func TestLongNativeAnswerLength(t *testing.T) {
	text := strings.Repeat(strings.Repeat("y", 99)+" ", 1000) // 1,000 tokens of 100 bytes
	// With return_logprob, meta_info ends in every token's log-probability,
	// past the tail a relay keeps (2026-12-06: counted 0).
	logprobs := `,"output_token_logprobs":[` + strings.Repeat(`[-0.0123456789,12345,null],`, 999) + `[-0.5,1,null]]`
	for name, after := range map[string]string{"plain": "", "with logprobs": logprobs} {
		t.Run(name, func(t *testing.T) {
			var logs servetest.Log
			up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"text":"`+text+`","meta_info":{"id":"x","finish_reason":{"type":"length","length":1000},"prompt_tokens":3,"completion_tokens":1000,"cached_tokens":0`+after+`}}`)
			})
			_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{MaxAnswerBytes: 64 << 10}, AccessLog: slog.New(slog.NewTextHandler(&logs, nil))}, up)
			if code, _ := do(t, "POST", url+"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1000}}`); code != 200 {
				t.Fatalf("%d", code)
			}
			eventually(t, "the access log", func() bool { return strings.Contains(logs.String(), "msg=request") })
			if !strings.Contains(logs.String(), " output_tokens=1000 ") {
				t.Errorf("want output_tokens=1000: %s", logs.String())
			}
		})
	}
}

// The engines' APIs differ beyond /generate: vLLM serves /pooling and
// /classify, SGLang /get_model_info, and either answers a path it has no
// route for with its server's 404 ({"detail":"Not Found"}). In a fleet of
// both, such a 404 has the next replica tried, and later requests to that
// path pass the replica over; a 404 that is an engine's error about the
// request (a model it does not have, here a stored response) is not one
// (2026-12-05: the first replica's 404 was relayed).
func TestEndpointAReplicaLacksIsServedByAnother(t *testing.T) {
	notFound := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"detail":"Not Found"}`)
	}
	sglang := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/get_model_info":
			_, _ = io.WriteString(w, `{"model_path":"m"}`)
		case "/v1/responses/resp_1":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"object":"error","message":"Response with id 'resp_1' not found.","code":404}`)
		default:
			notFound(w)
		}
	})
	vllm := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if r.URL.Path != "/tokenize" {
			notFound(w)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"count":1,"max_model_len":8192,"tokens":[15339]}`)
	})
	// Round-robin: without the memory, every other request goes to the
	// replica without /tokenize first.
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Policy: "round-robin"}}, sglang, vllm)
	for i := range 4 {
		code, body := do(t, "POST", url+"/tokenize", `{"model":"m","prompt":"hello"}`)
		if code != 200 || !strings.Contains(body, "tokens") {
			t.Errorf("POST /tokenize #%d: %d %s; want the vLLM replica's answer", i, code, body)
		}
	}
	if n := sglang.Served(); n != 1 {
		t.Errorf("the replica without /tokenize was sent %d, want 1 (then passed over)", n)
	}
	if code, body := do(t, "GET", url+"/get_model_info", ""); code != 200 || !strings.Contains(body, "model_path") {
		t.Errorf("GET /get_model_info: %d %s; want the SGLang replica's", code, body)
	}
	// Neither has it: the client hears a 404 in OpenAI's shape.
	code, body := do(t, "POST", url+"/v1/made-up", `{"model":"m"}`)
	if code != 404 || !strings.Contains(body, `"error"`) || !strings.Contains(body, "/v1/made-up") {
		t.Errorf("a path no replica serves: %d %s; want a 404 error naming it", code, body)
	}
	// An engine's own 404 is relayed as it is.
	if code, body := do(t, "GET", url+"/v1/responses/resp_1", ""); code != 404 || !strings.Contains(body, "resp_1") {
		t.Errorf("GET of an unknown stored response: %d %s", code, body)
	}
}

// A replica without the endpoint does not have the last word: where the
// one that has it failed (busy), the client hears that, not the other's
// 404.
func TestNoRouteDoesNotHideTheRealFailure(t *testing.T) {
	busy := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"object":"error","message":"the queue is full","code":503}`)
	})
	vllm := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"detail":"Not Found"}`)
	})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Policy: "round-robin"}}, busy, vllm)
	code, body := do(t, "POST", url+"/generate", `{"text":"hello","sampling_params":{"max_new_tokens":3}}`)
	if code != 503 || !strings.Contains(body, "queue is full") {
		t.Errorf("%d %s; want the busy replica's 503", code, body)
	}
	if vllm.Served() != 1 {
		t.Errorf("the replica without /generate was sent %d, want 1", vllm.Served())
	}
}

// A streamed /generate answer whose chunks grow past what the relay
// holds (each carries the whole text so far: a long rollout's) is counted
// from the last chunk's meta_info, read as it passes, its
// log-probabilities after it or not (2026-12-05: counted as of the last
// chunk held, 64 of 100 tokens; then, with return_logprob, short again).
func TestLongNativeStreamLength(t *testing.T) {
	for _, c := range []struct {
		n, tokenBytes int
		logprobs      bool
	}{{100, 1000, false}, {200, 1000, true}} {
		var logs servetest.Log
		answer := servetest.NativeStream(c.n, c.tokenBytes, c.logprobs)
		up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, answer)
		})
		_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, AccessLog: slog.New(slog.NewTextHandler(&logs, nil))}, up)
		code, body := do(t, "POST", url+"/generate", fmt.Sprintf(`{"text":"hi","stream":true,"sampling_params":{"max_new_tokens":%d}}`, c.n))
		if code != 200 || body != answer {
			t.Fatalf("%d, %d bytes relayed of %d", code, len(body), len(answer))
		}
		eventually(t, "the access log", func() bool { return strings.Contains(logs.String(), "msg=request") })
		if want := fmt.Sprintf(" output_tokens=%d ", c.n); !strings.Contains(logs.String(), want) {
			t.Errorf("logprobs %v: want%s: %s", c.logprobs, want, logs.String())
		}
	}
}

// A streamed Responses API answer whose response.completed event is longer
// than the relay holds (it repeats the whole answer) is counted from the
// usage at its end, not from the deltas seen (vLLM's: one event may carry
// many tokens).
func TestLongCompletedEventUsage(t *testing.T) {
	var logs servetest.Log
	text := strings.Repeat("z", 80<<10)
	answer := "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"" + text + "\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\"," +
		"\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"" + text + "\"}]}]," +
		"\"usage\":{\"input_tokens\":3,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":4321,\"total_tokens\":4324}}}\n\n"
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, answer)
	})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, AccessLog: slog.New(slog.NewTextHandler(&logs, nil))}, up)
	code, body := do(t, "POST", url+"/v1/responses", `{"model":"m","input":"hi","stream":true}`)
	if code != 200 || body != answer {
		t.Fatalf("%d, %d bytes relayed of %d", code, len(body), len(answer))
	}
	eventually(t, "the access log", func() bool { return strings.Contains(logs.String(), "msg=request") })
	if !strings.Contains(logs.String(), " output_tokens=4321 ") {
		t.Errorf("want output_tokens=4321: %s", logs.String())
	}
}

// A /generate naming an adapter (SGLang's lora_path) goes only where the
// adapter is, the nearest replica without it passed over (it would refuse
// it); a replica that unloaded it answers SGLang's refusal (a 400, or a
// stream's error event), and the request is served by another that has
// it, the first not blamed. A lora_path no
// replica is known to serve is the engines' to refuse, and their 400 the
// request's: the replica keeps its base.
func TestGenerateGoesWhereItsAdapterIs(t *testing.T) {
	// Round trips far apart, so that a loaded machine's probes keep their order.
	a := servetest.StartReplicaWith(t, 2*time.Millisecond, emulator.Config{Model: "base", Speedup: 200})
	b := servetest.StartReplicaWith(t, 30*time.Millisecond, emulator.Config{Model: "base", LoRAModules: []string{"sql"}, Speedup: 200})
	c := servetest.StartReplicaWith(t, 80*time.Millisecond, emulator.Config{Model: "base", LoRAModules: []string{"sql"}, Speedup: 200})
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, FailureThreshold: 1, Policy: "gorgo-ms"}}, a, b, c)
	gen := func(adapter string, i int) (int, string) {
		return do(t, "POST", url+"/generate", fmt.Sprintf(`{"text":"query %d","lora_path":%q,"sampling_params":{"max_new_tokens":2},"stream":%v}`, i, adapter, i%2 == 1))
	}
	if code, body := gen("sql", 0); code != 200 || b.Served() != 1 {
		t.Fatalf("sql: %d (%s); served by a %d, b %d, c %d", code, body, a.Served(), b.Served(), c.Served())
	}
	if code, body := do(t, "POST", b.URL+"/v1/unload_lora_adapter", `{"lora_name":"sql"}`); code != 200 {
		t.Fatalf("unload: %d %s", code, body)
	}
	for i := 1; i <= 3; i++ {
		if code, body := gen("sql", i); code != 200 || strings.Contains(body, "error") {
			t.Errorf("sql after b unloaded it: %d %s", code, body)
		}
	}
	if a.Served() != 0 || c.Served() != 3 {
		t.Errorf("served by a %d, b %d, c %d; want 0, 2 (one refused), 3", a.Served(), b.Served(), c.Served())
	}
	if failures, ejections, _ := s.Upstream("b").Health(); failures != 0 || ejections != 0 {
		t.Errorf("b was blamed for not having the adapter: %d failures, %d ejections", failures, ejections)
	}
	if code, body := gen("chat", 4); code != 400 || !strings.Contains(body, "not loaded: chat") || a.Served() != 1 {
		t.Errorf("an adapter no replica serves: %d %s, want the engine's 400 (from a: %d)", code, body, a.Served())
	}
	if code, _ := do(t, "POST", url+"/generate", `{"text":"on the base","sampling_params":{"max_new_tokens":2}}`); code != 200 || a.Served() != 2 {
		t.Errorf("the base's /generate: %d, served by a %d (it lost its base?)", code, a.Served())
	}
}

// SGLang takes /generate as PUT too: so does the router (it was a 405).
func TestGenerateByPut(t *testing.T) {
	a := servetest.StartReplicaWith(t, 2*time.Millisecond, emulator.Config{Model: "m", Speedup: 200})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, a)
	if code, body := do(t, "PUT", url+"/generate", `{"text":"hello","sampling_params":{"max_new_tokens":2}}`); code != 200 || !strings.Contains(body, `"completion_tokens":2`) {
		t.Errorf("PUT /generate: %d %s", code, body)
	}
}

// SGLang's chat and completions name an adapter in lora_path too, beside
// the base as the model: such a request goes where the adapter is (it
// went to the nearest replica of the base, which would refuse it).
func TestChatLoRAPathGoesWhereItsAdapterIs(t *testing.T) {
	a := servetest.StartReplicaWith(t, 2*time.Millisecond, emulator.Config{Model: "base", Speedup: 200})
	b := servetest.StartReplicaWith(t, 40*time.Millisecond, emulator.Config{Model: "base", LoRAModules: []string{"sql"}, Speedup: 200})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Policy: "gorgo-ms"}}, a, b)
	chat := `{"model":"base","lora_path":"sql","max_tokens":2,"messages":[{"role":"user","content":"which table?"}]}`
	if code, body := do(t, "POST", url+"/v1/chat/completions", chat); code != 200 || b.Served() != 1 {
		t.Errorf("a chat for sql on base: %d %s; served by a %d, b %d", code, body, a.Served(), b.Served())
	}
	completion := `{"model":"base","lora_path":["sql"],"max_tokens":2,"prompt":"select"}`
	if code, body := do(t, "POST", url+"/v1/completions", completion); code != 200 || b.Served() != 2 {
		t.Errorf("a completion for sql on base: %d %s; served by a %d, b %d", code, body, a.Served(), b.Served())
	}
	if code, body := do(t, "POST", url+"/v1/chat/completions", `{"model":"base","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`); code != 200 || a.Served() != 1 {
		t.Errorf("a chat on the base: %d %s; served by a %d, b %d", code, body, a.Served(), b.Served())
	}
}

// promptTokens is an access log line's prompt_tokens, -1 if it has none.
func promptTokens(line string) int {
	_, v, ok := strings.Cut(line, " prompt_tokens=")
	if !ok {
		return -1
	}
	v, _, _ = strings.Cut(v, " ")
	n, err := strconv.Atoi(v)
	if err != nil {
		return -1
	}
	return n
}
