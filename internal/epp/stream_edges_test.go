package epp

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/estimate"
	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/servetest"
	"github.com/gorgo-llm/gorgo/internal/tenant"
)

// a fleet that lost replica a's address (removed between Dispatch and Endpoint)
type lostA struct{ *testFleet }

func (l lostA) Endpoint(id string) (string, bool) {
	if id == "a" {
		return "", false
	}
	return l.testFleet.Endpoint(id)
}

// A replica that left the fleet between the decision and its address is
// freed and the next one answered (its ledger leaked once).
func TestEndpointGoneIsFreed(t *testing.T) {
	f := newFleet(t, admit.Config{})
	s, _ := picker(t, lostA{f}).Process(context.Background())
	if h, _ := destination(t, routeChat(t, s)); h != "10.0.0.2:8000" {
		t.Errorf("answered %q, want b", h)
	}
	s.CloseSend()
	s.Recv()
	waitFor(t, "a's ledger to be free", func() bool { st, _ := f.core.Router().Replica("a"); return st.InFlight == 0 })
}

// A body that comes in pieces is routed by load (it was once parsed, and
// refused): buffered-partial at its first piece, whose answer Envoy holds
// the headers for; streamed, and a gateway that sends no body (NONE), at
// the headers, since Envoy lets them go on at their answer and a later
// destination would be too late (review, 2026-12-07: no destination at
// all reached Envoy).
func TestBodyInPiecesIsRoutedByLoad(t *testing.T) {
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_BUFFERED_PARTIAL, filterv3.ProcessingMode_NONE} {
		f := newFleet(t, admit.Config{})
		s, _ := picker(t, f).Process(context.Background())
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false)},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
		r := recv(t, s)
		if mode == filterv3.ProcessingMode_BUFFERED_PARTIAL {
			if r.GetRequestHeaders().GetResponse().GetHeaderMutation() != nil {
				t.Errorf("%v: routed at the headers, before the first piece", mode)
			}
			s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody[:40])}}})
			r = recv(t, s)
		}
		if imm := r.GetImmediateResponse(); imm != nil {
			t.Fatalf("%v: answered %d: %s", mode, imm.GetStatus().GetCode(), imm.GetBody())
		}
		if h, _ := destination(t, r); h == "" {
			t.Errorf("%v: no destination", mode)
		}
		if mode == filterv3.ProcessingMode_STREAMED {
			// The pieces go on as they came.
			s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody[:40])}}})
			if b := recv(t, s).GetRequestBody(); b == nil || b.GetResponse().GetBodyMutation() != nil {
				t.Errorf("%v: a piece after the decision answered %v", mode, b)
			}
		}
		s.CloseSend()
	}
}

// Full duplex with request trailers: the trailers end the body, and the
// headers' answer comes first.
func TestDuplexTrailersEndTheBody(t *testing.T) {
	f := newFleet(t, admit.Config{})
	s, _ := picker(t, f).Process(context.Background())
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false)},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody)}}})
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
	r := recv(t, s)
	if _, ok := r.Response.(*extprocv3.ProcessingResponse_RequestHeaders); !ok {
		t.Errorf("first answer in duplex with trailers: %T (want the headers' answer with the destination)", r.Response)
	}
	// The body goes back without ending the stream (review, 2026-12-07:
	// its last piece said end_of_stream, which Envoy passes upstream
	// before the trailers), then the trailers' answer.
	for {
		r = recv(t, s)
		piece := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if piece == nil {
			break
		}
		if piece.GetEndOfStream() {
			t.Errorf("a body piece ends the stream before its trailers")
		}
	}
	if r.GetRequestTrailers() == nil {
		t.Errorf("after the body: %T, want the trailers' answer", r.Response)
	}
	s.CloseSend()
}

// A gateway that does not say its body modes on the stream (Envoy before
// 1.34) is taken to use the picker's Assume: full duplex waits for the
// body before the headers' answer and sends it back in pieces; without
// Assume, buffered, as before (review, 2026-12-07: full duplex without the
// protocol configuration sent the headers on with no destination).
func TestAssumedBodyMode(t *testing.T) {
	f := newFleet(t, admit.Config{})
	pk := New(f, nil)
	pk.Assume = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	s, _ := servePicker(t, pk).Process(context.Background())
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false)}})
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody[:10])}}})
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody[10:]), EndOfStream: true}}})
	if h, _ := destination(t, recv(t, s)); h == "" {
		t.Fatal("no destination in the headers' answer")
	}
	if piece := recv(t, s).GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); string(piece.GetBody()) != chatBody || !piece.GetEndOfStream() {
		t.Errorf("the body went back as %q", piece.GetBody())
	}
	// The response's body pieces are echoed, as full duplex asks.
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(`{"id":"x"}`), EndOfStream: true}}})
	if piece := recv(t, s).GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse(); string(piece.GetBody()) != `{"id":"x"}` {
		t.Errorf("the response's body went back as %q", piece.GetBody())
	}
	s.CloseSend()
}

