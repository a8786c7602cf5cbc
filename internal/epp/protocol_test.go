package epp

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/lifecycle"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/tenant"
)

// testFleet is a router over replicas a (10 ms away) and b (50 ms), at
// 10.0.0.1:8000 and 10.0.0.2:8000.
type testFleet struct {
	core *lifecycle.Core
	eps  map[string]string
}

func (f *testFleet) Core() *lifecycle.Core { return f.core }
func (f *testFleet) Endpoint(id string) (string, bool) {
	ep, ok := f.eps[id]
	return ep, ok
}
func (f *testFleet) EndpointIDs() map[string]string {
	out := map[string]string{}
	for id, ep := range f.eps {
		out[ep] = id
	}
	return out
}

func newFleet(t testing.TB, adm admit.Config) *testFleet { return newTappedFleet(t, adm, nil) }

// newTappedFleet is newFleet whose requests a tap hears of.
func newTappedFleet(t testing.TB, adm admit.Config, tap lifecycle.Tap) *testFleet {
	return newTenantFleet(t, adm, tap, nil)
}

// newTenantFleet is newTappedFleet with tenants.
func newTenantFleet(t testing.TB, adm admit.Config, tap lifecycle.Tap, ts *tenant.Set) *testFleet {
	t.Helper()
	p, _ := policy.New(policy.DefaultName, policy.Options{})
	rt, err := router.New(router.Config{Policy: p, BlockTokens: 16, TieMargin: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"a", "b"} {
		rt.Add(router.ReplicaConfig{ID: id, KVCapacityTokens: 1 << 20, PrefillMSPerToken: 0.06, QueueMSPerToken: 0.06})
		rt.ObserveRTT(id, time.Duration(10+40*i)*time.Millisecond)
	}
	core := lifecycle.NewCore(lifecycle.Config{Router: rt, BlockTokens: 16, MaxAttempts: 2, Start: time.Now(), Seed: 1, Admission: adm, Tap: tap, Tenants: ts})
	if adm.SLO > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go core.RunAdmission(ctx)
	}
	return &testFleet{core: core, eps: map[string]string{"a": "10.0.0.1:8000", "b": "10.0.0.2:8000"}}
}

// picker serves the fleet's picker on loopback and returns a client.
func picker(t testing.TB, f Fleet) extprocv3.ExternalProcessorClient {
	t.Helper()
	pk := New(f, nil)
	pk.Fallbacks = 2 // the tests check the list; the default sends the choice alone
	return servePicker(t, pk)
}

// servePicker serves pk on loopback and returns a client.
func servePicker(t testing.TB, pk *Server) extprocv3.ExternalProcessorClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, pk)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return extprocv3.NewExternalProcessorClient(conn)
}

func headers(path string, eos bool, kv ...string) *extprocv3.HttpHeaders {
	h := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte(path)}, {Key: ":method", RawValue: []byte("POST")}}}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Headers = append(h.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.HttpHeaders{Headers: h, EndOfStream: eos}
}

const chatBody = `{"model":"m","stream":true,"messages":[{"role":"user","content":"where should this go? a question long enough for a few blocks"}]}`

// destination reads the endpoint header and the metadata of a response.
func destination(t *testing.T, r *extprocv3.ProcessingResponse) (header, metadata string) {
	t.Helper()
	var common *extprocv3.CommonResponse
	switch v := r.Response.(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		common = v.RequestHeaders.GetResponse()
	case *extprocv3.ProcessingResponse_RequestBody:
		common = v.RequestBody.GetResponse()
	default:
		t.Fatalf("answer %T, want the request's headers or body", r.Response)
	}
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == DestinationHeader {
			header = string(h.GetHeader().GetRawValue())
		}
	}
	if !common.GetClearRouteCache() {
		t.Error("the route cache is not cleared")
	}
	metadata = r.GetDynamicMetadata().GetFields()[LBNamespace].GetStructValue().GetFields()[DestinationHeader].GetStringValue()
	return header, metadata
}

