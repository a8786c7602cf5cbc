package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// modelFleet is three emulated vLLM replicas: a serves model-a, b serves
// model-b (also as model-b-alias), c serves model-a with the adapter sql;
// the router reads what each serves from its /v1/models.
func modelFleet(t *testing.T, cfg testConfig) (*testRouter, string, []*replica) {
	t.Helper()
	a := servetest.StartReplicaWith(t, 5*time.Millisecond, emulator.Config{Model: "model-a", MetricsFormat: "vllm", Speedup: 200})
	b := servetest.StartReplicaWith(t, 5*time.Millisecond, emulator.Config{ServedNames: []string{"model-b", "model-b-alias"}, MetricsFormat: "vllm", Speedup: 200})
	c := servetest.StartReplicaWith(t, 5*time.Millisecond, emulator.Config{Model: "model-a", LoRAModules: []string{"sql"}, MaxLoRAs: 2, MetricsFormat: "vllm", Speedup: 200})
	s, url := startProxy(t, cfg, a, b, c)
	return s, url, []*replica{a, b, c}
}

func modelChat(model, content string, stream bool) string {
	m := ""
	if model != "" {
		m = fmt.Sprintf(`"model":%q,`, model)
	}
	return fmt.Sprintf(`{%s"messages":[{"role":"user","content":%q}],"max_tokens":2,"stream":%v}`, m, content, stream)
}

func served(reps []*replica) int64 {
	n := int64(0)
	for _, r := range reps {
		n += r.Served()
	}
	return n
}

// Across 1,000 requests for mixed models through the proxy, none goes to a
// replica that does not serve its model, and every one is served.
func TestRequestsGoOnlyWhereTheirModelIs(t *testing.T) {
	_, url, _ := modelFleet(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Policy: "round-robin"}})
	serves := map[string][]string{"model-a": {"a", "c"}, "model-b": {"b"}, "model-b-alias": {"b"}, "sql": {"c"}, "model-a:sql": {"c"}}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range serves {
			if !yield(k) {
				return
			}
		}
	})
	var mu sync.Mutex
	wrong, count := 0, map[string]int{}
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				model := names[i%len(names)]
				code, body, replica := post(t, url, modelChat(model, fmt.Sprint("request ", i), i%2 == 0))
				mu.Lock()
				if code != 200 || !slices.Contains(serves[model], replica) {
					wrong++
					if wrong < 5 {
						t.Errorf("%s went to %q: %d %.200s", model, replica, code, body)
					}
				}
				count[replica]++
				mu.Unlock()
			}
		})
	}
	for i := range 1000 {
		work <- i
	}
	close(work)
	wg.Wait()
	if wrong > 0 || count["a"] == 0 || count["b"] == 0 || count["c"] == 0 {
		t.Errorf("%d of 1,000 misrouted; per replica %v", wrong, count)
	}
}

// post sends a chat body, with headers given as name, value pairs, and
// returns the status, the body and the replica that served it. Its client
// gives up after 20 s (a test's failure may be a hang).
func post(t testing.TB, url, body string, header ...string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String(), resp.Header.Get(ReplicaHeader)
}

