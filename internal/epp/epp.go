// Package epp is gorgo as an endpoint picker for Envoy-based gateways: the
// Gateway API Inference Extension's Endpoint Picker protocol, over Envoy's
// ext_proc gRPC service (envoy.service.ext_proc.v3.ExternalProcessor).
// For each HTTP request the gateway streams to it, the picker reads the
// headers and the body, builds the request with the same lifecycle as
// gorgo serve, decides, and tells the gateway where to send it: the
// x-gateway-destination-endpoint header and the envoy.lb dynamic metadata
// entry, both the same comma-separated list (protocol v0.4.0 on): the
// chosen ip:port, then the ranked fallbacks. It honours the subset of endpoints the
// gateway passes in envoy.lb.subset_hint, answers 503 when no endpoint is
// available and 429 when admission sheds. It observes the response when
// the gateway sends it (status, streamed SSE events: first token, usage,
// end), so the ledger, the prefix index's self-correction, the ITL model
// and the online tuner work as in gorgo serve.
package epp

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gorgo-llm/gorgo/internal/lifecycle"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// The protocol's names.
const (
	// DestinationHeader carries the chosen endpoint (ip:port).
	DestinationHeader = "x-gateway-destination-endpoint"
	// LBNamespace is the dynamic metadata namespace of the destination.
	LBNamespace = "envoy.lb"
	// SubsetNamespace and SubsetKey are where the gateway puts the subset of
	// endpoints the picker must choose from.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// ServedKey (in LBNamespace of the response's metadata, protocol
	// v1.0.0) names the endpoint that actually served the request.
	ServedKey = "x-gateway-destination-endpoint-served"
	// SessionHeader is gorgo's session header (as in gorgo serve).
	SessionHeader = "x-session-id"
	// bodyChunk is the largest body piece sent back in full-duplex mode
	// (as the reference picker does).
	bodyChunk = 62000
	// maxTail is how much of a non-streamed answer is kept to read its
	// usage from (the usage comes last), and the longest SSE event read.
	maxTail = 64 << 10
)

// Fleet is what the picker needs of a gorgo router: its lifecycle core and
// the address of each replica (proxy.Server provides both).
type Fleet interface {
	Core() *lifecycle.Core
	Endpoint(id string) (string, bool)
	EndpointIDs() map[string]string
}

// Server is the endpoint picker.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	fleet Fleet
	// MaxBodyBytes bounds a request body (default 8 MiB).
	MaxBodyBytes int
	// Fallbacks is how many ranked fallbacks follow the chosen endpoint in
	// the answer (default 0: the chosen endpoint alone, which Envoy's
	// ORIGINAL_DST cluster needs: it reads the header as one address).
	Fallbacks int
}

// New returns a picker over the fleet.
func New(f Fleet) *Server { return &Server{fleet: f, MaxBodyBytes: 8 << 20} }

// exchange is one HTTP request's life on the stream.
type exchange struct {
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer
	duplex bool // request body in FULL_DUPLEX_STREAMED mode
	// respDuplex: response body in FULL_DUPLEX_STREAMED mode (Envoy says
	// so on the stream's first message only).
	respDuplex bool
	path       string
	session    string
	subset     []string
	body       []byte
	req        *lifecycle.Request
	decided    bool
	status     int
	answered   bool // the response's end was seen
	sse        []byte
	scratch    []byte
	done       bool
	received   time.Time
}

// Process serves one ext_proc stream: one HTTP request, from its headers
// to the end of its response (or as far as the gateway sends it).
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := &exchange{s: s, stream: stream}
	defer x.end(nil)
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		if err := x.handle(msg); err != nil {
			return err
		}
	}
}