// routeChat sends a chat request's headers (buffered body mode, with kv
// as extra headers) and its body, and returns the answer to the body: the
// picker's decision.
func routeChat(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient, kv ...string) *extprocv3.ProcessingResponse {
	t.Helper()
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false, kv...)},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody), EndOfStream: true}}})
	return recv(t, s)
}

func recv(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient) *extprocv3.ProcessingResponse {
	t.Helper()
	r, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A buffered chat request: the picker continues the headers, answers the
// body with the nearest replica and the fallback, and the response events
// feed the router: first token, then the ledger freed at the end.
func TestBufferedChatAndResponseEvents(t *testing.T) {
	f := newFleet(t, admit.Config{})
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	send := func(r *extprocv3.ProcessingRequest) {
		if err := s.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false, "x-session-id", "s1")},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
	if _, ok := recv(t, s).Response.(*extprocv3.ProcessingResponse_RequestHeaders); !ok {
		t.Fatal("the headers were not continued")
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody), EndOfStream: true}}})
	h, md := destination(t, recv(t, s))
	// The header and the metadata carry the same list: the choice, then
	// the fallback.
	if h != "10.0.0.1:8000,10.0.0.2:8000" || md != h {
		t.Fatalf("destination %q, metadata %q", h, md)
	}
	rt := f.core.Router()
	if st, _ := rt.Replica("a"); st.InFlight != 1 {
		t.Fatalf("a has %d in flight", st.InFlight)
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
	recv(t, s)
	events := "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n"
	cut := strings.Index(events, "\n\n") + 10 // the first event and a piece of the second
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(events[:cut])}}})
	recv(t, s)
	if st, _ := rt.Replica("a"); st.Decoding != 1 {
		t.Fatalf("the first token was not recorded: %+v", st)
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(events[cut:]), EndOfStream: true}}})
	recv(t, s)
	if st, _ := rt.Replica("a"); st.InFlight != 0 || st.Decoding != 0 || st.IndexBlocks == 0 {
		t.Fatalf("after the end: %+v", st)
	}
	if e := rt.ExpectedOutput(&policy.Request{}); e >= router.DefaultOutputTokens {
		t.Errorf("the answer's length was not learned: %d", e)
	}
	s.CloseSend()
}

