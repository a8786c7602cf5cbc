package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/enginemetrics"
	"github.com/gorgo-llm/gorgo/internal/models"
)

// complete sends a non-streaming chat for model and returns the status,
// the answer's model and its cached tokens (or the raw body if not 200).
func complete(t *testing.T, url, mdl, text string) (int, string, int, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": mdl, "max_tokens": 2, "messages": []any{map[string]any{"role": "user", "content": text}}})
	if mdl == "" {
		body, _ = json.Marshal(map[string]any{"max_tokens": 2, "messages": []any{map[string]any{"role": "user", "content": text}}})
	}
	resp := post(t, url+"/v1/chat/completions", string(body))
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, "", 0, string(raw)
	}
	var out struct {
		Model string `json:"model"`
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("answer %s: %v", raw, err)
	}
	return resp.StatusCode, out.Model, out.Usage.PromptTokensDetails.CachedTokens, string(raw)
}

// The base model answers to every served name and to none; an adapter to
// its name and to SGLang's BASE:ADAPTER; anything else is vLLM's 404. The
// answer names the model asked for.
func TestServedNamesAndAdapters(t *testing.T) {
	s, url := start(t, Config{Speedup: 50, ServedNames: []string{"llama", "llama-chat"}, LoRAModules: []string{"sql", "code=/data/code"}})
	if s.cfg.Model != "llama" {
		t.Errorf("primary name %q, want the first served name", s.cfg.Model)
	}
	for _, c := range []struct{ ask, answer string }{
		{"", "llama"}, {"llama", "llama"}, {"llama-chat", "llama-chat"}, {"sql", "sql"},
		{"llama:code", "llama:code"}, {"llama-chat:sql", "llama-chat:sql"},
	} {
		status, got, _, raw := complete(t, url, c.ask, "hello")
		if status != 200 || got != c.answer {
			t.Errorf("model %q: status %d, answer's model %q (%s); want 200, %q", c.ask, status, got, raw, c.answer)
		}
	}
	for _, bad := range []string{"gpt-9", "llama:nope", "nope:sql", "sql:code", "LLAMA"} {
		status, _, _, raw := complete(t, url, bad, "hello")
		want := `{"error":{"message":"The model ` + "`" + bad + "`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}}` + "\n"
		if status != 404 || raw != want {
			t.Errorf("model %q: status %d, body %s; want 404 %s", bad, status, raw, want)
		}
	}
	if g, _ := s.drv.gauges(); g.AdapterRequests != 3 || g.Admitted != 6 {
		t.Errorf("adapter requests %d of %d admitted, want 3 of 6", g.AdapterRequests, g.Admitted)
	}
}