// GET /v1/models is the union over the available replicas, each name once,
// and the router's aliases; /v1/models/{id} one of them.
func TestModelListIsTheUnion(t *testing.T) {
	cfg := testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Models: map[string]models.Spec{"chat": {{Model: "model-a", Weight: 1}}}}}
	s, url, _ := modelFleet(t, cfg)
	ids := func() []string {
		code, body := do(t, "GET", url+"/v1/models", "")
		var list models.List
		if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || list.Object != "list" {
			t.Fatalf("%d %v %s", code, err, body)
		}
		var out []string
		for _, c := range list.Data {
			out = append(out, c.ID)
			if c.ID == "sql" && c.Parent != "model-a" {
				t.Errorf("sql's parent %q", c.Parent)
			}
		}
		return out
	}
	if got := strings.Join(ids(), ","); got != "model-a,model-b,model-b-alias,sql,chat" {
		t.Errorf("models %s", got)
	}
	if code, body := do(t, "GET", url+"/v1/models/sql", ""); code != 200 || !strings.Contains(body, `"id": "sql"`) {
		t.Errorf("/v1/models/sql: %d %s", code, body)
	}
	if code, body := do(t, "GET", url+"/v1/models/nope", ""); code != 404 || !strings.Contains(body, `"code":"model_not_found"`) {
		t.Errorf("/v1/models/nope: %d %s", code, body)
	}
	// A drained replica's models leave the list (b serves model-b alone).
	s.Drain("b")
	if got := strings.Join(ids(), ","); got != "model-a,sql,chat" {
		t.Errorf("with b drained: %s", got)
	}
	// Down, not gone: as a request for it is answered, a 503 to retry
	// (2026-12-07, a user's test with OpenAI's SDK: a 404, which it does
	// not retry, for a model whose replica was ejected).
	resp, err := http.Get(url + "/v1/models/model-b")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "model-b") {
		t.Errorf("/v1/models/model-b with its replica drained: %d, Retry-After %q, %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if code, _ := do(t, "GET", url+"/v1/models/nope", ""); code != 404 {
		t.Errorf("/v1/models/nope with b drained: %d", code)
	}
	// None available: a 503 with Retry-After, as every 503 the router
	// answers has (the list's had none).
	s.Drain("a")
	s.Drain("c")
	if resp, err = http.Get(url + "/v1/models"); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("/v1/models with every replica drained: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// A model no replica serves is a 404 at once, trying no replica; a known
// model with no available replica a 503 with Retry-After; a request
// without a model, where the fleet serves several, a 400 naming them.
func TestModelErrors(t *testing.T) {
	s, url, reps := modelFleet(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}})
	before := served(reps)
	code, body, replica := post(t, url, modelChat("gpt-5", "hi", false))
	if code != 404 || replica != "" || !strings.Contains(body, `"code":"model_not_found"`) || !strings.Contains(body, `"param":"model"`) || strings.Contains(body, "127.0.0.1") {
		t.Errorf("unknown model: %d %q %s", code, replica, body)
	}
	if n := served(reps) - before; n != 0 {
		t.Errorf("an unknown model reached %d replicas", n)
	}
	code, body, _ = post(t, url, modelChat("", "hi", false))
	if code != 400 || !strings.Contains(body, "model-a") || !strings.Contains(body, "model-b") {
		t.Errorf("no model: %d %s", code, body)
	}
	// SGLang's /generate names no model: it is told where to name one
	// (2026-12-07, a user's test).
	code, body = do(t, "POST", url+"/generate", `{"text":"hello","sampling_params":{"max_new_tokens":2}}`)
	if code != 400 || !strings.Contains(body, `a /generate names its own in \"model\"`) {
		t.Errorf("/generate without a model: %d %s", code, body)
	}
	s.Drain("b")
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(modelChat("model-b", "hi", false)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("model-b with b drained: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// In a fleet of one model, a request without one is served.
func TestNoModelInAFleetOfOne(t *testing.T) {
	a := servetest.StartReplicaWith(t, 5*time.Millisecond, emulator.Config{Model: "only", Speedup: 200})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, a)
	if code, body, _ := post(t, url, modelChat("", "hi", false)); code != 200 {
		t.Errorf("no model: %d %s", code, body)
	}
}

// A replica whose adapter was unloaded answers 404 for it: the request is
// served by another replica, the first is not blamed (no failure, not
// ejected) and loses the adapter; one loaded appears within a refresh.
func TestReplicasOwn404IsNoFailure(t *testing.T) {
	a := servetest.StartReplicaWith(t, 5*time.Millisecond, emulator.Config{Model: "base", LoRAModules: []string{"sql"}, MetricsFormat: "vllm", Speedup: 200})
	b := servetest.StartReplicaWith(t, 20*time.Millisecond, emulator.Config{Model: "base", LoRAModules: []string{"sql"}, MetricsFormat: "vllm", Speedup: 200})
	s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, FailureThreshold: 1, Policy: "gorgo-ms"}}, a, b)
	// a is nearer: sql goes there while it serves it.
	if code, _, replica := post(t, url, modelChat("sql", "first", false)); code != 200 || replica != "a" {
		t.Fatalf("sql: %d from %q", code, replica)
	}
	if code, body := do(t, "POST", a.URL+"/v1/unload_lora_adapter", `{"lora_name":"sql"}`); code != 200 {
		t.Fatalf("unload: %d %s", code, body)
	}
	for i := range 3 {
		if code, body, replica := post(t, url, modelChat("sql", fmt.Sprint("after ", i), i%2 == 0)); code != 200 || replica != "b" {
			t.Errorf("sql after the unload: %d from %q: %.200s", code, replica, body)
		}
	}
	st := stateOr(s, "a")
	failures, ejections, _ := s.Upstream("a").Health()
	if !st.Available() || failures != 0 || ejections != 0 {
		t.Errorf("a was blamed: %+v, %d failures, %d ejections", st, failures, ejections)
	}
	eventually(t, "a's list to be read again without sql", func() bool {
		m := stateOr(s, "a").Models
		_, ok := m.Lookup("sql")
		return m != nil && !ok && m.Len() == 1
	})
	// The base model still goes to a.
	if code, _, replica := post(t, url, modelChat("base", "base", false)); code != 200 || replica != "a" {
		t.Errorf("base: %d from %q", code, replica)
	}
	// Loaded again, it is routed there once the list is read.
	if code, body := do(t, "POST", a.URL+"/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"/adapters/sql"}`); code != 200 {
		t.Fatalf("load: %d %s", code, body)
	}
	s.ProbeOnce(t.Context())
	if _, ok := stateOr(s, "a").Models.Lookup("sql"); !ok {
		t.Errorf("a probe did not bring sql back: %s", stateOr(s, "a").Models)
	}
}