// The subset hint: a list or a string, its entries comma-separated or not;
// a hint that names nothing leaves nothing eligible (it once meant no
// hint, review 2026-12-07).
func TestSubsetHint(t *testing.T) {
	hint := func(v any) *corev3.Metadata {
		st, err := structpb.NewStruct(map[string]any{SubsetKey: v})
		if err != nil {
			t.Fatal(err)
		}
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: st}}
	}
	for _, c := range []struct {
		md   *corev3.Metadata
		want []string
	}{
		{nil, nil},
		{&corev3.Metadata{}, nil},
		{hint("10.0.0.1:8000"), []string{"10.0.0.1:8000"}},
		{hint("10.0.0.1:8000, 10.0.0.2:8000"), []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{hint([]any{"10.0.0.1:8000", "10.0.0.2:8000"}), []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{hint([]any{"10.0.0.1:8000,10.0.0.2:8000"}), []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{hint(""), []string{}},
		{hint(" , "), []string{}},
		{hint([]any{}), []string{}},
	} {
		got := subset(c.md)
		if (got == nil) != (c.want == nil) || !slices.Equal(got, c.want) {
			t.Errorf("%v: %#v, want %#v", c.md, got, c.want)
		}
	}
}

type tapRec struct {
	mu       sync.Mutex
	statuses []int
}

func (r *tapRec) Decided(time.Time, *policy.Request, *router.Ticket, []router.Candidate) uint64 {
	return 1
}
func (r *tapRec) Ended(id uint64, replica string, status int, ttft, e2e time.Duration) {
	r.mu.Lock()
	r.statuses = append(r.statuses, status)
	r.mu.Unlock()
}

// A stream cancelled mid-answer is not counted as served (it was once a 200).
func TestCancelMidAnswerIsNotAServedRequest(t *testing.T) {
	tap := &tapRec{}
	f := newTappedFleet(t, admit.Config{}, tap)
	ctx, cancel := context.WithCancel(context.Background())
	s, _ := picker(t, f).Process(ctx)
	routeChat(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n")}}})
	recv(t, s)
	cancel() // the gateway's stream goes away mid-answer
	waitFor(t, "the request's end", func() bool { tap.mu.Lock(); defer tap.mu.Unlock(); return len(tap.statuses) == 1 })
	if tap.statuses[0] == 200 {
		t.Errorf("a stream cancelled mid-answer is counted as a 200 success")
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A non-streamed answer is read whole at its end, even pretty-printed with
// blank lines in it (it was once cut as SSE events and its
// usage lost).
func TestNonStreamedAnswerUsage(t *testing.T) {
	f := newFleet(t, admit.Config{})
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(chatBody, `"stream":true`, `"stream":false`, 1)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false)}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
	recv(t, s)
	answer := "{\n\n  \"choices\": [{\"message\": {\"role\": \"assistant\", \"content\": \"hi\"}}],\n\n  \"usage\": {\"prompt_tokens\": 20, \"completion_tokens\": 7}\n}\n"
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(answer[:30])}}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(answer[30:]), EndOfStream: true}}})
	recv(t, s)
	waitFor(t, "the ledger to be free", func() bool { st, _ := f.core.Router().Replica("a"); return st.InFlight == 0 })
	if e := f.core.Router().ExpectedOutput(&policy.Request{}); e >= router.DefaultOutputTokens {
		t.Errorf("the answer's 7 tokens were not read: expected output %d", e)
	}
}

// SGLang's native API (POST /generate) through the picker: routed on its
// text, and its answer, in SGLang's shape, gives the first token.
func TestNativeGenerate(t *testing.T) {
	f := newFleet(t, admit.Config{})
	s, _ := routeGenerate(t, picker(t, f), "/generate", `{"text":"where should this go? a prompt long enough for a few blocks","stream":true}`)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
	recv(t, s)
	decoding := func() (n int) {
		for _, id := range []string{"a", "b"} {
			st, _ := f.core.Router().Replica(id)
			n += st.Decoding
		}
		return n
	}
	if n := decoding(); n != 0 {
		t.Fatalf("%d decoding before a token", n)
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
		Body: []byte(`data: {"text":"Hel","meta_info":{"finish_reason":null,"completion_tokens":1,"cached_tokens":0}}` + "\n\n")}}})
	recv(t, s)
	if n := decoding(); n != 1 {
		t.Errorf("after its first token: %d decoding, want 1", n)
	}
}

