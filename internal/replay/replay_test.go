package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// request returns a trace request at the given offset with a synthetic
// prompt of in tokens.
func request(at time.Duration, session string, in, out int) trace.Request {
	return trace.Request{Time: at, Session: session, InputTokens: in, OutputTokens: out,
		HashIDs: chain(trace.BlockCount(in), 1, uint64(len(session)))}
}

func TestMeasuresAStream(t *testing.T) {
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) {
		w.Header().Set(ReplicaHeader, "us-east-0")
		s := startSSE(w)
		s.data(`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`)
		time.Sleep(200 * time.Millisecond)
		for i := range 5 {
			if i > 0 {
				time.Sleep(40 * time.Millisecond)
			}
			s.content("tok ")
		}
		// Usage on the finish chunk without details (SGLang), then in a
		// chunk of its own with them (vLLM, OpenAI).
		s.data(`{"choices":[{"index":0,"delta":{"content":null},"finish_reason":"length"}],"usage":{"prompt_tokens":700,"completion_tokens":5,"prompt_tokens_details":null}}`)
		s.usage(700, 5, 512)
		s.done()
	})
	reqs := []trace.Request{request(0, "s1", 700, 5), request(400*time.Millisecond, "", 1000, 0)}
	res, err := Run(context.Background(), Config{Target: srv.URL + "/", Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	if res.Model != "fake-model" {
		t.Errorf("model %q, want the first listed, fake-model", res.Model)
	}
	if len(res.Records) != 2 {
		t.Fatalf("%d records", len(res.Records))
	}
	rec := res.Records[0]
	t.Logf("measured: TTFT %.1f ms, ITL %.1f ms, E2E %.1f ms, slip %.2f ms", rec.TTFT, rec.ITL, rec.E2E, rec.Slip)
	if rec.Failed || rec.Status != 200 {
		t.Fatalf("record %+v", rec)
	}
	// Bounds a busy machine's late wakes (tens of ms) stay within.
	if rec.TTFT < 200 || rec.TTFT > 300 {
		t.Errorf("TTFT %.1f ms, want 200 ms (+100)", rec.TTFT)
	}
	if rec.ITL < 20 || rec.ITL > 80 {
		t.Errorf("ITL %.1f ms, want about 40", rec.ITL)
	}
	if rec.E2E < rec.TTFT+160 {
		t.Errorf("E2E %.1f ms, want at least TTFT + 4 gaps of 40 ms", rec.E2E)
	}
	want := report.Record{Index: 0, Session: "s1", Replica: "us-east-0", PromptTokens: 700, CachedTokens: 512, OutputTokens: 5, Status: 200}
	got := report.Record{Index: rec.Index, Session: rec.Session, Replica: rec.Replica, PromptTokens: rec.PromptTokens, CachedTokens: rec.CachedTokens, OutputTokens: rec.OutputTokens, Status: rec.Status}
	if got != want {
		t.Errorf("record %+v, want %+v", got, want)
	}
	if a := res.Records[1].Arrival; a != 400 {
		t.Errorf("second arrival %v ms, want 400", a)
	}

	sent := srv.received()
	if len(sent) != 2 {
		t.Fatalf("server got %d requests", len(sent))
	}
	for i, s := range sent {
		b := s.Body
		if s.Path != "/v1/chat/completions" || b.Model != "fake-model" || !b.Stream || b.StreamOptions == nil || !b.StreamOptions.IncludeUsage || !b.IgnoreEOS {
			t.Errorf("request %d: %+v", i, s)
		}
		msgs := make([]prompt.Message, len(b.Messages))
		for j, m := range b.Messages {
			msgs[j] = prompt.Message(m)
		}
		if got := (prompt.Estimator{}).Tokens(prompt.Chat(nil, msgs)); got != reqs[i].InputTokens {
			t.Errorf("request %d: the server estimates %d prompt tokens, want %d", i, got, reqs[i].InputTokens)
		}
	}
	if s := sent[0]; s.Session != "s1" || s.Body.User != "s1" || s.Body.MaxTokens != 5 {
		t.Errorf("first request: session header %q, user %q, max_tokens %d", s.Session, s.Body.User, s.Body.MaxTokens)
	}
	if s := sent[1]; s.Session != "" || s.Body.User != "" || s.Body.MaxTokens != 1 {
		t.Errorf("second request: session header %q, user %q, max_tokens %d (want none, none, 1)", s.Session, s.Body.User, s.Body.MaxTokens)
	}
}

func TestFailuresAreRecordedAndTheReplayGoesOn(t *testing.T) {
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) {
		switch rec.Session {
		case "nested":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"error":{"message":"prompt too long for the context window","type":"BadRequestError","param":null,"code":400}}`))
		case "flat":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"object":"error","message":"max_tokens must be at least 1","type":"BadRequestError","param":null,"code":400}`))
		case "busy":
			http.Error(w, "upstream overloaded", http.StatusServiceUnavailable)
		case "cut":
			s := startSSE(w)
			s.content("a")
			s.content("b")
			panic(http.ErrAbortHandler) // drops the connection mid-stream
		case "midstream":
			s := startSSE(w)
			s.content("a")
			s.data(`{"error":{"message":"engine crashed","type":"InternalServerError","code":500}}`)
		case "hangup":
			panic(http.ErrAbortHandler) // no response at all
		default:
			quick(w, 3)
		}
	})
	sessions := []string{"nested", "flat", "busy", "cut", "midstream", "hangup", "ok"}
	var reqs []trace.Request
	for i, s := range sessions {
		reqs = append(reqs, request(time.Duration(i)*5*time.Millisecond, s, 100, 3))
	}
	res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", Requests: reqs, MaxInflight: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		status int
		err    string
	}{
		"nested":    {400, "HTTP 400: prompt too long for the context window"},
		"flat":      {400, "HTTP 400: max_tokens must be at least 1"},
		"busy":      {503, "HTTP 503: upstream overloaded"},
		"cut":       {200, "reading stream: unexpected EOF"},
		"midstream": {200, "error in stream: engine crashed"},
		"hangup":    {0, "sending: connection closed before a response"},
		"ok":        {200, ""},
	}
	if len(res.Records) != len(sessions) {
		t.Fatalf("%d records", len(res.Records))
	}
	for _, rec := range res.Records {
		t.Logf("%-9s status %d, error %q", rec.Session, rec.Status, rec.Error)
		w := want[rec.Session]
		if rec.Status != w.status || rec.Failed != (w.err != "") || !strings.HasPrefix(rec.Error, w.err) || (w.err == "") != (rec.Error == "") {
			t.Errorf("%s: status %d, failed %v, error %q; want status %d, error %q", rec.Session, rec.Status, rec.Failed, rec.Error, w.status, w.err)
		}
	}
	if rec := res.Records[3]; rec.TTFT <= 0 || rec.OutputTokens != 2 {
		t.Errorf("cut stream: TTFT %v, %d tokens; want its first token timed and 2 tokens", rec.TTFT, rec.OutputTokens)
	}
	if run := report.NewRun("replay", res.Records, nil); run.Failed != 6 || run.Completed != 1 {
		t.Errorf("summary: %d failed, %d completed", run.Failed, run.Completed)
	}
}

func TestConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := "http://" + ln.Addr().String()
	ln.Close()
	reqs := []trace.Request{request(0, "a", 10, 1), request(time.Millisecond, "b", 10, 1)}
	res, err := Run(context.Background(), Config{Target: target, Model: "m", Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range res.Records {
		if !rec.Failed || rec.Status != 0 || !strings.Contains(rec.Error, "connecting: ") || !strings.Contains(rec.Error, "refused") {
			t.Errorf("record %+v, want a refused connection", rec)
		}
	}
	// Without a model the replay asks the target first, and fails at once.
	if _, err := Run(context.Background(), Config{Target: target, Requests: reqs}); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("Run against a closed port: %v, want unreachable", err)
	}
	for _, bad := range []string{"ftp://x", "127.0.0.1:8080", "http://", "http://h/?q=1", "%zz"} {
		if _, err := Run(context.Background(), Config{Target: bad, Model: "m", Requests: reqs}); err == nil {
			t.Errorf("Run with target %q: no error", bad)
		}
	}
}

func TestParseTarget(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8080":       "http://127.0.0.1:8080",
		"http://127.0.0.1:8080/":      "http://127.0.0.1:8080",
		"https://h.example/v1":        "https://h.example",
		" https://h.example/gw/v1/ ":  "https://h.example/gw",
		"http://user:pw@h:1/base/":    "http://user:pw@h:1/base",
		"http://[::1]:8080/v1/models": "http://[::1]:8080/v1/models",
	} {
		u, err := ParseTarget(in)
		if err != nil || u.String() != want {
			t.Errorf("ParseTarget(%q) = %v, %v; want %s", in, u, err, want)
		}
	}
}