func (x *exchange) handle(msg *extprocv3.ProcessingRequest) error {
	switch r := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		x.received = time.Now()
		if pc := msg.GetProtocolConfig(); pc != nil {
			x.duplex = pc.GetRequestBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
			x.respDuplex = pc.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		for _, h := range r.RequestHeaders.GetHeaders().GetHeaders() {
			v := h.GetValue()
			if v == "" {
				v = string(h.GetRawValue())
			}
			switch strings.ToLower(h.GetKey()) {
			case ":path":
				x.path = v
			case SessionHeader:
				x.session = v
			}
		}
		x.subset = subset(msg.GetMetadataContext())
		if r.RequestHeaders.GetEndOfStream() {
			return x.decide(true) // no body: route by load
		}
		if x.duplex {
			return nil // the headers' answer waits for the body
		}
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}})
	case *extprocv3.ProcessingRequest_RequestBody:
		x.body = append(x.body, r.RequestBody.GetBody()...)
		if len(x.body) > x.s.MaxBodyBytes {
			return x.immediate(http.StatusRequestEntityTooLarge, "BadRequestError", "the request body is larger than "+strconv.Itoa(x.s.MaxBodyBytes)+" bytes")
		}
		if !r.RequestBody.GetEndOfStream() {
			if x.duplex {
				return nil // gathered; answered whole at the end
			}
			// Buffered-partial or streamed: the body is not whole, so it
			// cannot be read; route by load (a streamed body's route is
			// fixed at the headers anyway: use buffered or full duplex).
			return x.decide(true)
		}
		return x.decide(false)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if x.duplex && !x.decided {
			// The body ended without end_of_stream: the trailers end it.
			if err := x.decide(false); err != nil {
				return err
			}
		}
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		x.served(msg.GetMetadataContext())
		for _, h := range r.ResponseHeaders.GetHeaders().GetHeaders() {
			if h.GetKey() == ":status" {
				v := h.GetValue()
				if v == "" {
					v = string(h.GetRawValue())
				}
				x.status, _ = strconv.Atoi(v)
			}
		}
		if x.req != nil {
			if x.status == http.StatusOK {
				x.req.Accepted()
			}
		}
		if r.ResponseHeaders.GetEndOfStream() {
			x.answered = true
			x.end(nil)
		}
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
			ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}})
	case *extprocv3.ProcessingRequest_ResponseBody:
		body, eos := r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream()
		x.observe(body, eos)
		resp := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}
		if x.respDuplex {
			resp.Response.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos}}}
		}
		if err := x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: resp}}); err != nil {
			return err
		}
		if eos {
			x.answered = true
			x.end(nil)
		}
		return nil
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.answered = true
		x.end(nil)
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return nil
}

// kind is what the path says the body is.
func kind(path string) lifecycle.Kind {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return lifecycle.Chat
	case strings.HasSuffix(path, "/completions"):
		return lifecycle.Completion
	case strings.HasSuffix(path, "/embeddings"), strings.HasSuffix(path, "/responses"):
		return lifecycle.Input
	}
	return lifecycle.Opaque
}

// decide picks the endpoint and answers the gateway: at the headers
// (atHeaders: no body, or the body is not sent) or at the body.
func (x *exchange) decide(atHeaders bool) error {
	if x.decided {
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}})
	}
	x.decided = true
	core := x.s.fleet.Core()
	k := kind(x.path)
	if atHeaders {
		k = lifecycle.Opaque
	}
	req, perr := core.Begin(x.body, k, x.session, x.received)
	if perr != nil {
		core.Metrics.Refused(perr.Status)
		return x.immediate(perr.Status, perr.Type, perr.Message)
	}
	if x.subset != nil { // an empty subset leaves nothing eligible: 503
		ids := x.s.fleet.EndpointIDs()
		allowed := map[string]bool{}
		for _, ep := range x.subset {
			if id, ok := ids[ep]; ok {
				allowed[id] = true
			}
		}
		req.Route.Allowed = func(id string) bool { return allowed[id] }
	}
	if e, gone := req.Admit(x.stream.Context()); gone != nil {
		req.Abandon()
		return gone
	} else if e != nil {
		req.Reject(e)
		return x.immediate(e.Status, e.Type, e.Message, e.RetryAfter)
	}
	id, ok := req.Next()
	var ep string
	for ok {
		if ep, ok = x.s.fleet.Endpoint(id); ok {
			break
		}
		// Left the fleet since the decision: free it, try the next.
		req.Failed(&lifecycle.Error{Status: http.StatusServiceUnavailable, Type: "ServiceUnavailableError", Message: id + " left the fleet"}, false)
		id, ok = req.Next()
	}
	if !ok {
		e := req.Failure()
		if e.Status == http.StatusBadGateway || e.Status == 0 {
			e.Status = http.StatusServiceUnavailable
		}
		req.Reject(e)
		return x.immediate(http.StatusServiceUnavailable, "ServiceUnavailableError", "no endpoint available: "+e.Message)
	}
	x.req = req
	req.Sent(time.Now())
	// The ranked fallbacks after the choice: the header and the metadata
	// carry the same list (the protocol forbids them to differ).
	eps := []string{ep}
	for _, fb := range req.Fallbacks() {
		if len(eps) > x.s.Fallbacks {
			break
		}
		if a, ok := x.s.fleet.Endpoint(fb.ID); ok {
			eps = append(eps, a)
		}
	}
	list := strings.Join(eps, ",")
	common := &extprocv3.CommonResponse{
		HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
			Header: &corev3.HeaderValue{Key: DestinationHeader, RawValue: []byte(list)},
		}}},
		ClearRouteCache: true,
	}
	md, _ := structpb.NewStruct(map[string]any{LBNamespace: map[string]any{DestinationHeader: list}})
	if atHeaders && x.body != nil && !x.duplex {
		// A partial body (buffered-partial, streamed): the answer is the
		// body message's.
		return x.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: common}}})
	}
	if atHeaders || x.duplex {
		if err := x.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
			return err
		}
		if atHeaders {
			return nil
		}
		// Full duplex: the body goes on after the headers, in pieces.
		body := x.body
		for {
			n := min(len(body), bodyChunk)
			eos := n == len(body)
			if err := x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
					Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body[:n], EndOfStream: eos}}}}}}}); err != nil {
				return err
			}
			if eos {
				return nil
			}
			body = body[n:]
		}
	}
	return x.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: common}}})
}