// What an engine reports of its adapters (vLLM's lora_requests_info, or
// SGLang's gauges) reaches the router with the scrape: its max_lora
// becomes the slots the router respects.
func TestScrapedAdapterSlots(t *testing.T) {
	for _, dialect := range []string{"vllm", "sglang"} {
		t.Run(dialect, func(t *testing.T) {
			a := servetest.StartReplicaWith(t, 5*time.Millisecond, emulator.Config{Model: "base", LoRAModules: []string{"x", "y", "z"}, MaxLoRAs: 3, MetricsFormat: dialect, Speedup: 200})
			s, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: 50 * time.Millisecond}}, a)
			eventually(t, "the engine's max_lora to reach the router", func() bool {
				return stateOr(s, "a").Adapters.Slots == 3
			})
			if code, _, _ := post(t, url, modelChat("y", "hello", false)); code != 200 {
				t.Fatalf("y: %d", code)
			}
			if st := stateOr(s, "a").Adapters; !slices.Contains(st.Resident, "y") {
				t.Errorf("y not resident after a request for it: %+v", st)
			}
		})
	}
}

// A POST gorgo does not otherwise read (here /v1/rerank) is routed among
// the replicas of the JSON body's model; an unknown one is a 404 at once.
func TestOpaqueBodiesRouteByModel(t *testing.T) {
	_, url, reps := modelFleet(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Policy: "round-robin"}})
	send := func(body string) (int, string, string) {
		resp, err := http.Post(url+"/v1/rerank", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String(), resp.Header.Get(ReplicaHeader)
	}
	// The emulated replicas have no /v1/rerank: their 404 says which one
	// the request reached.
	for i := range 6 {
		a, b, c := reps[0].Served(), reps[1].Served(), reps[2].Served()
		send(fmt.Sprintf(`{"model":"model-b","query":"q%d","documents":["a"]}`, i))
		if got := [3]int64{reps[0].Served() - a, reps[1].Served() - b, reps[2].Served() - c}; got != [3]int64{0, 1, 0} {
			t.Errorf("rerank for model-b reached a, b, c %v times, want b once", got)
		}
	}
	before := served(reps)
	if code, body, _ := send(`{"model":"gpt-5","query":"q"}`); code != 404 || !strings.Contains(body, "model_not_found") {
		t.Errorf("unknown model: %d %s", code, body)
	}
	if n := served(reps) - before; n != 0 {
		t.Errorf("an unknown model reached %d replicas", n)
	}
}

// Two bases, each with its own LoRA adapter named "sql": SGLang's
// BASE:ADAPTER names which one, and the request goes to a replica of that
// base (the body naming the adapter alone), not to whichever base's "sql"
// the fleet's catalog lists first, nor a 404 for the other.
func TestBaseAdapterFormRoutesToItsBase(t *testing.T) {
	a := servetest.StartReplicaWith(t, 5*time.Millisecond, emulator.Config{Model: "model-a", LoRAModules: []string{"sql"}, MaxLoRAs: 2, MetricsFormat: "vllm", Speedup: 200})
	b := servetest.StartReplicaWith(t, 5*time.Millisecond, emulator.Config{Model: "model-b", LoRAModules: []string{"sql"}, MaxLoRAs: 2, MetricsFormat: "vllm", Speedup: 200})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Policy: "round-robin"}}, a, b)
	want := map[string]string{"model-a:sql": "a", "model-b:sql": "b"}
	for i := range 10 {
		for model, rep := range want {
			code, body, got := post(t, url, modelChat(model, fmt.Sprint("q", i), false))
			if code != 200 || got != rep {
				t.Errorf("%s: %d from %q, want 200 from %q: %.150s", model, code, got, rep, body)
			}
		}
	}
}