// A /generate the gateway sent to a replica without it (vLLM, in a fleet
// of both) comes back 404: later /generate picks pass that replica over
// (router.Router.Lacks; its query is not part of the endpoint).
func TestNativeNotFoundIsRemembered(t *testing.T) {
	f := newFleet(t, admit.Config{})
	c := picker(t, f)
	pick := func(status string) string {
		t.Helper()
		s, routed := routeGenerate(t, c, "/generate?x=1", `{"text":"where should this go? a prompt long enough for a few blocks"}`)
		list, _ := destination(t, routed)
		ep, _, _ := strings.Cut(list, ",")
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", true, ":status", status)}})
		recv(t, s)
		s.CloseSend()
		return f.EndpointIDs()[ep]
	}
	first := pick("404")
	if st, _ := f.core.Router().Replica(first); len(st.Lacking) != 1 || st.Lacking["/generate"] == 0 {
		t.Fatalf("%s answered /generate 404: lacking %v, want /generate", first, st.Lacking)
	}
	for range 3 {
		if next := pick("200"); next == first {
			t.Fatalf("picked %s again for /generate after its 404", next)
		}
	}
}

// A streamed /generate answer whose chunks grow past what the picker
// holds (each carries the whole text so far: a long rollout's), sent in
// Envoy's 16 KiB pieces, is counted from its last chunk's meta_info, read
// as it passes, its log-probabilities after it or not (2026-12-05:
// counted as of the last chunk held, 64 of 100 tokens; then, with
// return_logprob, short again).
func TestLongNativeStreamIsCounted(t *testing.T) {
	for _, c := range []struct {
		n, tokenBytes int
		logprobs      bool
	}{{100, 1000, false}, {200, 1000, true}} {
		f := newFleet(t, admit.Config{})
		generateThroughGateway(t, f, `{"text":"a long rollout","stream":true,"sampling_params":{"max_new_tokens":1000}}`,
			"text/event-stream", servetest.NativeStream(c.n, c.tokenBytes, c.logprobs))
		want := router.DefaultOutputTokens + estimate.OutputGlobalAlpha*float64(c.n-router.DefaultOutputTokens)
		waitFor(t, "the answer's length to be learned", func() bool { return f.core.Router().OutputEstimate().Mean != router.DefaultOutputTokens })
		if got := f.core.Router().OutputEstimate().Mean; math.Abs(got-want) > 1e-9 {
			t.Errorf("logprobs %v: mean answer after one of %d tokens: %.3f, want %.3f", c.logprobs, c.n, got, want)
		}
	}
}

// A whole /generate answer longer than the picker holds, its
// log-probabilities after its counts, is counted as it passes
// (2026-12-06: from its tail, which held no count).
func TestLongNativeAnswerIsCounted(t *testing.T) {
	f := newFleet(t, admit.Config{})
	const n = 300
	answer := `{"text":"` + strings.Repeat("word ", n) + `","meta_info":{"id":"x","finish_reason":{"type":"length","length":300},"prompt_tokens":4,"completion_tokens":300,"cached_tokens":0,` +
		`"output_token_logprobs":[` + strings.Repeat(`[-0.0123456789,12345,"a token's text, long enough"],`, 4000) + `[-0.5,1,null]]}}`
	generateThroughGateway(t, f, `{"text":"a long rollout","return_logprob":true,"sampling_params":{"max_new_tokens":1000}}`, "application/json", answer)
	want := router.DefaultOutputTokens + estimate.OutputGlobalAlpha*float64(n-router.DefaultOutputTokens)
	waitFor(t, "the answer's length to be learned", func() bool { return f.core.Router().OutputEstimate().Mean != router.DefaultOutputTokens })
	if got := f.core.Router().OutputEstimate().Mean; math.Abs(got-want) > 1e-9 {
		t.Errorf("mean answer after one of %d tokens: %.3f, want %.3f", n, got, want)
	}
}

// routeGenerate sends a /generate to path, of body, through the picker c as
// a gateway would (its body buffered, the answer to be streamed), and
// returns the stream and the picker's answer to the body (its routing).
func routeGenerate(t *testing.T, c extprocv3.ExternalProcessorClient, path, body string) (extprocv3.ExternalProcessor_ProcessClient, *extprocv3.ProcessingResponse) {
	t.Helper()
	s, err := c.Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers(path, false)},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}})
	return s, recv(t, s)
}