// Model defaults and names that cannot be served.
func TestServedNamesConfig(t *testing.T) {
	p, _ := engine.LookupProfile("paper")
	s, err := New(Config{Profile: p, Model: "main", ServedNames: []string{"alias", "main"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.models.Load().served; !slices.Equal(got, []string{"main", "alias"}) {
		t.Errorf("served %v, want the primary name first", got)
	}
	s, err = New(Config{Profile: p, Model: "main", ServedNames: []string{"alias"}})
	if err != nil || !slices.Equal(s.models.Load().served, []string{"main", "alias"}) {
		t.Errorf("a Model not among ServedNames: %v, %v; want it served first", err, s.models.Load().served)
	}
	many := make([]string, maxModelNames)
	for i := range many {
		many[i] = fmt.Sprint("a", i)
	}
	for name, cfg := range map[string]Config{
		"empty served name":    {ServedNames: []string{"a", ""}},
		"served twice":         {ServedNames: []string{"a", "b", "b"}},
		"primary served twice": {ServedNames: []string{"a", "a"}},
		"adapter is served":    {ServedNames: []string{"a"}, LoRAModules: []string{"a"}},
		"adapter twice":        {LoRAModules: []string{"x", "x=/p"}},
		"adapter with a comma": {LoRAModules: []string{"x,y"}},
		"adapter without path": {LoRAModules: []string{"x="}},
		"too many names":       {LoRAModules: many},
		"negative max LoRAs":   {MaxLoRAs: -1},
		"negative load time":   {LoRALoadTime: -time.Second},
	} {
		cfg.Profile = p
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// An adapter's prefix cache is its own: a prompt cached for the base is
// no hit for an adapter, and the other way round.
func TestAdapterPrefixCacheIsItsOwn(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, LoRAModules: []string{"sql", "code"}})
	text := strings.Repeat("a long shared system prompt about databases. ", 80) // about 920 tokens
	var cached []int
	for _, m := range []string{"", "", "sql", "sql", "code", "gorgo-emulated:code"} {
		status, _, c, raw := complete(t, url, m, text)
		if status != 200 {
			t.Fatalf("model %q: %d %s", m, status, raw)
		}
		cached = append(cached, c)
	}
	for i, c := range cached {
		if hit := i%2 == 1; (c > 800) != hit || (!hit && c != 0) {
			t.Errorf("cached tokens %v: want 0 then most of the prompt, per model", cached)
			break
		}
	}
}

type listedModel struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

func listModels(t *testing.T, url string) ([]listedModel, []byte) {
	t.Helper()
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var list struct {
		Object string        `json:"object"`
		Data   []listedModel `json:"data"`
	}
	if err := json.Unmarshal(raw, &list); err != nil || resp.StatusCode != 200 || list.Object != "list" {
		t.Fatalf("/v1/models: %d %s (%v)", resp.StatusCode, raw, err)
	}
	return list.Data, raw
}

// GET /v1/models lists every served name, then every adapter, in vLLM's
// shape, which the router's reader takes.
func TestModelsList(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, MetricsFormat: "vllm", ServedNames: []string{"llama", "chat"}, LoRAModules: []string{"sql", "code=/data/code"}})
	got, raw := listModels(t, url)
	primary := "llama"
	want := []listedModel{
		{ID: "llama", Root: "llama"}, {ID: "chat", Root: "llama"},
		{ID: "sql", Root: "/adapters/sql", Parent: &primary}, {ID: "code", Root: "/data/code", Parent: &primary},
	}
	if len(got) != len(want) {
		t.Fatalf("listed %s", raw)
	}
	for i, w := range want {
		g := got[i]
		if g.ID != w.ID || g.Root != w.Root || g.Object != "model" || g.OwnedBy != "vllm" || g.Created <= 0 ||
			g.MaxModelLen == nil || *g.MaxModelLen <= 0 || (g.Parent == nil) != (w.Parent == nil) || g.Parent != nil && *g.Parent != primary {
			t.Errorf("entry %d: %+v, want %+v", i, g, w)
		}
	}
	if !strings.Contains(string(raw), `"parent":null`) {
		t.Errorf("a base model's parent is not null: %s", raw)
	}
	set, err := models.ParseList(raw)
	if err != nil {
		t.Fatal(err)
	}
	if b, a := set.Bases(), set.Adapters(); !slices.Equal(b, []string{"chat", "llama"}) || !slices.Equal(a, []string{"code", "sql"}) {
		t.Errorf("the router reads bases %v, adapters %v", b, a)
	}
	if m, ok := set.Lookup("llama:sql"); !ok || m.ID != "sql" {
		t.Errorf("the router's lookup of llama:sql: %+v %v", m, ok)
	}
}

// postText posts a body and returns the status and the body.
func postText(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp := post(t, url, body)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// vLLM's dynamic adapters: loaded and unloaded at runtime, the list and
// the routing changing at once.
func TestLoadUnloadAdapter(t *testing.T) {
	s, url := start(t, Config{Speedup: 50})
	if s.lora.Load() {
		t.Error("LoRA on without adapters or slots")
	}
	load, unload := url+"/v1/load_lora_adapter", url+"/v1/unload_lora_adapter"
	if status, _, _, _ := complete(t, url, "fin", "hi"); status != 404 {
		t.Fatalf("before the load: %d", status)
	}
	if status, body := postText(t, load, `{"lora_name":"fin","lora_path":"/loras/fin"}`); status != 200 || body != "Success: LoRA adapter 'fin' added successfully." {
		t.Fatalf("load: %d %q", status, body)
	}
	if !s.lora.Load() {
		t.Error("LoRA still off after a load")
	}
	if status, body := postText(t, load, `{"lora_name":"fin","lora_path":"/loras/fin"}`); status != 400 || !strings.Contains(body, "The lora adapter 'fin' has already been loaded.") {
		t.Errorf("second load: %d %s", status, body)
	}
	list, raw := listModels(t, url)
	if len(list) != 2 || list[1].ID != "fin" || list[1].Root != "/loras/fin" || list[1].Parent == nil || *list[1].Parent != "gorgo-emulated" {
		t.Errorf("list after the load: %s", raw)
	}
	if status, got, _, raw := complete(t, url, "fin", "hi"); status != 200 || got != "fin" {
		t.Errorf("request for the loaded adapter: %d %s", status, raw)
	}
	if status, body := postText(t, unload, `{"lora_name":"fin"}`); status != 200 || body != "Success: LoRA adapter 'fin' removed successfully." {
		t.Errorf("unload: %d %q", status, body)
	}
	if status, _, _, _ := complete(t, url, "fin", "hi"); status != 404 {
		t.Errorf("after the unload: %d, want 404", status)
	}
	if list, raw := listModels(t, url); len(list) != 1 {
		t.Errorf("list after the unload: %s", raw)
	}
	for _, c := range []struct {
		url, body string
		status    int
		want      string
	}{
		{unload, `{"lora_name":"fin"}`, 404, "The lora adapter 'fin' cannot be found."},
		{unload, `{}`, 400, "'lora_name' needs to be provided"},
		{load, `{"lora_name":"x"}`, 400, "Both 'lora_name' and 'lora_path' must be provided."},
		{load, `{"lora_name":"x,y","lora_path":"/p"}`, 400, "comma"},
		{load, `{"lora_name":"gorgo-emulated","lora_path":"/p"}`, 400, "served model"},
		{load, `{"lora_name":`, 400, "reading the request"},
		{load, `{"lora_name":"` + strings.Repeat("x", maxNameBytes+1) + `","lora_path":"/p"}`, 400, "longer than"},
	} {
		status, body := postText(t, c.url, c.body)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || status != c.status || e.Error.Code != c.status || !strings.Contains(e.Error.Message, c.want) {
			t.Errorf("%s %s: %d %s; want %d with %q", c.url[len(url):], c.body[:min(len(c.body), 40)], status, body, c.status, c.want)
		}
	}
}

// At most maxModelNames names in all: a client cannot grow the emulator.
func TestLoadAdapterBounded(t *testing.T) {
	names := make([]string, maxModelNames-2)
	for i := range names {
		names[i] = fmt.Sprint("a", i)
	}
	_, url := start(t, Config{LoRAModules: names})
	load := url + "/v1/load_lora_adapter"
	if status, body := postText(t, load, `{"lora_name":"last","lora_path":"/p"}`); status != 200 {
		t.Fatalf("load up to the bound: %d %s", status, body)
	}
	if status, body := postText(t, load, `{"lora_name":"more","lora_path":"/p"}`); status != 400 || !strings.Contains(body, "limit") {
		t.Errorf("load past the bound: %d %s", status, body)
	}
	if list, _ := listModels(t, url); len(list) != maxModelNames {
		t.Errorf("%d names listed, want %d", len(list), maxModelNames)
	}
}

// Loads, unloads, requests and listings at once (run with -race).
func TestAdaptersConcurrently(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, LoRAModules: []string{"base-lora"}})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprint("w", w)
			for range 5 {
				if status, body := postText(t, url+"/v1/load_lora_adapter", `{"lora_name":"`+name+`","lora_path":"/p"}`); status != 200 {
					t.Errorf("load %s: %d %s", name, status, body)
					return
				}
				if status, _, _, raw := complete(t, url, name, "hi"); status != 200 {
					t.Errorf("request for %s: %d %s", name, status, raw)
				}
				listModels(t, url)
				if status, body := postText(t, url+"/v1/unload_lora_adapter", `{"lora_name":"`+name+`"}`); status != 200 {
					t.Errorf("unload %s: %d %s", name, status, body)
					return
				}
			}
		}()
	}
	wg.Wait()
	if list, raw := listModels(t, url); len(list) != 2 {
		t.Errorf("left listed: %s", raw)
	}
}

