package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/mesh"
	"github.com/gorgo-llm/gorgo/internal/netem"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// replica is an emulated engine behind a network delay.
type replica struct {
	srv   *emulator.Server
	url   string
	link  *netem.Link
	count atomic.Int64 // completions requests received
}

func startReplica(t testing.TB, rtt time.Duration, faults emulator.Faults) *replica {
	t.Helper()
	p, err := engine.LookupProfile("paper")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := emulator.New(emulator.Config{Profile: p, Speedup: 20, Faults: faults})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	link := netem.NewLink(rtt, 0, 1)
	rep := &replica{srv: srv, url: "http://" + ln.Addr().String(), link: link}
	h := srv.Handler()
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			rep.count.Add(1)
		}
		h.ServeHTTP(w, r)
	})}
	ctx, cancel := context.WithCancel(context.Background())
	go srv.Run(ctx)
	go hs.Serve(link.Listener(ln))
	t.Cleanup(func() {
		cancel()
		hs.Close()
	})
	return rep
}

// startProxy runs a proxy in front of the replicas and returns its URL.
func startProxy(t testing.TB, cfg Config, reps ...*replica) (*Server, string) {
	t.Helper()
	for i, r := range reps {
		cfg.Replicas = append(cfg.Replicas, ReplicaConfig{ID: string(rune('a' + i)), URL: r.url, Region: "r" + string(rune('a'+i)), Profile: "paper"})
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = 100 * time.Millisecond
	}
	if cfg.ScrapeInterval == 0 {
		cfg.ScrapeInterval = 100 * time.Millisecond
	}
	s, err := New(cfg, nil, prometheus.NewRegistry(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.ProbeOnce(ctx)
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

// adminURL serves the proxy's admin API and returns its URL.
func adminURL(t testing.TB, s *Server) string {
	t.Helper()
	ts := httptest.NewServer(s.AdminHandler())
	t.Cleanup(ts.Close)
	return ts.URL
}

func chatBody(content string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": "gorgo-emulated", "stream": stream, "max_tokens": maxTokens,
		"stream_options": map[string]any{"include_usage": true},
		"messages":       []map[string]string{{"role": "user", "content": content}}})
	return string(b)
}

type result struct {
	status  int
	replica string
	content []string
	cached  int
	done    bool
	err     string
}

// chat sends a streaming chat completion through the proxy.
func chat(t *testing.T, url, content string, maxTokens int, header ...string) result {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody(content, maxTokens, true)))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	res := result{status: resp.StatusCode, replica: resp.Header.Get(ReplicaHeader), cached: -1}
	if resp.StatusCode != 200 {
		var e struct{ Error struct{ Message string } }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		res.err = e.Error.Message
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			res.done = true
			continue
		}
		var c struct {
			Choices []struct{ Delta struct{ Content string } }
			Usage   *struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
			res.content = append(res.content, c.Choices[0].Delta.Content)
		}
		if c.Usage != nil {
			res.cached = c.Usage.Details.Cached
		}
	}
	return res
}

func TestStreamsThroughTheNearestReplica(t *testing.T) {
	near, far := startReplica(t, 10*time.Millisecond, emulator.Faults{}), startReplica(t, 150*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, Config{}, far, near) // a = far, b = near
	res := chat(t, url, "hello there, how are you?", 5)
	if res.status != 200 || !res.done || len(res.content) != 5 {
		t.Fatalf("result %+v", res)
	}
	if res.replica != "b" {
		t.Errorf("served by %s, want b (the near replica)", res.replica)
	}
}

func TestRepeatedPromptFindsItsCache(t *testing.T) {
	a, b := startReplica(t, 20*time.Millisecond, emulator.Faults{}), startReplica(t, 25*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, Config{}, a, b)
	text := strings.Repeat("a long conversation about the weather and ships. ", 200)
	first := chat(t, url, text, 2, SessionHeader, "s1")
	second := chat(t, url, text+" And then?", 2, SessionHeader, "s1")
	if first.status != 200 || second.status != 200 {
		t.Fatalf("statuses %d %d", first.status, second.status)
	}
	if second.replica != first.replica || second.cached < 2000 {
		t.Errorf("second turn on %s with %d cached tokens; first turn was on %s", second.replica, second.cached, first.replica)
	}
}