// generateThroughGateway routes a /generate of body on f's picker as a
// gateway would (its body buffered, the answer's streamed), then hands it
// the answer, of contentType, in Envoy's 16 KiB pieces.
func generateThroughGateway(t *testing.T, f *testFleet, body, contentType, answer string) {
	t.Helper()
	s, _ := routeGenerate(t, picker(t, f), "/generate", body)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200", "content-type", contentType)}})
	recv(t, s)
	for i := 0; i < len(answer); i += 16 << 10 {
		end := min(i+16<<10, len(answer))
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(answer[i:end]), EndOfStream: end == len(answer)}}})
		recv(t, s)
	}
}

// The gateway's model rename (x-llm-d-model-name-rewrite, or its older
// name): the request is routed to a replica that serves the new name and
// its body goes on with it, buffered or in full duplex; the protocol's SLO
// headers are read as gorgo's own.
func TestGatewayRenamesTheModel(t *testing.T) {
	f := newFleet(t, admit.Config{})
	for id, name := range map[string]string{"a": "base", "b": "tuned"} {
		set, err := models.NewSet([]models.Model{{ID: name}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.core.Router().SetModels(id, set); err != nil {
			t.Fatal(err)
		}
	}
	body := `{"model":"base","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`
	for _, c := range []struct {
		header string
		mode   filterv3.ProcessingMode_BodySendMode
	}{{RenameHeader, filterv3.ProcessingMode_BUFFERED}, {OldRenameHeader, filterv3.ProcessingMode_BUFFERED}, {RenameHeader, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}} {
		s, _ := picker(t, f).Process(context.Background())
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false, c.header, "tuned")},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: c.mode, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
		if c.mode == filterv3.ProcessingMode_BUFFERED {
			recv(t, s)
		}
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}})
		r := recv(t, s)
		if h, _ := destination(t, r); h != "10.0.0.2:8000" {
			t.Errorf("%s, %v: routed to %q, want the replica serving the new name", c.header, c.mode, h)
		}
		sent := r.GetRequestBody().GetResponse().GetBodyMutation().GetBody()
		if c.mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			sent = recv(t, s).GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()
		}
		if want := strings.Replace(body, `"base"`, `"tuned"`, 1); string(sent) != want {
			t.Errorf("%s, %v: the body went on as %s", c.header, c.mode, sent)
		}
		s.CloseSend()
	}
}

// The protocol's SLO headers are read as gorgo's own, which win where both
// are given: an ask out of the tenant's bounds is refused either way.
func TestProtocolSLOHeaders(t *testing.T) {
	ts, err := tenant.New(map[string]tenant.Config{"default": {TTFTSLO: time.Second}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := newTenantFleet(t, admit.Config{}, nil, ts)
	for _, c := range []struct {
		kv      []string
		refused bool
	}{
		{[]string{TTFTSLOHeader, "5"}, true},
		{[]string{OldTTFTSLOHeader, "5"}, true},
		{[]string{"x-gorgo-ttft-slo-ms", "2000", TTFTSLOHeader, "5"}, false},
		{[]string{TTFTSLOHeader, "2000"}, false},
	} {
		s, _ := picker(t, f).Process(context.Background())
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false, c.kv...)}})
		recv(t, s)
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody), EndOfStream: true}}})
		imm := recv(t, s).GetImmediateResponse()
		if got := imm.GetStatus().GetCode() == 400; got != c.refused {
			t.Errorf("%v: answered %v, want refused %v", c.kv, imm, c.refused)
		}
		s.CloseSend()
	}
}

// The gateway's rename where the picker cannot rewrite the body (Envoy
// streams it, or sends none, and the route is fixed at the headers): a
// 400 that says why, not the client's model sent to a replica chosen for
// the new one (a review, 2026-12-07).
func TestGatewayRenameNeedsTheWholeBody(t *testing.T) {
	f := newFleet(t, admit.Config{})
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_NONE} {
		s, _ := picker(t, f).Process(context.Background())
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false, RenameHeader, "tuned")},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
		if imm := recv(t, s).GetImmediateResponse(); imm.GetStatus().GetCode() != 400 || !strings.Contains(string(imm.GetBody()), "whole body") {
			t.Errorf("%v: %v, want a 400", mode, imm)
		}
		s.CloseSend()
	}
}
