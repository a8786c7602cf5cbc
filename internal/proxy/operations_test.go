package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/servetest"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// A /flush_cache sent to the router empties every SGLang replica's cache,
// and the router forgets what it held there; a vLLM replica, which has no
// such path, is passed over and keeps its cache (2026-12-05: a 404, no
// replica flushed).
func TestFlushCacheReachesEveryReplica(t *testing.T) {
	a := servetest.StartReplicaWith(t, 2*time.Millisecond, emulator.Config{Model: "m", Speedup: 200})
	b := servetest.StartReplicaWith(t, 2*time.Millisecond, emulator.Config{Model: "m", Speedup: 200})
	c := servetest.StartReplicaWith(t, 2*time.Millisecond, emulator.Config{Model: "m", MetricsFormat: "vllm", Speedup: 200})
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Policy: "round-robin"}}, a, b, c)
	long := strings.Repeat("a prompt long enough to fill several blocks of the cache. ", 20)
	for i := range 3 {
		if code, body := do(t, "POST", url+"/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, long)); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		if stateOr(s, id).IndexBlocks == 0 {
			t.Fatalf("%s holds nothing in the router's index before the flush", id)
		}
	}
	code, body := do(t, "POST", url+"/flush_cache", "")
	if code != 200 || !strings.HasPrefix(body, "Cache flushed.") {
		t.Fatalf("flush: %d %q", code, body)
	}
	for _, id := range []string{"a", "b"} {
		if n := stateOr(s, id).IndexBlocks; n != 0 {
			t.Errorf("%s flushed, but the router's index keeps %d of its blocks", id, n)
		}
	}
	if stateOr(s, "c").IndexBlocks == 0 {
		t.Error("c, not flushed, lost its blocks in the router's index")
	}
	for _, r := range []*replica{a, b} {
		_, answer := do(t, "POST", r.URL+"/generate", `{"text":"`+long+`","sampling_params":{"max_new_tokens":1}}`)
		if _, cached := wire.PeekNativeBody([]byte(answer)); cached != 0 {
			t.Errorf("%s still had %d tokens cached after the flush", r.URL, cached)
		}
	}
	if code, _ := do(t, "GET", url+"/flush_cache", ""); code != 200 {
		t.Errorf("GET /flush_cache: %d", code)
	}
}

// SGLang's /abort_request reaches every replica, its body with it (the
// router does not know which holds the rid); a replica's refusal is
// relayed, one that cannot be reached is a 502 naming it, and
// engine_operations: refuse keeps them from the replicas.
func TestAbortRequestReachesEveryReplica(t *testing.T) {
	var mu sync.Mutex
	got := map[string]string{}
	record := func(name string, status int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				return // the router's scrape
			}
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			got[name] = r.Method + " " + r.URL.Path + " " + string(body)
			mu.Unlock()
			w.WriteHeader(status)
		}
	}
	a, b := fakeUpstream(t, record("a", 200)), fakeUpstream(t, record("b", 200))
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, a, b)
	if code, body := do(t, "POST", url+"/abort_request", `{"rid":"r1"}`); code != 200 {
		t.Fatalf("abort: %d %s", code, body)
	}
	mu.Lock()
	for _, name := range []string{"a", "b"} {
		if got[name] != `POST /abort_request {"rid":"r1"}` {
			t.Errorf("%s got %q", name, got[name])
		}
	}
	mu.Unlock()

	refusing := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n")
	})
	gone := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	})
	_, url2 := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, a, refusing)
	req, _ := http.NewRequest("POST", url2+"/flush_cache", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get(ReplicaHeader) != "b" {
		t.Errorf("a replica refused the flush: %d from %q, want its 400", resp.StatusCode, resp.Header.Get(ReplicaHeader))
	}
	_, url3 := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, a, gone)
	if code, body := do(t, "POST", url3+"/abort_request", `{"abort_all":true}`); code != http.StatusBadGateway || !strings.Contains(body, "b: ") {
		t.Errorf("a replica not reached: %d %s, want a 502 naming b", code, body)
	}

	mu.Lock()
	clear(got)
	mu.Unlock()
	_, url4 := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{EngineOperations: "refuse"}}, a, b)
	if code, body := do(t, "POST", url4+"/abort_request", `{"abort_all":true}`); code != http.StatusForbidden || !strings.Contains(body, "engine_operations") {
		t.Errorf("refused: %d %s", code, body)
	}
	mu.Lock()
	if len(got) != 0 {
		t.Errorf("refused, yet sent: %v", got)
	}
	mu.Unlock()
}

// An adapter loaded through the router is loaded on every replica and
// served at once: the router reads their models again before it answers
// (2026-12-05: loaded on the one replica the load was routed to, and
// unknown to the router until its next probe: a 404 for the requests
// naming it). Unloaded, it is gone from the router's catalog at once.
func TestAdapterLoadedThroughTheRouter(t *testing.T) {
	a := servetest.StartReplicaWith(t, 2*time.Millisecond, emulator.Config{Model: "base", MetricsFormat: "vllm", Speedup: 200})
	b := servetest.StartReplicaWith(t, 2*time.Millisecond, emulator.Config{Model: "base", MetricsFormat: "vllm", Speedup: 200})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Policy: "round-robin"}}, a, b)
	if code, body := do(t, "POST", url+"/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"/adapters/sql"}`); code != 200 {
		t.Fatalf("load: %d %s", code, body)
	}
	for _, r := range []*replica{a, b} {
		if _, list := do(t, "GET", r.URL+"/v1/models", ""); !strings.Contains(list, `"id":"sql"`) {
			t.Errorf("%s does not serve sql after the load: %s", r.URL, list)
		}
	}
	for i := range 4 {
		if code, body := do(t, "POST", url+"/v1/chat/completions", modelChat("sql", fmt.Sprint("q", i), false)); code != 200 {
			t.Errorf("a request for sql right after its load: %d %s", code, body)
		}
	}
	if code, body := do(t, "POST", url+"/v1/unload_lora_adapter", `{"lora_name":"sql"}`); code != 200 {
		t.Fatalf("unload: %d %s", code, body)
	}
	if code, body := do(t, "POST", url+"/v1/chat/completions", modelChat("sql", "after", false)); code != http.StatusNotFound || !strings.Contains(body, "model_not_found") {
		t.Errorf("sql after its unload: %d %s, want the router's 404", code, body)
	}
}