// The bounds leave a busy machine's late wakes room: an answer takes
// 200 ms, a request sent at once slips less than half of it.
func TestSlipWaitsForTheCap(t *testing.T) {
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) {
		time.Sleep(200 * time.Millisecond)
		quick(w, 1)
	})
	reqs := []trace.Request{request(0, "a", 10, 1), request(0, "b", 10, 1)}
	for _, tt := range []struct {
		cap      int
		min, max float64 // the second request's slip, ms
	}{
		{1, 180, 600},
		{64, 0, 100},
		{0, 0, 100},
	} {
		res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", Requests: reqs, MaxInflight: tt.cap})
		if err != nil {
			t.Fatal(err)
		}
		first, second := res.Records[0], res.Records[1]
		t.Logf("cap %d: slips %.1f and %.1f ms", tt.cap, first.Slip, second.Slip)
		if first.Failed || second.Failed {
			t.Fatalf("cap %d: failed: %q %q", tt.cap, first.Error, second.Error)
		}
		if first.Slip > 100 {
			t.Errorf("cap %d: first slip %.1f ms, want about 0", tt.cap, first.Slip)
		}
		if second.Slip < tt.min || second.Slip > tt.max {
			t.Errorf("cap %d: second slip %.1f ms, want in [%v, %v]", tt.cap, second.Slip, tt.min, tt.max)
		}
	}
}

func TestOpenLoopFollowsTheClock(t *testing.T) {
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) { quick(w, 2) })
	clock := &manualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	// Out of order on purpose: Run sends by time.
	reqs := []trace.Request{request(time.Hour, "c", 10, 2), request(0, "a", 10, 2), request(10*time.Minute+500*time.Microsecond, "b", 10, 2)}
	begin := time.Now()
	res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", Requests: reqs, MaxInflight: 1, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if wall := time.Since(begin); wall > 10*time.Second {
		t.Errorf("an hour of trace took %v on a manual clock", wall)
	}
	wantArrival := []float64{3_600_000, 0, 600_000.5}
	for i, rec := range res.Records {
		if rec.Index != i || rec.Arrival != wantArrival[i] || rec.Slip != 0 || rec.Failed {
			t.Errorf("record %d: index %d, arrival %v ms, slip %v ms, error %q; want arrival %v, no slip", i, rec.Index, rec.Arrival, rec.Slip, rec.Error, wantArrival[i])
		}
	}
	if res.Elapsed < time.Hour {
		t.Errorf("elapsed %v, want at least the hour of the trace", res.Elapsed)
	}
}