// Full duplex: the headers' answer waits for the body, then the body goes
// on whole. The subset hint restricts the choice; an empty subset is a
// 503; a completion request too.
func TestDuplexSubsetAnd503(t *testing.T) {
	f := newFleet(t, admit.Config{})
	c := picker(t, f)
	run := func(sub []string, path string) *extprocv3.ProcessingResponse {
		t.Helper()
		s, err := c.Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer s.CloseSend()
		req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers(path, false)},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}}
		if sub != nil {
			vals := make([]any, len(sub))
			for i, v := range sub {
				vals[i] = v
			}
			st, _ := structpb.NewStruct(map[string]any{SubsetKey: vals})
			req.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: st}}
		}
		s.Send(req)
		body := `{"model":"m","prompt":"complete this sentence, please, for a test` + strings.Repeat(" and more", 20000) + `","max_tokens":4}`
		if strings.Contains(path, "chat") {
			body = chatBody
		}
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body[:10])}}})
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body[10:]), EndOfStream: true}}})
		first := recv(t, s)
		if _, imm := first.Response.(*extprocv3.ProcessingResponse_ImmediateResponse); imm {
			return first
		}
		var back []byte
		for {
			got := recv(t, s).GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if len(got.GetBody()) > bodyChunk {
				t.Fatalf("a body piece of %d bytes", len(got.GetBody()))
			}
			back = append(back, got.GetBody()...)
			if got.GetEndOfStream() {
				break
			}
		}
		if string(back) != body {
			t.Fatalf("the body did not go on whole: %d of %d bytes", len(back), len(body))
		}
		return first
	}
	if h, _ := destination(t, run([]string{"10.0.0.2:8000"}, "/v1/completions")); h != "10.0.0.2:8000" {
		t.Errorf("subset {b}: chose %s", h)
	}
	if h, md := destination(t, run(nil, "/v1/chat/completions")); h != "10.0.0.1:8000,10.0.0.2:8000" || md != h {
		t.Errorf("no subset: %s %s", h, md)
	}
	for _, sub := range [][]string{{}, {"10.9.9.9:1"}} {
		r := run(sub, "/v1/chat/completions")
		imm := r.GetImmediateResponse()
		if imm == nil || imm.GetStatus().GetCode() != 503 || !strings.Contains(string(imm.GetBody()), "ServiceUnavailableError") {
			t.Errorf("subset %v: %v", sub, r)
		}
	}
	// The requests the stream ended on without response events are ended.
	deadline := time.Now().Add(10 * time.Second)
	for _, id := range []string{"a", "b"} {
		for {
			st, _ := f.core.Router().Replica(id)
			if st.InFlight == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d in flight after the streams ended", id, st.InFlight)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// Admission sheds with a 429 and Retry-After where the fleet's load would
// make a request miss its SLO; one that would miss it on an idle replica
// is refused with a 400 (retrying cannot help it).
func TestShedsWith429(t *testing.T) {
	a := admit.Config{SLO: 100 * time.Millisecond, Mode: admit.ModeReject}
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, a)
	rt := f.core.Router()
	for _, id := range []string{"a", "b"} {
		// Each prompt in flight holds the next back by 10 ms a token.
		if err := rt.Reconfigure(router.ReplicaConfig{ID: id, KVCapacityTokens: 1 << 20, PrefillMSPerToken: 0.06, QueueMSPerToken: 10}); err != nil {
			t.Fatal(err)
		}
	}
	c := picker(t, f)
	send := func(body string) *extprocv3.ProcessingResponse {
		t.Helper()
		s, err := c.Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false)}})
		recv(t, s)
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}})
		return recv(t, s) // the stream stays open: its request in flight
	}
	status := func(r *extprocv3.ProcessingResponse) (code int, retry string) {
		imm := r.GetImmediateResponse()
		for _, h := range imm.GetHeaders().GetSetHeaders() {
			if h.GetHeader().GetKey() == "retry-after" {
				retry = string(h.GetHeader().GetRawValue())
			}
		}
		return int(imm.GetStatus().GetCode()), retry
	}
	// One request in flight at each replica, then one that would wait
	// behind either.
	for range 2 {
		if code, _ := status(send(chatBody)); code != 0 {
			t.Fatalf("a request to an idle replica refused: %d", code)
		}
	}
	if code, retry := status(send(chatBody)); code != 429 || retry == "" {
		t.Fatalf("shedding: %d (retry-after %q)", code, retry)
	}
	long := strings.Replace(chatBody, "where should", strings.Repeat("far too long a prompt ", 1000)+"where should", 1)
	if code, retry := status(send(long)); code != 400 || retry != "" {
		t.Fatalf("a prompt too long for the SLO on an idle replica: %d (retry-after %q)", code, retry)
	}
}

// BenchmarkPick is the picker's added time per request as the gateway sees
// it: one ext_proc stream over loopback gRPC, the request's headers and a
// buffered chat body sent, the destination answered, the stream closed.
func BenchmarkPick(b *testing.B) {
	f := newFleet(b, admit.Config{})
	c := picker(b, f)
	hdr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false)},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}}
	body := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody), EndOfStream: true}}}
	b.ReportAllocs()
	for b.Loop() {
		s, err := c.Process(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		s.Send(hdr)
		if _, err := s.Recv(); err != nil {
			b.Fatal(err)
		}
		s.Send(body)
		if _, err := s.Recv(); err != nil {
			b.Fatal(err)
		}
		s.CloseSend()
		s.Recv() // the server's end of the stream
	}
}

