package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
)

// A stream whose replica sends its headers and then nothing is given up on
// after first_byte_timeout (the idle limit, if longer), and served by
// another replica (nothing reached the client yet).
func TestStallBeforeTheFirstEventFailsOver(t *testing.T) {
	stall := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{StreamIdleTimeout: 500 * time.Millisecond, FirstByteTimeout: 500 * time.Millisecond}}, stall, good)
	if code, body, replica := post(t, url, chatBody("x", 1, true)); code != 200 || replica != "b" || !strings.Contains(body, "[DONE]") {
		t.Errorf("status %d from %q: %.200s", code, replica, body)
	}
	// Without an idle limit, first_byte_timeout still bounds the wait.
	_, url = startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{StreamIdleTimeout: -1, FirstByteTimeout: 500 * time.Millisecond}}, stall, good)
	if code, body, replica := post(t, url, chatBody("x", 1, true)); code != 200 || replica != "b" {
		t.Errorf("no idle limit: status %d from %q: %.200s", code, replica, body)
	}
}

// A whole answer that trickles (a byte every 50 ms, never done) is given
// up on once stream_idle_timeout has passed since its headers, however its
// bytes come, and served by another replica (2026-12-06, a user's test:
// each byte reset the idle limit, and the answer, held until its end, was
// held for ever).
func TestTricklingAnswerFailsOver(t *testing.T) {
	trickle := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		for {
			if _, err := io.WriteString(w, " "); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{StreamIdleTimeout: 400 * time.Millisecond}}, trickle, good)
	if code, body, replica := post(t, url, chatBody("x", 1, false)); code != 200 || replica != "b" {
		t.Errorf("status %d from %q: %.200s", code, replica, body)
	}
}

// A 404 whose body stalls is given up on after the idle limit, as a stream
// is, and the request is served by another replica (found in review: the
// body was read with no limit, and the request hung).
func TestStalled404FailsOver(t *testing.T) {
	stall := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":{"message":"The model`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{StreamIdleTimeout: 200 * time.Millisecond}}, stall, good)
	for _, stream := range []bool{false, true} {
		if code, body, replica := post(t, url, chatBody("x", 1, stream)); code != 200 || replica != "b" {
			t.Errorf("stream %v: status %d from %q: %.200s", stream, code, replica, body)
		}
	}
}

// A stream that begins with an error event the replica owns (vLLM's 200,
// then {"object":"error",...}, when its engine fails before the first
// token) is served by another replica, and the replica is charged the
// failure (found in review: the client got the error under a 200, and the
// replica's failures in a row were reset). An error that blames the request
// is relayed as it came: another replica would refuse it too.
func TestStreamThatBeginsWithAnErrorFailsOver(t *testing.T) {
	for _, tc := range []struct {
		event   string
		retried bool
	}{
		{`{"object":"error","message":"EngineCore encountered an issue","type":"InternalServerError","param":null,"code":500}`, true},
		{`{"error":{"message":"engine dead","type":"server_error"}}`, true},
		{`{"object":"error","message":"maximum context length is 8 tokens","type":"BadRequestError","param":null,"code":400}`, false},
	} {
		bad := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: "+tc.event+"\n\ndata: [DONE]\n\n")
		})
		good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
		tr, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, bad, good)
		code, body, replica := post(t, url, chatBody("x", 1, true))
		failures, _, _ := tr.Upstream("a").Health()
		switch {
		case tc.retried && (code != 200 || replica != "b" || strings.Contains(body, "error")):
			t.Errorf("%s: status %d from %q: %.200s; want b's answer", tc.event, code, replica, body)
		case tc.retried && failures != 1:
			t.Errorf("%s: a's failures in a row %d, want 1", tc.event, failures)
		case !tc.retried && (replica != "a" || !strings.Contains(body, "maximum context length") || failures != 0):
			t.Errorf("%s: status %d from %q, a's failures %d: %.200s; want a's error relayed, a not blamed", tc.event, code, replica, failures, body)
		}
	}
}

// A client that stops reading for a while is not the replica's failure:
// while the relay waits on the client, the replica's idle limit does not
// run (found in review: it did, the relay cut the replica's answer as a
// stall, and three slow clients ejected a healthy replica). The client
// gets its whole answer, or is cut itself; never a short one as if whole.
func TestSlowClientIsNotTheReplicasFailure(t *testing.T) {
	event := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("x", 8000) + "\"}}]}\n\n"
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for range 4000 { // 32 MB: more than the sockets between them hold
			if _, err := io.WriteString(w, event); err != nil {
				return
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	tr, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{StreamIdleTimeout: time.Second}}, up)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hi", 1, true)))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the client is busy elsewhere
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if whole := int64(4000*len(event) + len("data: [DONE]\n\n")); err == nil && n != whole {
		t.Errorf("the client read %d of %d bytes and no error: the stream ended short, as if whole", n, whole)
	}
	if failures, _, _ := tr.Upstream("a").Health(); failures != 0 {
		t.Errorf("the replica's failures in a row: %d, want 0 (the client was slow, not the replica)", failures)
	}
}

// A streamed tool call has a first token: its argument deltas are
// generated tokens (found in review: the request stayed "waiting for its
// first token" until it ended, no TTFT was recorded, and it was reported
// to learning policies as failed).
func TestToolCallStreamHasAFirstToken(t *testing.T) {
	var mid atomic.Bool
	release := make(chan struct{})
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		send := func(s string) { _, _ = io.WriteString(w, "data: "+s+"\n\n"); fl.Flush() }
		send(`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}`)
		send(`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]},"finish_reason":null}]}`)
		mid.Store(true)
		<-release
		send(`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`)
		send(`{"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20}}`)
		send(`[DONE]`)
	})
	tr, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, up)
	done := make(chan int)
	go func() {
		code, _ := do(t, "POST", url+"/v1/chat/completions", chatBody("weather?", 50, true))
		done <- code
	}()
	eventually(t, "the stream to be mid-way", mid.Load)
	eventually(t, "the request to be decoding", func() bool { return stateOr(tr, "a").Decoding == 1 })
	close(release)
	if code := <-done; code != 200 {
		t.Fatalf("status %d", code)
	}
	if n := testutil.CollectAndCount(tr.reg, "gorgo_ttft_seconds"); n == 0 {
		t.Error("no TTFT recorded for the tool call")
	}
}

