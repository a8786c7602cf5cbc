package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/fleet"
)

// responsesPreamble is what vLLM's responses_stream_generator sends the
// moment a stream begins, before the engine has scheduled the request:
// response.created and response.in_progress.
const responsesPreamble = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_q\",\"object\":\"response\",\"status\":\"in_progress\"}}\n\n" +
	"event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_q\",\"object\":\"response\",\"status\":\"in_progress\"}}\n\n"

const responsesRest = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"delta\":\"hi\"}\n\n" +
	"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_q\",\"object\":\"response\",\"status\":\"completed\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n"

// A Responses API stream queued in the engine: vLLM sends response.created
// and response.in_progress at once, and its first token after the
// request's wait in its queue. That wait must have first_byte_timeout, as a
// chat stream's has (TestQueuedStreamIsNotCut); with the idle limit, the
// stream is cut, the client gets a broken answer and the busy replica is
// charged a failure.
func TestQueuedResponsesStreamIsNotCut(t *testing.T) {
	queued := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, responsesPreamble)
		w.(http.Flusher).Flush()
		time.Sleep(600 * time.Millisecond) // queued behind others
		_, _ = io.WriteString(w, responsesRest)
	})
	tr, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{StreamIdleTimeout: 200 * time.Millisecond, FirstByteTimeout: time.Minute}}, queued)
	code, body := do(t, "POST", url+"/v1/responses", `{"model":"m","input":"hello","stream":true}`)
	if code != 200 || !strings.Contains(body, "response.completed") {
		t.Errorf("status %d, the answer cut: %.400q", code, body)
	}
	if failures, _, _ := tr.Upstream("a").Health(); failures != 0 {
		t.Errorf("the queued replica's failures in a row: %d, want 0", failures)
	}
}

// A stream that breaks before its first token, after events that carry
// nothing of the answer (vLLM's response.created, a keep-alive comment),
// has given the client nothing it could use: it is tried on another
// replica, as a chat stream that breaks before its first event is
// (TestStreamBrokenBeforeFirstEventIsRetried), and a stream whose first
// real event is an engine error fails over
// (TestStreamThatBeginsWithAnErrorFailsOver).
func TestPreambleThenFailureFailsOver(t *testing.T) {
	for _, tc := range []struct {
		name, path, body, preamble, then string
		hangUp                           bool
	}{
		{name: "responses preamble, then the replica dies", path: "/v1/responses", body: `{"model":"m","input":"hello","stream":true}`,
			preamble: responsesPreamble, hangUp: true},
		{name: "keep-alive comment, then an engine error", path: "/v1/chat/completions", body: chatBody("x", 1, true),
			preamble: ": ping\n\n", then: "data: {\"object\":\"error\",\"message\":\"EngineCore encountered an issue\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}\n\ndata: [DONE]\n\n"},
		{name: "keep-alive comment, then the replica dies", path: "/v1/chat/completions", body: chatBody("x", 1, true),
			preamble: ": ping\n\n", hangUp: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, tc.preamble)
				w.(http.Flusher).Flush()
				time.Sleep(50 * time.Millisecond)
				if tc.hangUp {
					conn, _, _ := w.(http.Hijacker).Hijack()
					conn.Close()
					return
				}
				_, _ = io.WriteString(w, tc.then)
			})
			good := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				if strings.HasPrefix(r.URL.Path, "/v1/responses") {
					_, _ = io.WriteString(w, responsesPreamble+responsesRest)
					return
				}
				_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"fine\"}}]}\n\ndata: [DONE]\n\n")
			})
			_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}}, bad, good)
			req, _ := http.NewRequest("POST", url+tc.path, strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if replica := resp.Header.Get(ReplicaHeader); resp.StatusCode != 200 || replica != "b" || rerr != nil || strings.Contains(string(b), "EngineCore") {
				t.Errorf("status %d from %q, read error %v: %.300q; want b's whole answer", resp.StatusCode, replica, rerr, b)
			}
		})
	}
}