// The gateway fell back to the second endpoint of the list: the request
// moves to that replica's ledger.
func TestServedByTheFallback(t *testing.T) {
	f := newFleet(t, admit.Config{})
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false)},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody), EndOfStream: true}}})
	recv(t, s)
	served, _ := structpb.NewStruct(map[string]any{ServedKey: "10.0.0.2:8000"})
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{LBNamespace: served}}})
	recv(t, s)
	a, _ := f.core.Router().Replica("a")
	b, _ := f.core.Router().Replica("b")
	if a.InFlight != 0 || b.InFlight != 1 {
		t.Fatalf("after the fallback: a %d, b %d in flight", a.InFlight, b.InFlight)
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: [DONE]\n\n"), EndOfStream: true}}})
	// Full-duplex responses: each piece goes back as it came.
	echo := recv(t, s).GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if string(echo.GetBody()) != "data: [DONE]\n\n" || !echo.GetEndOfStream() {
		t.Errorf("the response body was not sent back: %v", echo)
	}
	if b, _ := f.core.Router().Replica("b"); b.InFlight != 0 {
		t.Errorf("b keeps %d in flight", b.InFlight)
	}
}

// A request naming its tenant is refused unless the picker is told the
// gateway sets that header (found in review: any client could pick one).
func TestTenantHeaderRefusedByDefault(t *testing.T) {
	f := newFleet(t, admit.Config{})
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false, "x-gorgo-tenant", "vip")}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody), EndOfStream: true}}})
	imm := recv(t, s).GetImmediateResponse()
	if imm.GetStatus().GetCode() != 400 || !strings.Contains(string(imm.GetBody()), "tenant") {
		t.Fatalf("a client's tenant header: %v", imm)
	}
}

// A tenant's budget reaches the client on the answer's headers, as gorgo
// serve's does.
func TestBudgetHeadersOnTheAnswer(t *testing.T) {
	ts, err := tenant.New(map[string]tenant.Config{"default": {TokensPerMinute: 100000}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := newTenantFleet(t, admit.Config{}, nil, ts)
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	routeChat(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
	got := map[string]string{}
	for _, h := range recv(t, s).GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		got[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	if got["x-ratelimit-limit-tokens"] != "100000" || got["x-ratelimit-remaining-tokens"] == "" {
		t.Errorf("the answer's header mutation: %v", got)
	}
	s.CloseSend()
}

// When Envoy says it sends no response body, the picker will see no first
// token: the router releases the request's prefill backlog when its first
// token is due, not when the stream ends.
func TestNoResponseBodyReleasesTheBacklogWhenDue(t *testing.T) {
	f := newFleet(t, admit.Config{})
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false)},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_NONE}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody), EndOfStream: true}}})
	ep, _ := destination(t, recv(t, s))
	id, ok := f.EndpointIDs()[strings.Split(ep, ",")[0]] // the chosen one, then the fallbacks
	if !ok {
		t.Fatalf("destination %q", ep)
	}
	rt := f.core.Router()
	if st, _ := rt.Replica(id); st.InFlight != 1 || st.BacklogTokens == 0 {
		t.Fatalf("after the decision: %+v", st)
	}
	// An hour later (router time) its first token is long due.
	if _, err := rt.Predict(time.Hour, &policy.Request{PromptTokens: 10}); err != nil {
		t.Fatal(err)
	}
	if st, _ := rt.Replica(id); st.InFlight != 1 || st.BacklogTokens != 0 {
		t.Errorf("once its first token was due: %+v", st)
	}
	s.CloseSend()
}

// A replica's 503 (or 429), which the gateway relays, has later picks pass
// it over for its Retry-After, as the proxy's do (2026-12-05: the picker
// kept choosing it, each request a 503).
func TestBusyAnswerIsPassedOver(t *testing.T) {
	f := newFleet(t, admit.Config{})
	c := picker(t, f)
	pick := func() string {
		s, err := c.Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		list, _ := destination(t, routeChat(t, s))
		ep, _, _ := strings.Cut(list, ",") // the choice, then the fallbacks
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", true, ":status", "503", "retry-after", "20")}})
		recv(t, s)
		s.CloseSend()
		return ep
	}
	first := pick()
	id := map[string]string{"10.0.0.1:8000": "a", "10.0.0.2:8000": "b"}[first]
	if st, _ := f.core.Router().Replica(id); st.BusyUntil == 0 {
		t.Fatalf("%s answered 503 with Retry-After 20: not marked busy", id)
	}
	if second := pick(); second == first {
		t.Errorf("picked %s again, busy for 20 s", second)
	}
}