// A replica's redirect is not followed (found in review: the client's
// request went, as a GET with its headers, wherever the replica pointed,
// and that page came back as the answer): it is the replica's failure, and
// another replica serves the request.
func TestRedirectIsNotFollowed(t *testing.T) {
	var followed atomic.Bool
	elsewhere := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Client") != "" { // a client's request, not a probe (probes follow redirects)
			followed.Store(true)
		}
	})
	redirect := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+"/latest/meta-data", http.StatusFound)
	})
	good := startReplica(t, 60*time.Millisecond, emulator.Faults{})
	tr, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, redirect, good)
	for _, stream := range []bool{false, true} {
		if code, body, replica := post(t, url, chatBody("x", 1, stream), "X-Client", "1"); code != 200 || replica != "b" {
			t.Errorf("stream %v: status %d from %q: %.200s", stream, code, replica, body)
		}
	}
	if followed.Load() {
		t.Error("the redirect was followed")
	}
	// Where the redirect pointed is the log's, not the client's: it may
	// name an internal host.
	_, alone := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, redirect)
	if code, body, _ := post(t, alone, chatBody("x", 1, false)); code != http.StatusBadGateway || strings.Contains(body, "meta-data") {
		t.Errorf("the redirecting replica alone: %d %s", code, body)
	}
	if failures, _, _ := tr.Upstream("a").Health(); failures == 0 {
		t.Error("the redirecting replica was not charged")
	}
}

// A client that sends its body a byte at a time is cut after
// read_body_timeout with a 408, and frees its in-flight slot (found in
// review: with no deadline, 32 such clients held every slot for ever).
func TestSlowBodyIsCut(t *testing.T) {
	good := startReplica(t, 10*time.Millisecond, emulator.Faults{})
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{MaxInFlight: 1, ReadBodyTimeout: 300 * time.Millisecond}}, good)
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 8388608\r\n\r\n{")
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second)) // the failure would be a hang
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to the slow body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("the slow body got %d, want 408", resp.StatusCode)
	}
	if code, body := do(t, "POST", url+"/v1/chat/completions", chatBody("hi", 1, false)); code != 200 {
		t.Errorf("the next request got %d: %.200s", code, body)
	}
}