func TestInterruptCancelsInFlightAndKeepsRecords(t *testing.T) {
	started := make(chan struct{}, 1)
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) {
		s := startSSE(w)
		s.content("first")
		started <- struct{}{}
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-started
		time.Sleep(20 * time.Millisecond)
		cancel()
	}()
	reqs := []trace.Request{request(0, "a", 10, 100), request(time.Hour, "b", 10, 100)}
	begin := time.Now()
	res, err := Run(ctx, Config{Target: srv.URL, Model: "m", Requests: reqs})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if wall := time.Since(begin); wall > 10*time.Second {
		t.Errorf("interrupt took %v", wall)
	}
	if res == nil || len(res.Records) != 1 || res.Unsent != 1 {
		t.Fatalf("result %+v", res)
	}
	rec := res.Records[0]
	if !rec.Failed || !strings.Contains(rec.Error, "canceled") || rec.TTFT <= 0 || rec.OutputTokens != 1 || rec.Status != 200 {
		t.Errorf("in-flight record %+v", rec)
	}
}

// Warm opens the connections before the replay: requests then find them
// open and none pays for connection setup; without it, concurrent requests
// open their own (and the records say so).
func TestWarmConnections(t *testing.T) {
	// The first run's 8 requests are answered only once all 8 have
	// arrived, so they are in flight at once and none can wait for
	// another's connection (10 s at most, for a stalled machine).
	var arrived atomic.Int32
	all := make(chan struct{})
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) {
		if n := arrived.Add(1); n == 8 {
			close(all)
		} else if n < 8 {
			select {
			case <-all:
			case <-time.After(10 * time.Second):
			}
		}
		s := startSSE(w)
		s.content("tok ")
		s.done()
	})
	var reqs []trace.Request
	for range 8 {
		reqs = append(reqs, request(0, "", 100, 1))
	}
	count := func(res *Result) (n int) {
		for _, r := range res.Records {
			if r.NewConn {
				n++
			}
		}
		return n
	}
	res, err := Run(context.Background(), Config{Target: srv.URL, Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	// One may reuse the connection that asked for the target's models.
	if n := count(res); n < 7 {
		t.Errorf("8 requests at once opened %d connections of their own, want 7 or 8", n)
	}
	res, err = Run(context.Background(), Config{Target: srv.URL, Requests: reqs, Warm: 8})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(res); n != 0 {
		t.Errorf("after warming, %d requests opened a connection", n)
	}
}

// chain returns n block ids: the first shared of them common to every
// tag, the rest the tag's own.
func chain(n, shared int, tag uint64) []uint64 {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(i)
		if i >= shared {
			ids[i] |= tag << 32
		}
	}
	return ids
}

