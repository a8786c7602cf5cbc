package epp

import (
	"context"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/gorgo-llm/gorgo/internal/admit"
)

// routeResponses sends a /v1/responses request (buffered body) and returns
// the picker's answer to its body.
func routeResponses(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient, body string) *extprocv3.ProcessingResponse {
	t.Helper()
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/responses", false)},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}})
	return recv(t, s)
}

// A follow-up pinned to its holder is sent to the gateway with the holder
// first and the others ranked after it, as every other request has its
// fallbacks (the gateway's only way to try elsewhere when the endpoint
// refuses the connection or fails): a holder that is down must not lose
// the request.
func TestPinnedFollowUpKeepsFallbacks(t *testing.T) {
	f := newFleet(t, admit.Config{})
	f.core.Router().Stored("resp_x", "b")
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h, _ := destination(t, routeResponses(t, s, `{"model":"m","input":"and then?","previous_response_id":"resp_x"}`))
	if !strings.HasPrefix(h, "10.0.0.2:8000") {
		t.Fatalf("destination %q: not pinned to b", h)
	}
	if h != "10.0.0.2:8000,10.0.0.1:8000" {
		t.Errorf("destination %q: the pinned holder has no fallback (an unpinned request gets one)", h)
	}
}

// vLLM's non-streamed answer echoes the request's instructions before its
// "object" member; the picker reads the id from the first body chunk only
// (x.head), so an answer whose first chunk ends inside the instructions is
// never recorded and its follow-ups are routed by load (404 elsewhere).
func TestNonStreamedIDAfterFirstChunk(t *testing.T) {
	f := newFleet(t, admit.Config{})
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h, _ := destination(t, routeResponses(t, s, `{"model":"m","input":"hi","instructions":"be brief"}`))
	served := map[string]string{"10.0.0.1:8000": "a", "10.0.0.2:8000": "b"}[strings.Split(h, ",")[0]]
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
	recv(t, s)
	answer := `{"id":"resp_long","created_at":1,"incomplete_details":null,"instructions":"` + strings.Repeat("be brief. ", 3000) +
		`","metadata":null,"model":"m","object":"response","output":[],"status":"completed","usage":{"input_tokens":9,"output_tokens":2,"total_tokens":11}}`
	for i := 0; i < len(answer); i += 16 << 10 { // as Envoy passes it on: in pieces
		end := min(i+16<<10, len(answer))
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(answer[i:end]), EndOfStream: end == len(answer)}}})
		recv(t, s)
	}
	waitFor(t, "the request's end", func() bool { st, _ := f.core.Router().Replica(served); return st.InFlight == 0 })
	if got, ok := f.core.Router().Holder("resp_long"); !ok || got != served {
		t.Errorf("holder of resp_long: %q %v, want %s", got, ok, served)
	}
}

// A streamed response's events each carry the whole response (vLLM's
// response.created, .in_progress and .completed: its instructions and
// tools echoed). One longer than maxTail (64 KiB: an agent's tool list)
// is dropped unread, so the id is never recorded.
func TestStreamedLongCreatedEvent(t *testing.T) {
	f := newFleet(t, admit.Config{})
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h, _ := destination(t, routeResponses(t, s, `{"model":"m","input":"hi","stream":true}`))
	served := map[string]string{"10.0.0.1:8000": "a", "10.0.0.2:8000": "b"}[strings.Split(h, ",")[0]]
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200", "content-type", "text/event-stream")}})
	recv(t, s)
	resp := `{"id":"resp_tools","created_at":1,"incomplete_details":null,"instructions":null,"metadata":null,"model":"m","object":"response","output":[],` +
		`"tools":[` + strings.TrimSuffix(strings.Repeat(`{"type":"function","name":"tool","description":"`+strings.Repeat("d", 1000)+`","parameters":{}},`, 80), ",") + `],"status":"in_progress"}`
	events := "event: response.created\ndata: {\"response\":" + resp + ",\"sequence_number\":0,\"type\":\"response.created\"}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"ok\",\"sequence_number\":1}\n\n"
	for i := 0; i < len(events); i += 16 << 10 {
		end := min(i+16<<10, len(events))
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(events[i:end])}}})
		recv(t, s)
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: nil, EndOfStream: true}}})
	recv(t, s)
	waitFor(t, "the request's end", func() bool { st, _ := f.core.Router().Replica(served); return st.InFlight == 0 })
	if got, ok := f.core.Router().Holder("resp_tools"); !ok || got != served {
		t.Errorf("holder of resp_tools (a response.created event of %d bytes): %q %v, want %s", len(resp), got, ok, served)
	}
}

// The picker reads a stored response's id from the raw :path, escaped as
// the client sent it, while the id it recorded came from the answer's
// JSON: an id with a character a path escapes (vLLM takes a client's
// request_id as the response's id) is never matched, and the GET goes by
// load. The proxy reads r.URL.Path, unescaped, and matches.
func TestEscapedPathID(t *testing.T) {
	f := newFleet(t, admit.Config{})
	f.core.Router().Stored("resp_my run", "b")
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h := headers("/v1/responses/resp_my%20run", true)
	h.Headers.Headers[1].RawValue = []byte("GET")
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: h},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
	if d, _ := destination(t, recv(t, s)); !strings.HasPrefix(d, "10.0.0.2:8000") {
		t.Errorf("GET of resp_my run (held by b): destination %q", d)
	}
}