// stalled starts a replica whose model time all but stands still: a
// request admitted stays running, one waiting stays waiting.
func stalled(t *testing.T, cfg Config) (*Server, string) {
	cfg.Faults.Slowdown = 1e9 // a 9 ms step lasts 104 days
	return start(t, cfg)
}

// hold sends a streaming request for model that stays in the engine until
// the test ends or it is cancelled, and waits until the engine holds want
// requests.
func hold(t *testing.T, s *Server, url, mdl string, want int) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+mdl+`","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("request for %s: %d", mdl, resp.StatusCode)
	}
	go func() {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}()
	waitEngine(t, s, func(g engineState) bool { return g.running+g.waiting == want })
	return cancel
}

type engineState struct{ running, waiting int }

// waitEngine waits (for an event, not a duration: the deadline only
// bounds a broken test) until the engine's state satisfies ok.
func waitEngine(t *testing.T, s *Server, ok func(engineState) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, _ := s.drv.gauges()
		if ok(engineState{g.Running, g.Waiting}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the engine never got there: %+v", g)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func scrape(t *testing.T, url string) (string, enginemetrics.Metrics) {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	em, err := enginemetrics.Parse(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	return string(raw), em
}

// loraInfo returns vllm:lora_requests_info's label sets and values.
func loraInfo(t *testing.T, text string) map[string]float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range fams["vllm:lora_requests_info"].GetMetric() {
		var labels []string
		for _, l := range m.GetLabel() {
			labels = append(labels, l.GetName()+"="+l.GetValue())
		}
		out[strings.Join(labels, " ")] = m.GetGauge().GetValue()
	}
	return out
}

// vLLM's lora_requests_info: the adapters of the running and waiting
// requests in its labels, the time in its value; the label sets of
// earlier states linger with their older times.
func TestLoRAMetricsVLLM(t *testing.T) {
	s, url := stalled(t, Config{MetricsFormat: "vllm", LoRAModules: []string{"a", "b"}, MaxLoRAs: 1})
	text, em := scrape(t, url)
	idle := "max_lora=1 running_lora_adapters= waiting_lora_adapters="
	if info := loraInfo(t, text); len(info) != 1 || info[idle] < 1e9 {
		t.Fatalf("idle: %v\n%s", info, text)
	}
	if !em.LoRAKnown || em.MaxLoRAs != 1 || em.RunningAdapters != nil || em.WaitingAdapters != nil {
		t.Errorf("idle, parsed: %+v", em)
	}
	stopA := hold(t, s, url, "a", 1)
	stopB := hold(t, s, url, "gorgo-emulated:b", 2)
	waitEngine(t, s, func(g engineState) bool { return g.running == 1 && g.waiting == 1 })
	text, em = scrape(t, url)
	busy := "max_lora=1 running_lora_adapters=a waiting_lora_adapters=b"
	info := loraInfo(t, text)
	if len(info) != 2 || !(info[busy] > info[idle]) {
		t.Fatalf("busy: %v, want the busy label set the latest, the idle one lingering", info)
	}
	if !em.LoRAKnown || em.MaxLoRAs != 1 || !slices.Equal(em.RunningAdapters, []string{"a"}) ||
		!slices.Equal(em.WaitingAdapters, []string{"b"}) || em.RunningAdapterCount != 1 {
		t.Errorf("busy, parsed: %+v", em)
	}
	// Both requests go: the idle label set is the latest again.
	stopA()
	stopB()
	waitEngine(t, s, func(g engineState) bool { return g.running == 0 && g.waiting == 0 })
	text, em = scrape(t, url)
	if info := loraInfo(t, text); len(info) != 2 || !(info[idle] > info[busy]) {
		t.Errorf("idle again: %v, want the idle label set the latest", info)
	}
	if em.RunningAdapters != nil || em.WaitingAdapters != nil || em.RunningAdapterCount != 0 {
		t.Errorf("idle again, parsed: %+v", em)
	}
}

// SGLang's lora_pool_slots_*: the distinct adapters of the running
// requests, and the slots, with SGLang's labels.
func TestLoRAMetricsSGLang(t *testing.T) {
	s, url := stalled(t, Config{LoRAModules: []string{"a", "b"}, MaxLoRAs: 3})
	hold(t, s, url, "a", 1)
	waitEngine(t, s, func(g engineState) bool { return g.running == 1 })
	text, em := scrape(t, url)
	for _, line := range []string{
		`sglang:lora_pool_slots_used{engine_type="unified",model_name="gorgo-emulated",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1`,
		`sglang:lora_pool_slots_total{engine_type="unified",model_name="gorgo-emulated",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3`,
	} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}
	if !em.LoRAKnown || em.MaxLoRAs != 3 || em.RunningAdapterCount != 1 {
		t.Errorf("parsed: %+v", em)
	}
}

// Without LoRA, no LoRA metrics; a runtime load turns them on.
func TestLoRAMetricsOff(t *testing.T) {
	for _, format := range []string{"sglang", "vllm"} {
		_, url := start(t, Config{MetricsFormat: format})
		if text, em := scrape(t, url); strings.Contains(text, "lora") || em.LoRAKnown {
			t.Errorf("%s without LoRA: %+v\n%s", format, em, text)
		}
		if status, body := postText(t, url+"/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/p"}`); status != 200 {
			t.Fatalf("load: %d %s", status, body)
		}
		if _, em := scrape(t, url); !em.LoRAKnown || em.MaxLoRAs != defaultMaxLoRAs[format] {
			t.Errorf("%s after a load: %+v", format, em)
		}
	}
}

