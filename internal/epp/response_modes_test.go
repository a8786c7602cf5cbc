package epp

import (
	"context"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// routeChatIn is routeChat with the response body mode Envoy announces; it
// returns the id of the chosen replica.
func routeChatIn(t *testing.T, f *testFleet, s extprocv3.ExternalProcessor_ProcessClient, mode filterv3.ProcessingMode_BodySendMode) string {
	t.Helper()
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false)},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: mode}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody), EndOfStream: true}}})
	ep, _ := destination(t, recv(t, s))
	id, ok := f.EndpointIDs()[strings.Split(ep, ",")[0]]
	if !ok {
		t.Fatalf("destination %q", ep)
	}
	return id
}

// With response_header_mode SEND and response_body_mode NONE, Envoy sends
// the response's headers and then ends the stream: the headers are the
// answer, and the request was served with their status (it was once
// counted a 499, so the tuner, the output estimate and the health counters
// never heard of a served request). The ledger is free by the time Envoy
// has the headers' answer, and later trailers are still answered.
func TestHeadersWithoutBodyAreTheAnswer(t *testing.T) {
	tap := &tapRec{}
	f := newTappedFleet(t, admit.Config{}, tap)
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	id := routeChatIn(t, f, s, filterv3.ProcessingMode_NONE)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
	if r := recv(t, s); r.GetResponseHeaders() == nil {
		t.Fatalf("the headers' answer: %v", r)
	}
	tap.mu.Lock()
	got := append([]int(nil), tap.statuses...)
	tap.mu.Unlock()
	if len(got) != 1 || got[0] != 200 {
		t.Errorf("recorded once the headers were answered: %v, want [200]", got)
	}
	if st, _ := f.core.Router().Replica(id); st.InFlight != 0 {
		t.Errorf("the replica's ledger after the answer: %+v", st)
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
	if r := recv(t, s); r.GetResponseTrailers() == nil {
		t.Errorf("the trailers' answer: %v", r)
	}
	s.CloseSend()
	if _, err := s.Recv(); err == nil {
		t.Errorf("the stream goes on after its end")
	}
	tap.mu.Lock()
	defer tap.mu.Unlock()
	if len(tap.statuses) != 1 {
		t.Errorf("statuses recorded: %v", tap.statuses)
	}
}

// The other response modes keep their meaning: in a body mode, a stream
// that ends after the headers ended mid-answer (499), and one that ends
// before any response event was left by its client before its answer
// began (499: it was once counted as served, review 2026-12-07); with
// the headers skipped (response_header_mode SKIP), a body's events and
// the end were served; with no response body (NONE) and no response
// events at all, the end is all the picker sees: served.
func TestStreamEndAfterHeadersByMode(t *testing.T) {
	for _, tc := range []struct {
		name          string
		mode          filterv3.ProcessingMode_BodySendMode
		headers, body bool
		want          int
	}{
		{"streamed, headers then end", filterv3.ProcessingMode_STREAMED, true, false, 499},
		{"full duplex, headers then end", filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, true, false, 499},
		{"none, no response events", filterv3.ProcessingMode_NONE, false, false, 200},
		{"streamed, no response events", filterv3.ProcessingMode_STREAMED, false, false, 499},
		{"full duplex, no response events", filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false, false, 499},
		{"streamed, headers skipped, a body", filterv3.ProcessingMode_STREAMED, false, true, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tap := &tapRec{}
			f := newTappedFleet(t, admit.Config{}, tap)
			s, err := picker(t, f).Process(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			routeChatIn(t, f, s, tc.mode)
			if tc.headers {
				s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
				recv(t, s)
			}
			if tc.body {
				s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(`{"id":"x"}`), EndOfStream: true}}})
				recv(t, s)
			}
			s.CloseSend()
			waitFor(t, "the request's end", func() bool { tap.mu.Lock(); defer tap.mu.Unlock(); return len(tap.statuses) == 1 })
			tap.mu.Lock()
			defer tap.mu.Unlock()
			if tap.statuses[0] != tc.want {
				t.Errorf("recorded %d, want %d", tap.statuses[0], tc.want)
			}
		})
	}
}

// A streamed body that ends without the answer's end (no finish, no usage,
// no [DONE]: the replica closed its stream early) was broken off: a 502,
// as gorgo serve counts it; one that ends after its finish without [DONE]
// is whole (it was once left neither, and not learned from).
func TestStreamBodyEndedBeforeItsEnd(t *testing.T) {
	for _, c := range []struct {
		events string
		want   int
	}{
		{"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n", 502},
		{"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\n", 200},
		{"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\ndata: [DONE]\n\n", 200},
	} {
		tap := &tapRec{}
		f := newTappedFleet(t, admit.Config{}, tap)
		s, err := picker(t, f).Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		routeChatIn(t, f, s, filterv3.ProcessingMode_STREAMED)
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
		recv(t, s)
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(c.events), EndOfStream: true}}})
		recv(t, s)
		s.CloseSend()
		waitFor(t, "the request's end", func() bool { tap.mu.Lock(); defer tap.mu.Unlock(); return len(tap.statuses) == 1 })
		tap.mu.Lock()
		if tap.statuses[0] != c.want {
			t.Errorf("%q: recorded %d, want %d", c.events, tap.statuses[0], c.want)
		}
		tap.mu.Unlock()
	}
}

// An SGLang /generate stream's counts come in every chunk: a body that
// ends at its tenth of 200 chunks was broken off (a review, 2026-12-07:
// recorded served).
func TestNativeStreamBodyEndedBeforeItsEnd(t *testing.T) {
	full := servetest.NativeStream(200, 10, false)
	k := 0
	for range 10 {
		k += strings.Index(full[k:], "\n\n") + 2
	}
	tap := &tapRec{}
	f := newTappedFleet(t, admit.Config{}, tap)
	s, _ := routeGenerate(t, picker(t, f), "/generate", `{"text":"hi","stream":true,"sampling_params":{"max_new_tokens":200}}`)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200", "content-type", "text/event-stream")}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(full[:k]), EndOfStream: true}}})
	recv(t, s)
	s.CloseSend()
	waitFor(t, "the request's end", func() bool { tap.mu.Lock(); defer tap.mu.Unlock(); return len(tap.statuses) == 1 })
	tap.mu.Lock()
	defer tap.mu.Unlock()
	if tap.statuses[0] != 502 {
		t.Errorf("a /generate stream cut at 10 of 200 chunks recorded %d, want 502", tap.statuses[0])
	}
}