// A replica whose config says it serves m1 but that answers 404 for it
// loses m1 until its next probe (architecture.md, "Models"): with an hour
// between probes it is sent m1 once, not again at once.
func TestConfiguredModelComesBackAtTheNextProbe(t *testing.T) {
	good := servetest.StartReplicaWith(t, 5*time.Millisecond, emulator.Config{Model: "m1", MetricsFormat: "vllm", Speedup: 200})
	var bad404 atomic.Int64
	badURL := servetest.Listen(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			bad404.Add(1)
			w.WriteHeader(404)
			fmt.Fprint(w, `{"error":{"message":"The model m1 does not exist.","code":404}}`)
		}
	}))
	cfg := fleet.Config{ProbeInterval: time.Hour, ScrapeInterval: time.Hour, Policy: "round-robin", Replicas: []fleet.ReplicaConfig{
		{ID: "good", URL: good.URL, Region: "r", Profile: "paper"},
		{ID: "bad", URL: badURL, Region: "r", Profile: "paper", Models: []string{"m1"}},
	}}
	_, url := startProxy(t, testConfig{Fleet: cfg})
	for i := range 10 {
		if code, body, rep := post(t, url, modelChat("m1", fmt.Sprint("q", i), false)); code != 200 || rep != "good" {
			t.Errorf("m1: %d from %q: %.100s", code, rep, body)
		}
		time.Sleep(20 * time.Millisecond) // time for a refresh the 404 asked for, had it been made
	}
	if n := bad404.Load(); n > 1 {
		t.Errorf("bad answered 404 for m1 %d times within one probe interval", n)
	}
}

// A fleet serving one base under two names (vLLM's --served-model-name m
// m-alias) takes a request that names no model, as vLLM itself does.
func TestOneBaseUnderTwoNamesNeedsNoModel(t *testing.T) {
	a := servetest.StartReplicaWith(t, 5*time.Millisecond, emulator.Config{ServedNames: []string{"m", "m-alias"}, MetricsFormat: "vllm", Speedup: 200})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, a)
	if code, body, _ := post(t, url, modelChat("", "hi", false)); code != 200 {
		t.Errorf("no model: %d %s", code, body)
	}
}

// BASE:ADAPTER is two names, each up to 256 bytes: a long base's adapter
// is served, not refused as an overlong name.
func TestLongBaseAdapterName(t *testing.T) {
	base := strings.Repeat("b", 248)
	a := servetest.StartReplicaWith(t, 5*time.Millisecond, emulator.Config{Model: base, LoRAModules: []string{"sql-adapter-v2"}, MaxLoRAs: 2, MetricsFormat: "vllm", Speedup: 200})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, a)
	if code, body, _ := post(t, url, modelChat(base+":sql-adapter-v2", "hi", false)); code != 200 {
		t.Errorf("a %d-byte BASE:ADAPTER: %d %.200s", len(base)+15, code, body)
	}
}

// Two names of one engine cache key a prompt's blocks alike: an adapter
// named alone or with its base (sql, model-a:sql), and a base served under
// two names (vLLM's --served-model-name m m-alias). A prompt sent under
// one name and then the other goes back to the replica that cached it.
func TestNamesOfOneCacheShareIt(t *testing.T) {
	for _, c := range []struct {
		what          string
		engine        emulator.Config
		first, second string
	}{
		{"adapter", emulator.Config{Model: "model-a", LoRAModules: []string{"sql"}, MaxLoRAs: 2}, "model-a:sql", "sql"},
		{"base", emulator.Config{ServedNames: []string{"m", "m-alias"}}, "m", "m-alias"},
	} {
		t.Run(c.what, func(t *testing.T) {
			c.engine.MetricsFormat, c.engine.Speedup = "vllm", 200
			var reps []*replica
			for range 2 {
				reps = append(reps, servetest.StartReplicaWith(t, 5*time.Millisecond, c.engine))
			}
			_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, Policy: "prefix-cache"}}, reps...)
			for i := range 10 {
				prompt := fmt.Sprintf("prompt %d %s", i, strings.Repeat("words to cache ", 200))
				code, body, first := post(t, url, modelChat(c.first, prompt, false))
				if code != 200 {
					t.Fatalf("%d %.200s", code, body)
				}
				if code, body, again := post(t, url, modelChat(c.second, prompt, false)); code != 200 || again != first {
					t.Errorf("prompt %d: %d from %q as %s after %s went to %q: %.100s", i, code, again, c.second, c.first, first, body)
				}
			}
		})
	}
}