func TestFailingReplicaIsSkippedAndMarkedDown(t *testing.T) {
	broken := startReplica(t, 5*time.Millisecond, emulator.Faults{FailFraction: 1})
	good := startReplica(t, 80*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, Config{FailureThreshold: 2, ProbeInterval: time.Hour}, broken, good)
	for i := range 4 {
		res := chat(t, url, "question number "+string(rune('0'+i)), 3)
		if res.status != 200 || res.replica != "b" || !res.done {
			t.Fatalf("request %d: %+v", i, res)
		}
	}
	if st := s.Router().Replicas(); st[0].Healthy {
		t.Error("the failing replica is still healthy after repeated failures")
	}
}

func TestDeadReplicaIsRoutedAround(t *testing.T) {
	good := startReplica(t, 50*time.Millisecond, emulator.Faults{})
	dead := &replica{url: "http://127.0.0.1:1"} // nothing listens there
	s, url := startProxy(t, Config{FailureThreshold: 1}, dead, good)
	res := chat(t, url, "are you there?", 2)
	if res.status != 200 || res.replica != "b" {
		t.Fatalf("result %+v", res)
	}
	if st := s.Router().Replicas(); st[0].Healthy || !st[1].Healthy {
		t.Errorf("health %v %v, want the dead replica down", st[0].Healthy, st[1].Healthy)
	}
}

func TestNoReplicaLeftGivesAnOpenAIError(t *testing.T) {
	broken := startReplica(t, 5*time.Millisecond, emulator.Faults{FailFraction: 1})
	_, url := startProxy(t, Config{ProbeInterval: time.Hour}, broken)
	res := chat(t, url, "anyone?", 2)
	if res.status != 500 || !strings.Contains(res.err, "injected fault") {
		t.Errorf("result %+v", res)
	}
}

func TestBadRequests(t *testing.T) {
	_, url := startProxy(t, Config{}, startReplica(t, 5*time.Millisecond, emulator.Faults{}))
	for _, body := range []string{`{"messages": [`, `{"messages": []}`, `{"messages": [{"role": "user", "content": 7}]}`} {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error struct{ Code int } }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 400 || e.Error.Code != 400 {
			t.Errorf("%s: status %d, error %+v", body, resp.StatusCode, e)
		}
	}
}