// The models a target lists come base models first: an adapter listed
// before its base (vLLM's "parent") is no default for a replay
// (2026-12-07, a user's test: a replay without --model sent every
// request to a LoRA adapter).
func TestModelsListsBasesFirst(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"object":"list","data":[{"id":"code","parent":"llama"},{"id":"llama","parent":null},{"id":"sql","parent":"llama"},{"id":"mistral"}]}`)
	}))
	defer srv.Close()
	target, _ := ParseTarget(srv.URL)
	ids, err := Models(context.Background(), http.DefaultClient, target)
	if err != nil || strings.Join(ids, ",") != "llama,mistral,code,sql" {
		t.Errorf("models %v (%v), want llama, mistral, code, sql", ids, err)
	}
}

// Ready gives the trace's time 0: a replay waits for it once it is ready
// to send, and times its requests from it.
func TestReadyIsTimeZero(t *testing.T) {
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) { quick(w, 2) })
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := &manualClock{now: t0}
	reqs := []trace.Request{request(0, "a", 10, 2), request(10*time.Minute, "b", 10, 2)}
	ready := func(ctx context.Context) (time.Time, error) {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if len(srv.reqs) > 0 {
			t.Errorf("%d requests sent before the replay was told when to begin", len(srv.reqs))
		}
		return t0.Add(time.Hour), nil
	}
	res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", Requests: reqs, Clock: clock, Ready: ready, Warm: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i, rec := range res.Records {
		if rec.Slip != 0 || rec.Failed {
			t.Errorf("record %d: slip %v ms, error %q; want none", i, rec.Slip, rec.Error)
		}
	}
	if end, want := clock.Now(), t0.Add(time.Hour+10*time.Minute); end.Before(want) {
		t.Errorf("the replay ended at %v, want its last request sent at %v (time 0 an hour on)", end, want)
	}

	// A replay that cannot be told when to begin sends nothing.
	count := func() int {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.reqs)
	}
	sent := count()
	refuse := func(context.Context) (time.Time, error) { return time.Time{}, context.Canceled }
	if _, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", Requests: reqs, Clock: &manualClock{now: t0}, Ready: refuse}); !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want the Ready's", err)
	}
	if n := count() - sent; n != 0 {
		t.Errorf("%d requests sent by a replay whose Ready failed", n)
	}
}

// Together lets n replays begin at one instant: none before the last is
// ready, and all at the instant the last was.
func TestTogether(t *testing.T) {
	ready := Together(3, nil)
	type began struct {
		at  time.Time
		err error
	}
	out := make(chan began, 3)
	for range 2 {
		go func() {
			at, err := ready(context.Background())
			out <- began{at, err}
		}()
	}
	select {
	case b := <-out:
		t.Fatalf("a replay began (%v, %v) before the third was ready", b.at, b.err)
	case <-time.After(50 * time.Millisecond):
	}
	last := time.Now()
	at, err := ready(context.Background())
	if err != nil || at.Before(last) {
		t.Fatalf("the last replay: %v, %v; want time 0 no earlier than it was ready (%v)", at, err, last)
	}
	for range 2 {
		if b := <-out; b.err != nil || !b.at.Equal(at) {
			t.Errorf("a replay began at %v (%v), want %v as the last one", b.at, b.err, at)
		}
	}

	// A replay whose run is cancelled (another one failed) stops waiting.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Together(2, nil)(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}

	// On the replays' clock (a review: on the wall clock, a replay on a
	// manual one slipped by decades); for no replays, at once.
	clock := &manualClock{now: time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)}
	for _, n := range []int{1, 0} {
		at, err := Together(n, clock)(context.Background())
		if err != nil || !at.Equal(clock.Now()) {
			t.Errorf("Together(%d) on a manual clock: %v, %v; want its time, %v", n, at, err, clock.Now())
		}
	}
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) { quick(w, 2) })
	res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", Requests: []trace.Request{request(time.Second, "a", 10, 2)},
		Clock: clock, Ready: Together(1, clock)})
	if err != nil {
		t.Fatal(err)
	}
	if rec := res.Records[0]; rec.Slip != 0 || rec.Failed {
		t.Errorf("a replay begun by Together on its manual clock: slip %v ms, error %q", rec.Slip, rec.Error)
	}
}

// A share of requests asks for its answers whole (Config.Unstreamed),
// the same requests the simulator leaves unstreamed at that seed
// (trace.Unstreamed): each is sent with stream false and no stream
// options, and measured by its end, its TTFT its E2E.
func TestWholeAnswers(t *testing.T) {
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) {
		if rec.Body.Stream {
			quick(w, 3)
			return
		}
		time.Sleep(5 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a b c d"},"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":4,"total_tokens":14}}`)
	})
	var reqs []trace.Request
	for i := range 40 {
		reqs = append(reqs, request(time.Duration(i)*time.Millisecond, fmt.Sprint("s", i), 100, 4))
	}
	res, err := Run(context.Background(), Config{Target: srv.URL, Requests: reqs, Unstreamed: 0.5, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	whole := 0
	for _, rec := range res.Records {
		want := trace.Unstreamed(rec.Index, 7, 0.5)
		if rec.Failed {
			t.Fatalf("request %d failed: %s", rec.Index, rec.Error)
		}
		if got := rec.TTFT == rec.E2E && rec.OutputTokens == 4; got != want || rec.Whole != want {
			t.Errorf("request %d: TTFT %v, E2E %v, %d tokens, recorded whole %v; whole %v", rec.Index, rec.TTFT, rec.E2E, rec.OutputTokens, rec.Whole, want)
		}
		if want && rec.PromptTokens != 10 { // the server's count, not the trace's 100 (a user's test)
			t.Errorf("request %d: %d prompt tokens, want the answer's usage's 10", rec.Index, rec.PromptTokens)
		}
		if want {
			whole++
		}
	}
	for _, s := range srv.received() {
		var i int
		fmt.Sscan(s.Session[1:], &i)
		if s.Body.Stream == trace.Unstreamed(i, 7, 0.5) || s.Body.Stream == (s.Body.StreamOptions == nil) { // vLLM refuses stream_options without a stream
			t.Errorf("request %d sent with stream %v, stream_options %+v", i, s.Body.Stream, s.Body.StreamOptions)
		}
	}
	if whole < 10 || whole > 30 {
		t.Errorf("%d of 40 whole at a share of 0.5", whole)
	}
}

// A whole answer that says the engine gave up (finish_reason "abort" or
// "error", as vLLM's do), one without a usage, one that is no JSON and one
// far longer than its tokens could be are failures, each saying why (a
// user's test: an "error" answer counted as served).
func TestBadWholeAnswers(t *testing.T) {
	for _, c := range []struct{ name, body, want string }{
		{"error", `{"choices":[{"index":0,"message":{"content":"a b"},"finish_reason":"error"}],"usage":{"prompt_tokens":10,"completion_tokens":2}}`, `finish_reason "error"`},
		{"abort", `{"choices":[{"index":0,"message":{"content":""},"finish_reason":"abort"}],"usage":{"prompt_tokens":10,"completion_tokens":0}}`, `finish_reason "abort"`},
		{"no usage", `{"choices":[{"index":0,"message":{"content":"a b"},"finish_reason":"length"}],"usage":null}`, "no usage"},
		{"not JSON", `<html>bad gateway</html>`, "not a chat completion"},
		{"an error", `{"error":{"message":"engine overloaded","type":"ServiceUnavailableError","code":503}}`, "the answer is an error: engine overloaded"},
		{"too long", `{"choices":[{"index":0,"message":{"content":"` + strings.Repeat("a", 3<<20) + `"},"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":4}}`, "longer than"},
	} {
		srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, c.body)
		})
		res, err := Run(context.Background(), Config{Target: srv.URL, Requests: []trace.Request{request(0, "s1", 100, 4)}, Unstreamed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if rec := res.Records[0]; !rec.Failed || !strings.Contains(rec.Error, c.want) {
			t.Errorf("%s: failed %v, error %q, want one saying %q", c.name, rec.Failed, rec.Error, c.want)
		}
	}
}

// A request not answered to its end within Config.RequestTimeout is cut
// and failed, saying so, streamed or whole, and the replay ends (a user's
// test: a server that stalled mid-answer held the replay until Ctrl-C).
func TestRequestTimeout(t *testing.T) {
	stall := make(chan struct{})
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) {
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n")
		w.(http.Flusher).Flush()
		select { // half an answer, then nothing
		case <-stall:
		case <-r.Context().Done():
		}
	})
	defer close(stall)
	for _, share := range []float64{0, 1} {
		res, err := Run(context.Background(), Config{Target: srv.URL, Requests: []trace.Request{request(0, "s1", 100, 4)},
			Unstreamed: share, RequestTimeout: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if rec := res.Records[0]; !rec.Failed || !strings.Contains(rec.Error, ErrRequestTimeout.Error()) {
			t.Errorf("unstreamed %v: failed %v, error %q", share, rec.Failed, rec.Error)
		}
	}
}
