package emulator

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/wire"
)

// POST /generate answers in SGLang's native shape: each streamed chunk
// the whole text so far and its meta_info, then [DONE]; a whole answer
// one object, a batch a list; a second request of the same text finds it
// cached.
func TestGenerate(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, Model: "m"})
	long := strings.Repeat("a prompt long enough to fill several blocks of the cache. ", 20)
	status, body := postText(t, url+"/generate", `{"text":"`+long+`","sampling_params":{"max_new_tokens":3},"stream":true}`)
	if status != http.StatusOK || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("%d %s", status, body)
	}
	var events []wire.Peek
	for ev := range strings.SplitSeq(strings.TrimSuffix(body, "data: [DONE]\n\n"), "\n\n") {
		if data, ok := strings.CutPrefix(ev, "data: "); ok {
			events = append(events, wire.PeekNative([]byte(data)))
		}
	}
	if len(events) != 3 || !events[0].Token || events[0].Finish || !events[2].Finish || events[2].CompletionTokens != 3 {
		t.Errorf("events %+v, want three tokens, the last finishing", events)
	}
	if !strings.Contains(body, `"text":" the quick brown"`) {
		t.Errorf("the last chunk's text is not the whole answer: %s", body)
	}
	status, body = postText(t, url+"/generate", `{"text":"`+long+`","sampling_params":{"max_new_tokens":2}}`)
	if completion, cached := wire.PeekNativeBody([]byte(body)); status != http.StatusOK || completion != 2 || cached == 0 {
		t.Errorf("whole: %d %d tokens, %d cached: %s", status, completion, cached, body)
	}
	status, body = postText(t, url+"/generate", `{"input_ids":[[1,2],[3,4]],"sampling_params":{"max_new_tokens":2,"n":2}}`)
	if completion, _ := wire.PeekNativeBody([]byte(body)); status != http.StatusOK || completion != 8 || !strings.HasPrefix(body, "[") || !strings.Contains(body, `"index":3`) {
		t.Errorf("a batch of two prompts, two answers each: %d %s", status, body)
	}
	for _, bad := range []string{`{"sampling_params":{}}`, `{"text":"x","sampling_params":{"max_new_tokens":0}}`, `{"input_embeds":[[0.5]]}`} {
		if status, body := postText(t, url+"/generate", bad); status != http.StatusBadRequest {
			t.Errorf("%s: %d %s", bad, status, body)
		}
	}
}

// A /generate's lora_path runs it on that adapter, whose cache is its own
// (the base's blocks of the same text are not its); one not loaded is
// SGLang's 400, naming the adapters that are (streamed: a 200 and the
// error event).
func TestGenerateLoRAPath(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, Model: "m", LoRAModules: []string{"sql"}})
	long := strings.Repeat("a prompt long enough to fill several blocks of the cache. ", 20)
	cached := func(body string) int {
		t.Helper()
		status, answer := postText(t, url+"/generate", body)
		if status != http.StatusOK {
			t.Fatalf("%s: %d %s", body, status, answer)
		}
		_, c := wire.PeekNativeBody([]byte(answer))
		return c
	}
	cached(`{"text":"` + long + `","sampling_params":{"max_new_tokens":1}}`)
	if c := cached(`{"text":"` + long + `","lora_path":"sql","sampling_params":{"max_new_tokens":1}}`); c != 0 {
		t.Errorf("the adapter found %d tokens of the base's cache", c)
	}
	if c := cached(`{"text":"` + long + `","lora_path":["sql"],"sampling_params":{"max_new_tokens":1}}`); c == 0 {
		t.Errorf("the adapter's second request found none of its first's cache")
	}
	status, body := postText(t, url+"/generate", `{"text":"x","lora_path":"chat"}`)
	if status != http.StatusBadRequest || !strings.Contains(body, "The following requested LoRA adapters are not loaded: chat") || !strings.Contains(body, "sql") {
		t.Errorf("an adapter not loaded: %d %s", status, body)
	}
	status, body = postText(t, url+"/generate", `{"text":"x","lora_path":"chat","stream":true}`)
	if status != http.StatusOK || !strings.HasPrefix(body, `data: {"error":{"message":"The following requested LoRA adapters are not loaded: chat`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("an adapter not loaded, streamed: %d %s", status, body)
	}
}