// A stream's first event may wait in the engine's queue longer than the
// idle limit between events: it has first_byte_timeout, as a non-streaming
// answer's headers have (found in review: a stream queued past the idle
// limit was cut, retried from the back of another queue, and its busy
// replica charged a failure).
func TestQueuedStreamIsNotCut(t *testing.T) {
	queued := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		time.Sleep(600 * time.Millisecond) // queued behind others
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	})
	tr, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{StreamIdleTimeout: 200 * time.Millisecond, FirstByteTimeout: time.Minute}}, queued)
	code, body := do(t, "POST", url+"/v1/chat/completions", chatBody("x", 1, true))
	if code != 200 || !strings.Contains(body, "[DONE]") {
		t.Errorf("status %d: %.200s", code, body)
	}
	if failures, _, _ := tr.Upstream("a").Health(); failures != 0 {
		t.Errorf("the queued replica's failures in a row: %d, want 0", failures)
	}
}

// An engine that gives a request up before its first token answers 200:
// vLLM, shutting down or paused (its default on SIGTERM with no drain
// timeout), ends the stream after its role chunk ([DONE], or its usage of
// no tokens first), or answers a non-streaming request with finish_reason
// "abort" and no tokens; SGLang streams a finish_reason "abort". Nothing
// reached the client: another replica serves it (before, the client got
// an empty answer). An answer of no text that finished ("stop": the model
// ended at once) is an answer.
func TestAbortBeforeTheFirstTokenFailsOver(t *testing.T) {
	role := `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
	done := "data: [DONE]\n\n"
	usage0 := `data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":0,"total_tokens":5}}` + "\n\n"
	for _, c := range []struct {
		name, stream, whole string
		served              bool // by the aborting replica: not an abort
	}{
		{name: "vLLM stream", stream: role + done},
		{name: "vLLM continuous usage", stream: `data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":5,"completion_tokens":0}}` + "\n\n" + `data: {"id":"c","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1}}` + "\n\n" + done, served: true},
		{name: "SGLang stream", stream: role + `data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"abort"}]}` + "\n\n" + done},
		// With stream_options.include_usage the stream's usage of no
		// tokens comes before its [DONE].
		{name: "vLLM stream with its usage", stream: role + usage0 + done},
		{name: "vLLM continuous usage, given up", stream: `data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":5,"completion_tokens":0}}` + "\n\n" + usage0 + done},
		{name: "SGLang stream with its usage", stream: role + `data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"abort"}]}` + "\n\n" + usage0 + done},
		{name: "vLLM answer", whole: `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"abort"}],"usage":{"prompt_tokens":5,"completion_tokens":0,"total_tokens":5}}`},
		{name: "an empty answer that finished", stream: role + `data: {"id":"c","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}` + "\n\n" + done, served: true},
		// An answer that is none (a user's test, 2026-12-06: relayed as
		// 200s, the replica never charged).
		{name: "a stream of garbage", stream: "\x00\x01garbage<html>not json"},
		{name: "a whole answer of garbage", whole: "\x00\x01garbage<html>not json"},
		{name: "a whole answer to a streamed request", stream: `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}]}`, served: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			aborting := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				io.ReadAll(r.Body)
				if c.whole != "" {
					w.Header().Set("Content-Type", "application/json")
					io.WriteString(w, c.whole)
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, c.stream)
			})
			good := startReplica(t, 20*time.Millisecond, emulator.Faults{})
			_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, aborting, good)
			code, body, replica := post(t, url, chatBody("x", 3, c.whole == ""))
			want := "b"
			if c.served {
				want = "a"
			}
			if code != 200 || replica != want {
				t.Errorf("status %d from %q, want 200 from %s: %.300s", code, replica, want, body)
			}
		})
	}
}
