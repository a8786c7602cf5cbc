// Package servetest holds what the tests of gorgo's serving packages
// (proxy, fleet, admin, serve, epp) share: emulated replicas behind a
// network delay, an OpenAI client's view of a chat stream, a light
// conversation workload, and waiting for a condition with a generous
// limit. Only tests import it.
package servetest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/netem"
	"github.com/gorgo-llm/gorgo/internal/replay"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// Replica is an emulated engine (the paper's profile, 20x real time)
// behind a network delay.
type Replica struct {
	Srv   *emulator.Server
	URL   string
	Link  *netem.Link
	posts atomic.Int64 // POST requests received
	// header is the last POST request's headers.
	header atomic.Pointer[http.Header]
}

// Served returns how many POST requests (completions) reached the replica.
func (r *Replica) Served() int64 { return r.posts.Load() }

// LastHeader returns the headers of the last POST request that reached the
// replica (nil before any); do not modify them.
func (r *Replica) LastHeader() http.Header {
	if h := r.header.Load(); h != nil {
		return *h
	}
	return nil
}

// post counts a POST request and keeps its headers.
func (r *Replica) post(req *http.Request) {
	h := req.Header
	r.header.Store(&h)
	r.posts.Add(1)
}

// Port is the replica's port.
func (r *Replica) Port() int {
	_, p, _ := net.SplitHostPort(strings.TrimPrefix(r.URL, "http://"))
	var n int
	fmt.Sscan(p, &n)
	return n
}

// StartReplica runs an emulated replica rtt away, with the given faults,
// until the test ends.
func StartReplica(t testing.TB, rtt time.Duration, faults emulator.Faults) *Replica {
	t.Helper()
	return StartReplicaWith(t, rtt, emulator.Config{Faults: faults})
}

// StartReplicaWith runs an emulated replica of the given config rtt away
// (the paper's profile and 20x real time unless it says otherwise), until
// the test ends.
func StartReplicaWith(t testing.TB, rtt time.Duration, cfg emulator.Config) *Replica {
	t.Helper()
	p, err := engine.LookupProfile("paper")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Profile.Name == "" {
		cfg.Profile = p
	}
	if cfg.Speedup == 0 {
		cfg.Speedup = 20
	}
	srv, err := emulator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	link := netem.NewLink(rtt, 0, 1)
	rep := &Replica{Srv: srv, URL: "http://" + ln.Addr().String(), Link: link}
	h := srv.Handler()
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			rep.post(r)
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

// Fake is an upstream of the test's own, counted like a Replica; it
// answers /health itself (200), GET /v1/models with 404 (it lists no
// models: the router takes it to serve any), and everything else with h.
func Fake(t testing.TB, h http.HandlerFunc) *Replica {
	t.Helper()
	rep := &Replica{}
	url := Listen(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/health":
			return
		case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
			http.NotFound(w, r)
			return
		}
		if r.Method == http.MethodPost {
			rep.post(r)
		}
		h(w, r)
	}))
	rep.URL = url
	return rep
}

// Listen serves h on loopback until the test ends and returns its URL.
func Listen(t testing.TB, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return "http://" + ln.Addr().String()
}

// NativeStream is SGLang's streamed answer (POST /generate) of n tokens
// of tokenBytes bytes each: every chunk carries the whole text so far,
// then its counts (meta_info), so that the later chunks may be longer than
// a relay holds (64 KiB); with logprobs, meta_info ends in the
// log-probabilities of every token so far (return_logprob: 25 bytes a
// token, past the 164th longer than the last 4 KiB a relay keeps of an
// event).
func NativeStream(n, tokenBytes int, logprobs bool) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		finish := "null"
		if i == n {
			finish = fmt.Sprintf(`{"type":"length","length":%d}`, n)
		}
		lp := ""
		if logprobs {
			var l strings.Builder
			for k := range i {
				if k > 0 {
					l.WriteByte(',')
				}
				fmt.Fprintf(&l, "[-0.123456789,%d,null]", 1000+k)
			}
			lp = `,"output_token_logprobs":[` + l.String() + "]"
		}
		fmt.Fprintf(&b, `data: {"text":"%s","meta_info":{"id":"x","finish_reason":%s,"prompt_tokens":3,"completion_tokens":%d,"cached_tokens":2%s}}`+"\n\n",
			strings.Repeat(strings.Repeat("y", tokenBytes-1)+" ", i), finish, i, lp)
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// ChatBody is a chat completion request body.
func ChatBody(content string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": "gorgo-emulated", "stream": stream, "max_tokens": maxTokens,
		"stream_options": map[string]any{"include_usage": true},
		"messages":       []map[string]string{{"role": "user", "content": content}}})
	return string(b)
}