// observe takes a piece of the response body: SSE events of a stream, or
// a whole JSON answer.
func (x *exchange) observe(body []byte, eos bool) {
	if x.req == nil || x.done {
		return
	}
	if !x.req.Stream() {
		// A whole JSON answer: keep its tail (the usage comes last), not
		// the whole of a large answer, and read it at the end.
		x.sse = append(x.sse, body...)
		if n := len(x.sse); n > maxTail {
			x.sse = x.sse[:copy(x.sse, x.sse[n-maxTail:])]
		}
		if eos {
			x.req.Complete(wire.PeekBody(x.sse))
			x.sse = x.sse[:0]
		}
		return
	}
	x.sse = append(x.sse, body...)
	now := time.Now()
	rest := x.sse
	for {
		ev, next, whole := wire.NextEvent(rest)
		if !whole {
			break
		}
		rest = next
		x.event(ev, now)
	}
	x.sse = x.sse[:copy(x.sse, rest)]
	if len(x.sse) > maxTail {
		x.sse = x.sse[:0] // no event is that long: not SSE, stop reading it
	}
	if eos {
		if len(x.sse) > 0 {
			x.event(x.sse, now)
		}
		x.sse = x.sse[:0]
	}
}

func (x *exchange) event(ev []byte, at time.Time) {
	data := wire.EventData(ev, &x.scratch)
	if len(data) == 0 {
		return
	}
	if wire.IsDone(data) {
		x.req.Done()
		return
	}
	p := wire.PeekChunk(data)
	x.req.Chunk(&p, at)
}

// end closes the request's life once: with what was observed of the
// answer. A gateway that sends no response events leaves the picker
// knowing only that the stream ended: the request is counted as served.
func (x *exchange) end(err error) {
	if x.req == nil || x.done {
		return
	}
	x.done = true
	st := x.status
	out := lifecycle.Outcome{Status: st, Err: err}
	switch {
	case st == 0:
		out.Status = http.StatusOK // no response events: not observed
		x.req.Done()
	case !x.answered:
		out.ClientGone = true // the stream ended mid-answer
	}
	x.req.End(out, time.Now())
	x.req = nil
}

// immediate answers the client directly (an error in OpenAI's shape).
func (x *exchange) immediate(code int, typ, msg string, retryAfter ...string) error {
	body := `{"error":{"message":` + strconv.Quote(msg) + `,"type":` + strconv.Quote(typ) + `,"code":` + strconv.Itoa(code) + `}}`
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
		Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}}}}
	if len(retryAfter) > 0 && retryAfter[0] != "" {
		hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "retry-after", RawValue: []byte(retryAfter[0])}})
	}
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode(code)}, Headers: hm, Body: []byte(body), Details: msg}}})
}

func (x *exchange) send(r *extprocv3.ProcessingResponse) error { return x.stream.Send(r) }

// served moves the request to the endpoint that served it, when the
// gateway says it fell back to another one of the list: the attempts
// before it failed.
func (x *exchange) served(md *corev3.Metadata) {
	if x.req == nil {
		return
	}
	ep := md.GetFilterMetadata()[LBNamespace].GetFields()[ServedKey].GetStringValue()
	if ep == "" {
		return
	}
	id, ok := x.s.fleet.EndpointIDs()[ep]
	if !ok || id == x.req.Replica() {
		return
	}
	for id != x.req.Replica() {
		x.req.Failed(&lifecycle.Error{Status: http.StatusBadGateway, Type: "APIError", Message: "the gateway fell back"}, true)
		if _, ok := x.req.Next(); !ok {
			x.req.Reject(x.req.Failure())
			x.req, x.done = nil, true
			return
		}
	}
	x.req.Sent(time.Now())
}

// subset reads the gateway's subset hint from the request metadata.
func subset(md *corev3.Metadata) []string {
	st := md.GetFilterMetadata()[SubsetNamespace]
	if st == nil {
		return nil
	}
	v := st.GetFields()[SubsetKey]
	if v == nil {
		return nil
	}
	var out []string
	if s := v.GetStringValue(); s != "" { // a comma-separated string, as some gateways send
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
		return out
	}
	for _, e := range v.GetListValue().GetValues() {
		if s := e.GetStringValue(); s != "" {
			out = append(out, s)
		}
	}
	if out == nil && v.GetListValue() != nil {
		return []string{} // an empty list: nothing is eligible
	}
	return out
}