func TestClientGoneCancelsUpstream(t *testing.T) {
	r := startReplica(t, 5*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, Config{}, r)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody("tell me a very long story", 100000, true)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := s.Router().Replicas()
		if st[0].InFlight == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy still counts the request in flight: %+v", st[0])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAdminAndMetrics(t *testing.T) {
	s, url := startProxy(t, Config{}, startReplica(t, 5*time.Millisecond, emulator.Faults{}), startReplica(t, 40*time.Millisecond, emulator.Faults{}))
	admin := adminURL(t, s)
	chat(t, url, "warm up", 1)
	get := func(path string) string {
		base := url
		if strings.HasPrefix(path, "/admin") {
			base = admin
		}
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	if body := get("/admin/replicas"); !strings.Contains(body, `"state": "active"`) || !strings.Contains(body, `"policy": "gorgo-e2e"`) {
		t.Errorf("/admin/replicas: %s", body)
	}
	if body := get("/metrics"); !strings.Contains(body, `gorgo_requests_total{code="200",replica="a"} 1`) {
		t.Errorf("/metrics lacks the request: %s", body)
	}
	if body := get("/v1/models"); !strings.Contains(body, "gorgo-emulated") {
		t.Errorf("/v1/models: %s", body)
	}
	// The client port serves no admin API.
	if resp, err := http.Get(url + "/admin/replicas"); err != nil || resp.StatusCode != 404 {
		t.Errorf("client port /admin/replicas: %v %v", resp.StatusCode, err)
	}
	resp, err := http.Post(admin+"/admin/decide", "application/json", strings.NewReader(chatBody("where would this go?", 1, false)))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Replica  string
		Scores   map[string]struct{ Total, Decode float64 }
		Expected int     `json:"expected_output_tokens"`
		Pred     float64 `json:"predicted_ttft_ms"`
		Idle     float64 `json:"predicted_ttft_idle_ms"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&d)
	resp.Body.Close()
	// max_tokens 1 caps the expected output; the default policy prices a
	// decode on every replica; the prediction is at least the idle one.
	if d.Replica != "a" || len(d.Scores) != 2 || d.Scores["a"].Decode <= 0 || d.Expected != 1 || d.Idle <= 0 || d.Pred < d.Idle {
		t.Errorf("decide: %+v", d)
	}
}

func TestExampleConfigsLoad(t *testing.T) {
	cfg, err := LoadConfig("../../examples/serve.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Replicas) != 3 || cfg.Params["gorgo"]["queue"] != 0.5 || cfg.Params["gorgo-e2e"]["decode"] != 0.2 || cfg.ProbeInterval != 5*time.Second || cfg.Admin.Listen != "127.0.0.1:9091" {
		t.Errorf("config %+v", cfg)
	}
	if cfg, err = LoadConfig("../../examples/serve-k8s.yaml"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GORGO_ADMIN_TOKEN", "a-token-long-enough")
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.Admin.tokens(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Discover) != 2 || cfg.Discover[0].Port != 8000 || cfg.Discover[1].SRV == "" || cfg.Discover[1].Interval != 10*time.Second {
		t.Errorf("discover %+v", cfg.Discover)
	}
	if cfg, err = LoadConfig("../../examples/serve-mesh.yaml"); err != nil {
		t.Fatal(err)
	}
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Region != "us-ashburn" || cfg.Mesh == nil || cfg.Mesh.Embed != "127.0.0.1:4222" || cfg.Policy != "gorgo-e2e" {
		t.Errorf("mesh config %+v %+v", cfg, cfg.Mesh)
	}
	bad := cfg
	bad.Region, bad.Mesh = "", &mesh.Config{URL: "nats://x:4222"}
	if err := bad.Validate(); err == nil {
		t.Error("a mesh router with no name nor region accepted")
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []Config{
		{Admin: AdminConfig{Listen: AdminOff}},
		{Replicas: []ReplicaConfig{{URL: "http://x"}}, Policy: "clairvoyant"},
		{Replicas: []ReplicaConfig{{URL: "http://x"}}, Policy: "fastest"},
		{Replicas: []ReplicaConfig{{URL: "http://x"}}, Admin: AdminConfig{Listen: "0.0.0.0:9091"}},
		{Replicas: []ReplicaConfig{{URL: "http://x"}}, Admin: AdminConfig{Listen: ":9091"}},
		{Replicas: []ReplicaConfig{{URL: "ftp://x"}}},
		{Replicas: []ReplicaConfig{{ID: "a", URL: "http://x"}, {ID: "a", URL: "http://y"}}},
		{Replicas: []ReplicaConfig{{URL: "http://x", Profile: "tpu"}}},
		{Replicas: []ReplicaConfig{{URL: "http://x"}}, RTTAlpha: 3},
		{Replicas: []ReplicaConfig{{URL: "http://x"}}, MaxAttempts: -1},
	}
	for i, c := range cases {
		if err := c.Defaults().Validate(); err == nil {
			t.Errorf("case %d accepted", i)
		}
	}
}

// The proxy hands each request's outcome back to a policy that learns: an
// online tuner judges candidates on live traffic.
func TestOnlineTunerLearnsThroughTheProxy(t *testing.T) {
	o, err := tune.NewOnline(tune.OnlineConfig{ES: tune.Config{Seed: 1}, Window: 4, Hop: 2})
	if err != nil {
		t.Fatal(err)
	}
	reps := []*replica{startReplica(t, 5*time.Millisecond, emulator.Faults{}), startReplica(t, 30*time.Millisecond, emulator.Faults{})}
	var cfg Config
	for i, r := range reps {
		cfg.Replicas = append(cfg.Replicas, ReplicaConfig{ID: string(rune('a' + i)), URL: r.url, Profile: "paper"})
	}
	s, err := New(cfg, o, prometheus.NewRegistry(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	s.ProbeOnce(context.Background())
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	for i := range 24 {
		if res := chat(t, ts.URL, fmt.Sprintf("question %d", i), 2); res.status != 200 {
			t.Fatalf("request %d: %+v", i, res)
		}
	}
	if steps := o.Steps(); len(steps) < 2 {
		t.Errorf("%d candidates judged after 24 requests with windows of 4", len(steps))
	}
	resp, err := http.Get(adminURL(t, s) + "/admin/tuner")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/admin/tuner: %v %v", resp, err)
	}
	resp.Body.Close()
}

// A replica that hangs (sends no response headers) is given up on after
// the header timeout, and the request is served elsewhere.
func TestHungReplicaIsGivenUpOn(t *testing.T) {
	hung := startReplica(t, 2*time.Millisecond, emulator.Faults{HangAfter: 1})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, Config{HeaderTimeout: 300 * time.Millisecond, ProbeInterval: time.Hour}, hung, good)
	if res := chat(t, url, "first, while it still answers", 1); res.status != 200 || res.replica != "a" {
		t.Fatalf("first request: %+v", res)
	}
	start := time.Now()
	res := chat(t, url, "second, after it hung", 1)
	if res.status != 200 || res.replica != "b" {
		t.Fatalf("second request: %+v", res)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v to fail over", took)
	}
}

// Once bytes reached the client, a replica dying mid-stream cuts the
// client's stream: it must not look like a complete answer.
func TestMidStreamFailureCutsTheStream(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":" half"}}]}`+"\n\n")
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close() // the replica dies
	}))
	defer upstream.Close()
	s, url := startProxy(t, Config{ProbeInterval: time.Hour}, &replica{url: upstream.URL})
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hi", 5, true)))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || strings.Contains(string(body), "[DONE]") {
		t.Errorf("client read %q with error %v; want a cut stream", body, err)
	}
	if !strings.Contains(string(body), " half") {
		t.Errorf("the bytes before the failure did not reach the client: %q", body)
	}
	if st := s.Router().Replicas(); st[0].InFlight != 0 {
		t.Errorf("the request is still in flight: %+v", st[0])
	}
}