// Result is what a client saw of a streamed chat completion.
type Result struct {
	Status  int
	Replica string // the X-Gorgo-Replica header
	Content []string
	Cached  int // -1 without usage
	Done    bool
	Err     string
}

// Chat sends a streaming chat completion and reads it to its end; header
// is pairs of header names and values.
func Chat(t testing.TB, url, content string, maxTokens int, header ...string) Result {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(ChatBody(content, maxTokens, true)))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	res := Result{Status: resp.StatusCode, Replica: resp.Header.Get("X-Gorgo-Replica"), Cached: -1}
	if resp.StatusCode != 200 {
		var e struct{ Error struct{ Message string } }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		res.Err = e.Error.Message
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			res.Done = true
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
			res.Content = append(res.Content, c.Choices[0].Delta.Content)
		}
		if c.Usage != nil {
			res.Cached = c.Usage.Details.Cached
		}
	}
	return res
}

// Do sends a request and returns its status and body; header is pairs of
// header names and values.
func Do(t testing.TB, method, url, body string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Eventually polls cond for up to 20 s (generous: the machine may be busy).
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Workload is light conversations, one request every 10 ms for about
// seconds: 40 sessions whose prompts grow by a block a turn, a few output
// tokens each (cheap enough for a loaded machine; the router's bookkeeping
// is what is tested).
func Workload(seconds int) []trace.Request {
	n := seconds * 100
	reqs := make([]trace.Request, n)
	for i := range reqs {
		session, turn := i%40, 1+i/40
		blocks := min(turn, 4)
		ids := make([]uint64, blocks)
		for k := range ids {
			ids[k] = uint64(session)<<16 | uint64(k)
		}
		reqs[i] = trace.Request{Time: time.Duration(i) * 10 * time.Millisecond, Session: fmt.Sprint("s", session), Turn: turn,
			InputTokens: blocks * trace.BlockTokens, OutputTokens: 3, HashIDs: ids}
	}
	return reqs
}

// ReplayInBackground replays reqs against url; the result comes on the
// channel.
func ReplayInBackground(t testing.TB, url string, reqs []trace.Request) <-chan *replay.Result {
	t.Helper()
	out := make(chan *replay.Result, 1)
	go func() {
		res, err := replay.Run(context.Background(), replay.Config{Target: url, Requests: reqs, MaxInflight: 32})
		if err != nil {
			t.Error(err)
		}
		out <- res
	}()
	return out
}

// Log is a buffer safe for concurrent writes: a test's log sink.
type Log struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// FleetConfig is cfg with the replicas added, ids a, b, ... in regions ra,
// rb, ... (the paper's profile), probed and scraped every 100 ms unless cfg
// says otherwise: the fleet of a test.
func FleetConfig(cfg fleet.Config, reps ...*Replica) fleet.Config {
	for i, r := range reps {
		cfg.Replicas = append(cfg.Replicas, fleet.ReplicaConfig{ID: string(rune('a' + i)), URL: r.URL, Region: "r" + string(rune('a'+i)), Profile: "paper"})
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = 100 * time.Millisecond
	}
	if cfg.ScrapeInterval == 0 {
		cfg.ScrapeInterval = 100 * time.Millisecond
	}
	return cfg
}

// At is a replica at url, served by the test.
func At(url string) *Replica { return &Replica{URL: url} }

// RunFleet probes f once, then runs it until the test ends (its cleanup
// waits for Run to return: register servers over f after it, so that
// they close first).
func RunFleet(t testing.TB, f *fleet.Fleet) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f.ProbeOnce(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}