// SGLang's /flush_cache empties the prefix cache (GET or POST), and
// refuses with a 400 while a request runs; /generate takes PUT as SGLang
// does.
func TestFlushCache(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, Model: "m"})
	long := strings.Repeat("a prompt long enough to fill several blocks of the cache. ", 20)
	cached := func(method string) int {
		t.Helper()
		req, _ := http.NewRequest(method, url+"/generate", strings.NewReader(`{"text":"`+long+`","sampling_params":{"max_new_tokens":1}}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s /generate: %d %s", method, resp.StatusCode, body)
		}
		_, c := wire.PeekNativeBody(body)
		return c
	}
	cached("POST")
	if cached("PUT") == 0 {
		t.Fatal("the second request found nothing cached")
	}
	if status, body := postText(t, url+"/flush_cache", ""); status != http.StatusOK || !strings.HasPrefix(body, "Cache flushed.") {
		t.Fatalf("flush: %d %q", status, body)
	}
	if c := cached("POST"); c != 0 {
		t.Errorf("after the flush: %d tokens cached", c)
	}

	// At the wall clock's pace, a long answer is still running when the
	// flush comes.
	_, slow := start(t, Config{Speedup: 1, Model: "m"})
	resp := post(t, slow+"/generate", `{"text":"x","stream":true,"sampling_params":{"max_new_tokens":4000}}`)
	defer resp.Body.Close()
	if _, err := resp.Body.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	resp2, err := http.Get(slow + "/flush_cache")
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusBadRequest {
		t.Errorf("a flush while a request runs: %d, want 400", resp2.StatusCode)
	}
}

// SGLang's /abort_request ends a /generate whose rid it begins (or all of
// them): its answer so far, finish_reason {"type": "abort"}, streamed or
// whole; another rid's goes on.
func TestAbortRequest(t *testing.T) {
	s, url := start(t, Config{Speedup: 1, Model: "m"})
	stream := post(t, url+"/generate", `{"text":"x","rid":"rollout-7","stream":true,"sampling_params":{"max_new_tokens":4000}}`)
	defer stream.Body.Close()
	if _, err := stream.Body.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if status, body := postText(t, url+"/abort_request", `{"rid":"rollout"}`); status != http.StatusOK {
		t.Fatalf("abort: %d %s", status, body)
	}
	rest, _ := io.ReadAll(stream.Body)
	events := strings.Split(strings.TrimSuffix(string(rest), "\n\n"), "\n\n")
	last := events[len(events)-2]
	if events[len(events)-1] != "data: [DONE]" || !strings.Contains(last, `"finish_reason":{"message":"Abort in waiting queue","type":"abort"}`) || strings.Contains(last, `"completion_tokens":4000`) {
		t.Errorf("the aborted stream ended %q, then %q", last, events[len(events)-1])
	}
	done := make(chan string, 1)
	go func() {
		_, body := postText(t, url+"/generate", `{"text":"y","rid":"other","sampling_params":{"max_new_tokens":4000}}`)
		done <- body
	}()
	waitServing(t, s, 1)
	if status, _ := postText(t, url+"/abort_request", `{"abort_all":true}`); status != http.StatusOK {
		t.Fatal(status)
	}
	if body := <-done; !strings.Contains(body, `"type":"abort"`) {
		t.Errorf("abort_all left a whole answer: %.300s", body)
	}
}

// SGLang's abort reaches its chats and completions too: a chat by its rid,
// streamed, ends with its choice's finish_reason "abort" and [DONE]; a
// whole completion under abort_all with its text so far.
func TestAbortRequestOpenAI(t *testing.T) {
	s, url := start(t, Config{Speedup: 1, Model: "m"})
	stream := post(t, url+"/v1/chat/completions", `{"model":"m","rid":"chat-1","stream":true,"max_tokens":4000,"messages":[{"role":"user","content":"x"}]}`)
	defer stream.Body.Close()
	if _, err := stream.Body.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if status, body := postText(t, url+"/abort_request", `{"rid":"chat"}`); status != http.StatusOK {
		t.Fatalf("abort: %d %s", status, body)
	}
	rest, _ := io.ReadAll(stream.Body)
	events := strings.Split(strings.TrimSuffix(string(rest), "\n\n"), "\n\n")
	if last := events[len(events)-2]; events[len(events)-1] != "data: [DONE]" || !strings.Contains(last, `"finish_reason":"abort"`) {
		t.Errorf("the aborted chat ended %q, then %q", last, events[len(events)-1])
	}
	done := make(chan string, 1)
	go func() {
		_, body := postText(t, url+"/v1/completions", `{"model":"m","prompt":"y","max_tokens":4000}`)
		done <- body
	}()
	waitServing(t, s, 1)
	if status, _ := postText(t, url+"/abort_request", `{"abort_all":true}`); status != http.StatusOK {
		t.Fatal(status)
	}
	if body := <-done; !strings.Contains(body, `"finish_reason":"abort"`) || !strings.Contains(body, `"object":"text_completion"`) {
		t.Errorf("abort_all left the completion: %.300s", body)
	}
}

// waitServing waits until n requests a client may abort are being served.
func waitServing(t *testing.T, s *Server, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		s.aborts.mu.Lock()
		serving := len(s.aborts.jobs)
		s.aborts.mu.Unlock()
		if serving == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests served, want %d", serving, n)
		}
	}
}

// A /generate whose text is a list, even of one, is answered with a list,
// as SGLang answers a batch (review, 2026-12-06: an object).
func TestGenerateBatchOfOne(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, Model: "m"})
	status, body := postText(t, url+"/generate", `{"text":["one"],"sampling_params":{"max_new_tokens":2}}`)
	if status != http.StatusOK || !strings.HasPrefix(strings.TrimSpace(body), "[{") {
		t.Errorf("a batch of one: %d %s, want a list", status, body)
	}
	if _, body := postText(t, url+"/generate", `{"text":"one","sampling_params":{"max_new_tokens":2}}`); !strings.HasPrefix(strings.TrimSpace(body), "{") {
		t.Errorf("one prompt: %s, want an object", body)
	}
}