func TestAccessLog(t *testing.T) {
	s, url := startProxy(t, Config{}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	var buf syncBuffer
	s.SetAccessLog(slog.New(slog.NewTextHandler(&buf, nil)))
	chat(t, url, "log me", 3)
	line := buf.String()
	for _, want := range []string{"msg=request", "replica=a", "status=200", "output_tokens=3", "ttft_ms="} {
		if !strings.Contains(line, want) {
			t.Errorf("access log %q lacks %q", line, want)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fakeUpstream answers /health and hands completions to h.
func fakeUpstream(t *testing.T, h http.HandlerFunc) *replica {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return &replica{url: srv.URL}
}

// A replica that starts a stream and dies before its first event has sent
// the client nothing: the request is tried on another replica.
func TestStreamBrokenBeforeFirstEventIsRetried(t *testing.T) {
	dying := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	})
	good := startReplica(t, 50*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, Config{ProbeInterval: time.Hour}, dying, good)
	res := chat(t, url, "please answer", 3)
	if res.status != 200 || res.replica != "b" || !res.done || len(res.content) != 3 {
		t.Errorf("result %+v", res)
	}
}

// A busy replica's 503 is retried elsewhere and does not plant the prompt in
// its prefix index.
func TestBusyReplicaIsSkippedAndNotIndexed(t *testing.T) {
	busy := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"overloaded","code":503}}`)
	})
	good := startReplica(t, 50*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, Config{ProbeInterval: time.Hour, FailureThreshold: 1}, busy, good)
	res := chat(t, url, strings.Repeat("a prompt worth caching. ", 100), 2)
	if res.status != 200 || res.replica != "b" {
		t.Fatalf("result %+v", res)
	}
	st := s.Router().Replicas()
	if st[0].IndexBlocks != 0 || st[1].IndexBlocks == 0 {
		t.Errorf("index blocks %d (busy) and %d (served)", st[0].IndexBlocks, st[1].IndexBlocks)
	}
	if !st[0].Healthy {
		t.Error("a 503 counted against the replica: busy is not broken")
	}
	// With nothing else left, the client gets the replica's 503 and its Retry-After.
	_, url = startProxy(t, Config{ProbeInterval: time.Hour}, busy)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("x", 1, true)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("status %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// A non-streaming answer's headers come with its last token: the header
// timeout, meant for hung streams, must not cut it.
func TestLongNonStreamingAnswerOutlivesTheHeaderTimeout(t *testing.T) {
	_, url := startProxy(t, Config{HeaderTimeout: 100 * time.Millisecond}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	start := time.Now()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("write a lot", 600, false)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"completion_tokens":600`) {
		t.Fatalf("status %d: %.200s", resp.StatusCode, body)
	}
	if time.Since(start) < 100*time.Millisecond {
		t.Skip("the answer came faster than the header timeout; nothing was tested")
	}
}