// Adapter names and paths JSON would escape are refused, so the model list
// stays within what a router reads.
func TestAdapterNamesArePlain(t *testing.T) {
	for _, bad := range []string{"a<b", `a"b`, "a\\b", "é", "a&b"} {
		if err := checkAdapterName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
		if _, err := New(Config{LoRAModules: []string{"x=" + bad}}); err == nil {
			t.Errorf("path %q accepted", bad)
		}
	}
	if err := checkAdapterName("sql-lora_v2.1/x"); err != nil {
		t.Error(err)
	}
}

// SGLang loads and unloads adapters at its own paths, answering
// {"success", "error_message", "loaded_adapters"} with a 200 or a 400;
// vLLM has no such paths.
func TestSGLangAdapterPaths(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, MetricsFormat: "sglang"})
	type answer struct {
		Success bool              `json:"success"`
		Error   *string           `json:"error_message"`
		Loaded  map[string]string `json:"loaded_adapters"`
	}
	call := func(path, body string) (int, answer) {
		t.Helper()
		status, raw := postText(t, url+path, body)
		var a answer
		if err := json.Unmarshal([]byte(raw), &a); err != nil {
			t.Fatalf("%s: %d %q: %v", path, status, raw, err)
		}
		return status, a
	}
	if status, a := call("/load_lora_adapter", `{"lora_name":"fin","lora_path":"/loras/fin"}`); status != 200 || !a.Success || a.Error != nil || a.Loaded["fin"] != "/loras/fin" {
		t.Errorf("load: %d %+v", status, a)
	}
	if status, a := call("/load_lora_adapter", `{"lora_name":"fin","lora_path":"/loras/fin"}`); status != 400 || a.Success || a.Error == nil || !strings.Contains(*a.Error, "already") {
		t.Errorf("second load: %d %+v", status, a)
	}
	if list, raw := listModels(t, url); len(list) != 2 || list[1].ID != "fin" {
		t.Errorf("list after the load: %s", raw)
	}
	if status, a := call("/unload_lora_adapter", `{"lora_name":"fin"}`); status != 200 || !a.Success || len(a.Loaded) != 0 {
		t.Errorf("unload: %d %+v", status, a)
	}
	if status, a := call("/unload_lora_adapter", `{"lora_name":"fin"}`); status != 400 || a.Error == nil || !strings.Contains(*a.Error, "cannot be found") {
		t.Errorf("second unload: %d %+v", status, a)
	}
	_, vllm := start(t, Config{Speedup: 50, MetricsFormat: "vllm"})
	if status, _ := postText(t, vllm+"/load_lora_adapter", `{"lora_name":"fin","lora_path":"/loras/fin"}`); status != 404 {
		t.Errorf("vLLM's /load_lora_adapter: %d, want its 404", status)
	}
}