// Explaining a decision moves nothing: round-robin keeps alternating.
func TestDecideIsADryRun(t *testing.T) {
	s, url := startProxy(t, Config{Policy: "round-robin"}, startReplica(t, 2*time.Millisecond, emulator.Faults{}), startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	admin := adminURL(t, s)
	var got []string
	for i := range 4 {
		resp, err := http.Post(admin+"/admin/decide", "application/json", strings.NewReader(chatBody("where?", 1, false)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got = append(got, chat(t, url, fmt.Sprintf("q%d", i), 1).replica)
	}
	if strings.Join(got, "") != "abab" {
		t.Errorf("round-robin with explanations in between went %v, want a b a b", got)
	}
}

func TestTokenIDPrompts(t *testing.T) {
	_, url := startProxy(t, Config{}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1,2,3,4,5],"max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("status %d: %s", resp.StatusCode, body)
	}
}

// The proxy asks a stream for its usage even when the client did not, to
// learn the cached tokens, and keeps that usage chunk from the client.
func TestUsageIsAskedForAndHidden(t *testing.T) {
	s, url := startProxy(t, Config{}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	var buf syncBuffer
	s.SetAccessLog(slog.New(slog.NewTextHandler(&buf, nil)))
	body := `{"messages":[{"role":"user","content":"hello"}],"max_tokens":2,"stream":true,"temperature":0.5}`
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(data), `"usage"`) || !strings.Contains(string(data), "[DONE]") {
		t.Errorf("client stream: %s", data)
	}
	if !strings.Contains(buf.String(), "cached_tokens=0") {
		t.Errorf("the proxy did not learn the cached tokens: %s", buf.String())
	}
	// A client that asked keeps its usage.
	resp, err = http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hello", 2, true)))
	if err != nil {
		t.Fatal(err)
	}
	data, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(data), `"usage"`) {
		t.Errorf("usage asked for but missing: %s", data)
	}
}

// The router sizes a replica's share of the prefix index from the KV
// capacity its engine reports, not only from the configured profile.
func TestScrapedKVCapacitySizesTheIndex(t *testing.T) {
	p, _ := engine.LookupProfile("paper")
	p.KVCapacityTokens = 123456
	srv, err := emulator.New(emulator.Config{Profile: p, Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Run(ctx)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	s, _ := startProxy(t, Config{ScrapeInterval: 20 * time.Millisecond}, &replica{url: hs.URL})
	deadline := time.Now().Add(5 * time.Second)
	for s.Router().Replicas()[0].KVCapacityTokens != 123456/16*16 {
		if time.Now().After(deadline) {
			t.Fatalf("capacity %d, want the engine's", s.Router().Replicas()[0].KVCapacityTokens)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Any config file is either refused with an error or defaulted into one
// that validates (or is refused by Validate): never a panic.
func FuzzConfig(f *testing.F) {
	for _, seed := range []string{
		"", "listen: 127.0.0.1:8080\nreplicas:\n  - {id: a, url: \"http://x:1\", profile: paper}\n",
		"admin: {listen: \"0.0.0.0:9\", token_env: X}\ndiscover:\n  - {dns: a.b, port: 80, interval: 1s}\n",
		"replicas: [{url: \"ftp://x\"}]\n", "weights: {rtt: -1}\n", "max_body_bytes: -5\nejection_time: 1h\n",
		"discover: [{srv: \"_http._tcp.x\", port: 1}]\n", "policy: clairvoyant\n", "bogus: 1\n", "[1, 2]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data, "fuzz")
		if err != nil {
			return
		}
		d := c.Defaults()
		_ = d.Validate()
	})
}

// The streams the proxy relays teach the router each replica's ITL and the
// fleet's output length, and release the decoding ledger.
func TestStreamsTeachTheDecodeModel(t *testing.T) {
	s, url := startProxy(t, Config{}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	for i := range 4 {
		if res := chat(t, url, fmt.Sprintf("tell me a story, number %d", i), 24); res.status != 200 || !res.done {
			t.Fatalf("result %+v", res)
		}
	}
	// The request ends just after the client reads [DONE]: wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := s.Router().Replica("a")
		if err != nil {
			t.Fatal(err)
		}
		if st.ITLSamples == 4 && st.Decoding == 0 && st.InFlight == 0 {
			if st.ITLBaseMS <= 0 {
				t.Errorf("learned ITL base %v", st.ITLBaseMS)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 4 streams: %d ITL samples, %d decoding, %d in flight", st.ITLSamples, st.Decoding, st.InFlight)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e := s.Router().ExpectedOutput(0); e >= router.DefaultOutputTokens || e < 24 {
		t.Errorf("expected output %d after answers of 24 tokens", e)
	}
}

// A request that cannot make the TTFT SLO gets an OpenAI-style 429 with
// Retry-After; one that can is served.
func TestTTFTSLORefusesWhatCannotMakeIt(t *testing.T) {
	_, url := startProxy(t, Config{TTFTSLO: 3 * time.Millisecond, Admission: "reject"}, startReplica(t, 20*time.Millisecond, emulator.Faults{}))
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hello", 4, true)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), `"type":"RateLimitError"`) || !strings.Contains(string(body), "TTFT SLO") {
		t.Fatalf("a 20 ms replica under a 3 ms SLO: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	_, url = startProxy(t, Config{TTFTSLO: 10 * time.Second}, startReplica(t, 20*time.Millisecond, emulator.Faults{}))
	if res := chat(t, url, "hello", 4); res.status != 200 || !res.done {
		t.Fatalf("within the SLO: %+v", res)
	}
	ok := Config{TTFTSLO: time.Second, Admission: "Reject", Replicas: []ReplicaConfig{{URL: "http://x"}}}
	ok = ok.Defaults()
	if a, err := ok.admission(); err != nil || a.Mode != "reject" {
		t.Errorf("admission: Reject: %+v %v", a, err)
	}
	for _, bad := range []Config{{TTFTSLO: time.Second, Admission: "later"}, {Admission: "queue"}, {TTFTSLO: -time.Second}} {
		bad.Replicas = []ReplicaConfig{{URL: "http://x"}}
		if err := bad.Defaults().Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
