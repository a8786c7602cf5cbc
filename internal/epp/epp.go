// Package epp is gorgo as an endpoint picker for Envoy-based gateways: the
// Gateway API Inference Extension's Endpoint Picker protocol, over Envoy's
// ext_proc gRPC service (envoy.service.ext_proc.v3.ExternalProcessor).
// For each HTTP request the gateway streams to it, the picker reads the
// headers and the body, and the same lifecycle as gorgo serve's drives the
// rest (lifecycle.Core.Serve): the picker's part of an attempt is to tell
// the gateway where to send the request, in the
// x-gateway-destination-endpoint header and the envoy.lb dynamic metadata
// entry, both the same comma-separated list (protocol v0.4.0 on): the
// chosen ip:port, then the ranked fallbacks. It honours the subset of
// endpoints the gateway passes in envoy.lb.subset_hint, answers 503 when no
// endpoint is available and 429 when admission sheds. It observes the
// response when the gateway sends it (status, streamed SSE events: first
// token, usage, end), so the ledger, the prefix index's self-correction,
// the ITL model and the online tuner work as in gorgo serve.
package epp

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/httpapi"
	"github.com/gorgo-llm/gorgo/internal/lifecycle"
	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/tenant"
	"github.com/gorgo-llm/gorgo/internal/tracing"
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
	// RenameHeader (and its older name, OldRenameHeader) is the model a
	// gateway (its authorisation, an adapter's selection) has the picker
	// send the request to the model server as, in the body's "model".
	RenameHeader    = "x-llm-d-model-name-rewrite"
	OldRenameHeader = "x-gateway-model-name-rewrite"
	// The protocol's per-request SLO headers (and their older names),
	// read as gorgo's own X-Gorgo-Ttft-Slo-Ms and X-Gorgo-Tpot-Slo-Ms
	// where those are not given.
	TTFTSLOHeader, OldTTFTSLOHeader = "x-llm-d-slo-ttft-ms", "x-slo-ttft-ms"
	TPOTSLOHeader, OldTPOTSLOHeader = "x-llm-d-slo-tpot-ms", "x-slo-tpot-ms"
	// bodyChunk is the largest body piece sent back in full-duplex mode
	// (as the reference picker does).
	bodyChunk = 62000
	// maxTail is how much of a non-streamed answer is kept to read its
	// usage from (the usage comes last), and the longest SSE event read.
	maxTail = 64 << 10
	// headBytes is how much of a whole answer's head is gathered to read
	// a stored response's id (vLLM's comes first, its object after the
	// echoed instructions).
	headBytes = 4 << 10
)

// Fleet is what the picker needs of a gorgo router: its lifecycle core and
// the address of each replica (a *fleet.Fleet provides both).
type Fleet interface {
	Core() *lifecycle.Core
	Endpoint(id string) (string, bool)
	EndpointIDs() map[string]string
}

// Operator is what a Fleet that sends the engines' operations to every
// replica offers (a *fleet.Fleet does): a gateway would send SGLang's
// /flush_cache or /abort_request, or an adapter's load, to the one
// endpoint the picker names, so the picker sends it to each replica
// itself and answers the gateway with their verdict.
type Operator interface {
	Operate(ctx context.Context, op fleet.Operation) (*fleet.OperationAnswer, *wire.Error)
}

// Watcher is what a Fleet that judges its replicas' stalls offers (a
// *fleet.Fleet does): the picker registers each request it routes with
// its replica until its answer begins, so that a replica that passes its
// health checks and has stopped serving is ejected, and picked no more
// (fleet.Upstream.Watch). The gateway holds the request itself: the
// ejection cannot cut it.
type Watcher interface {
	Upstream(id string) *fleet.Upstream
}

// Server is the endpoint picker.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	fleet Fleet
	// Fallbacks is how many ranked fallbacks follow the chosen endpoint in
	// the answer (default 0: the chosen endpoint alone, which Envoy's
	// ORIGINAL_DST cluster needs: it reads the header as one address).
	Fallbacks int
	// Assume is the protocol configuration taken for a stream that
	// carries none (Envoy before 1.34, a data plane that does not send
	// it); nil: request bodies buffered, responses streamed, and a stream
	// that ends before its response's headers counted as served (the
	// gateway may send no response events).
	Assume   *extprocv3.ProtocolConfiguration
	settings atomic.Pointer[Settings]
	bodies   httpapi.Budget // the request bodies being gathered and served
	refused  *prometheus.CounterVec
}

// Settings are what of the router's config the picker follows; a reload
// changes them (SetSettings).
type Settings struct {
	// TenantHeader is what the picker does with a request's
	// X-Gorgo-Tenant, as gorgo serve's tenant_header: "refuse" it with a
	// 400 (the default: the gateway must strip a client's, or set it and
	// say trust), "ignore" it, or "trust" it.
	TenantHeader tenant.HeaderRule
	// RefuseOperations answers the engines' operations 403, as gorgo
	// serve's engine_operations: refuse (a fleet shared by tenants).
	RefuseOperations bool
	// OperationWait and WeightsWait bound an operation's fan-out, and one
	// that moves weights (an adapter's load, new weights, a sleep: default
	// 30 s and 5 min, gorgo serve's header_timeout and first_byte_timeout).
	OperationWait, WeightsWait time.Duration
	// MaxBodyBytes bounds a request body (default 8 MiB), and
	// MaxBodyBytesInFlight the bodies being gathered and served together
	// (not positive: no bound): gorgo serve's max_body_bytes and
	// max_body_bytes_in_flight. Past either the request is refused, a 413
	// or a 503 with Retry-After.
	MaxBodyBytes, MaxBodyBytesInFlight int64
}

// New returns a picker over the fleet; its own series (requests refused
// at a limit, as gorgo serve's gorgo_refused_total) are registered on reg
// (nil: not registered).
func New(f Fleet, reg prometheus.Registerer) *Server {
	s := &Server{fleet: f, refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_refused_total",
		Help: "Requests refused at once because the picker was at a limit (max_body_bytes_in_flight)."}, []string{"limit"})}
	if reg != nil {
		reg.MustRegister(s.refused)
	}
	s.SetSettings(Settings{})
	return s
}

// SetSettings makes set the picker's settings, from its next request on.
func (s *Server) SetSettings(set Settings) {
	if set.MaxBodyBytes <= 0 {
		set.MaxBodyBytes = 8 << 20
	}
	s.bodies.SetMax(set.MaxBodyBytesInFlight)
	s.settings.Store(&set)
}

// exchange is one HTTP request's life on the stream: the lifecycle's front
// end (lifecycle.FrontEnd) for it.
type exchange struct {
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer
	err    error // the stream broke (not an end or a cancel)
	closed bool  // the stream ended
	duplex bool  // request body in FULL_DUPLEX_STREAMED mode
	// unread: the request body does not reach the picker before the
	// route is fixed (NONE, STREAMED): it routes at the headers.
	unread bool
	// expect: the gateway said it sends the response's body, so a stream
	// that ends before any response event was left by its client (or
	// given up by the gateway); responding: a response event came.
	expect, responding bool
	// respDuplex: response body in FULL_DUPLEX_STREAMED mode (Envoy says
	// so on the stream's first message only); respNone: Envoy said it
	// sends no response body, so no first token will be seen.
	respDuplex, respNone bool
	path                 string
	method               string
	opHeader             http.Header // an engine operation's headers, for the replicas
	bodiless             bool        // its headers ended the request: it has no body
	cut                  bool        // a whole answer's start was let go: its tail is kept
	head                 bool        // a whole JSON answer's first bytes were read
	session              string
	requestID            string // the client's X-Request-Id (vLLM's engine's id of it)
	subset               []string
	body                 []byte
	// rename is the model the gateway has the body sent as (RenameHeader);
	// renamed: the body was so rewritten, and must go on as it is now.
	rename    string
	renamed   bool
	received  time.Time
	decided   bool
	atHeaders bool // decided at the headers: the body, if any, is not read
	trailers  bool // the request's trailers came with the decision: answer them after it
	// respLate: Envoy buffers the response body, so a stream's first
	// token is seen late (at its end, or once the buffer fills).
	respLate bool
	// traceparent and tracestate are the client's trace context, read
	// when the core traces requests.
	traceparent, tracestate string
	// tenant and ask are the request's tenant and what it asks for, from
	// the gateway's headers (the gateway authenticates its clients: its
	// X-Gorgo-Tenant is trusted).
	tenant string
	ask    tenant.Ask
	// replyHeaders are the tenant's x-ratelimit-* headers, sent with the
	// answer or the refusal.
	replyHeaders replyHeaders

	// The attempt: routed once the destination went to the gateway;
	// status, retryAfter and served from the response's headers (served:
	// the endpoint the gateway says it fell back to); unobserved when the
	// stream ended without response events.
	routed     bool
	status     int
	retryAfter string
	served     string
	servedEP   string // the endpoint the gateway says served it, known or not
	answered   bool   // the response's end was seen
	unobserved bool
	gone       bool // the stream ended before the response began, which the gateway said it would send
	// pending is the answer to the last response message, sent once the
	// lifecycle has taken that message in (so the gateway never sees an
	// answer before the router's state shows it).
	pending *extprocv3.ProcessingResponse
	sse     []byte
	scratch []byte
	// long says the stream is inside an event too long to hold, which the
	// lifecycle reads as it passes (lifecycle.Request.LongEventPart).
	long bool
	// watched ends the routed attempt's watch by its replica's stall
	// check (Watcher), saying whether its answer began; of is that
	// replica, whose progress each piece of a successful answer is; noCut
	// is what an ejection calls, which cannot reach the gateway.
	watched func(answered bool)
	of      *fleet.Upstream
	noCut   context.CancelCauseFunc
}

// Process serves one ext_proc stream: one HTTP request, from its headers
// to the end of its response (or as far as the gateway sends it).
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := &exchange{s: s, stream: stream}
	defer x.unwatch(false)
	defer func() { s.bodies.Give(cap(x.body)) }()
	for {
		msg := x.recv()
		if msg == nil {
			return x.err
		}
		if err := x.request(msg); err != nil {
			return err
		}
		if err := x.flush(); err != nil {
			return err
		}
	}
}

// recv returns the stream's next message, nil at its end (err set if it
// broke).
func (x *exchange) recv() *extprocv3.ProcessingRequest {
	if x.closed {
		return nil
	}
	msg, err := x.stream.Recv()
	if err != nil {
		x.closed = true
		if !errors.Is(err, io.EOF) && status.Code(err) != codes.Canceled {
			x.err = err
		}
		return nil
	}
	return msg
}

// request handles a message before the decision (and answers any after it
// that the lifecycle has no use for).
func (x *exchange) request(msg *extprocv3.ProcessingRequest) error {
	switch r := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if x.decided { // one request per stream: nothing more to decide
			return x.send(continueHeaders())
		}
		x.received = time.Now()
		pc := msg.GetProtocolConfig()
		if pc == nil {
			pc = x.s.Assume
		}
		if pc != nil {
			req, resp := pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
			x.duplex = req == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
			x.unread = req == filterv3.ProcessingMode_NONE || req == filterv3.ProcessingMode_STREAMED
			x.respDuplex = resp == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
			x.respNone = resp == filterv3.ProcessingMode_NONE
			x.respLate = resp == filterv3.ProcessingMode_BUFFERED || resp == filterv3.ProcessingMode_BUFFERED_PARTIAL
			x.expect = !x.respNone
		}
		traced := x.s.fleet.Core().Tracing()
		var ttft, tpot, ttftOld, tpotOld string // the protocol's SLO headers
		for _, h := range r.RequestHeaders.GetHeaders().GetHeaders() {
			switch key := strings.ToLower(h.GetKey()); {
			case key == ":path":
				x.path = value(h)
			case key == ":method":
				x.method = value(h)
			case key == SessionHeader:
				x.session = value(h)
			case key == "x-request-id":
				x.requestID = value(h)
			case key == tracing.TraceparentHeader && traced:
				x.traceparent = value(h)
			case key == tracing.TracestateHeader && traced:
				x.tracestate = value(h)
			case key == tenantHeader:
				x.tenant = value(h)
			case key == priorityHeader:
				x.ask.Priority = value(h)
			case key == ttftSLOHeader:
				x.ask.TTFTSLO = value(h)
			case key == tpotSLOHeader:
				x.ask.TPOTSLO = value(h)
			case key == RenameHeader, key == OldRenameHeader && x.rename == "":
				x.rename = value(h)
			case key == TTFTSLOHeader:
				ttft = value(h)
			case key == OldTTFTSLOHeader:
				ttftOld = value(h)
			case key == TPOTSLOHeader:
				tpot = value(h)
			case key == OldTPOTSLOHeader:
				tpotOld = value(h)
			}
		}
		x.ask.TTFTSLO = cmp.Or(x.ask.TTFTSLO, ttft, ttftOld)
		x.ask.TPOTSLO = cmp.Or(x.ask.TPOTSLO, tpot, tpotOld)
		x.subset = subset(msg.GetMetadataContext())
		x.bodiless = r.RequestHeaders.GetEndOfStream()
		if x.operation() {
			x.opHeader = operationHeader(r.RequestHeaders.GetHeaders().GetHeaders())
		}
		if r.RequestHeaders.GetEndOfStream() || x.unread {
			// No body, or none the picker sees before Envoy fixes the
			// route (it continues the headers at their answer): route
			// by load, the destination in the headers' answer.
			return x.decide(true)
		}
		if x.duplex {
			return nil // the headers' answer waits for the body
		}
		return x.send(continueHeaders())
	case *extprocv3.ProcessingRequest_RequestBody:
		if x.decided {
			return x.send(continueBody())
		}
		if e := x.gather(r.RequestBody.GetBody()); e != nil {
			x.s.fleet.Core().Refused(e, x.logID())
			x.decided = true
			return x.immediate(e)
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
			x.trailers = true
			return x.decide(false)
		}
		return x.send(continueTrailers())
	default:
		// A response message with no request in flight (refused, or
		// over), or before the response's headers (Envoy skips them).
		x.responding = true
		x.pending = continueResponse(msg, x.respDuplex)
	}
	return nil
}

// gather appends a piece of the request body to what came of it, or
// refuses the request: a body past max_body_bytes, or one that the
// bodies being served leave no room for. The body's buffer is taken from
// the picker's budget as it grows, before it grows (given back when the
// stream ends), and made to the size taken.
func (x *exchange) gather(piece []byte) *wire.Error {
	limit := x.s.settings.Load().MaxBodyBytes
	n := int64(len(x.body) + len(piece))
	if n > limit {
		return httpapi.BodyError(&http.MaxBytesError{Limit: limit})
	}
	if n > int64(cap(x.body)) {
		c := min(max(n, 2*int64(cap(x.body))), limit)
		if !x.s.bodies.Take(c - int64(cap(x.body))) {
			x.s.refused.WithLabelValues("max_body_bytes_in_flight").Inc()
			return httpapi.BodyError(httpapi.ErrBodyBudget)
		}
		b := make([]byte, len(x.body), c)
		copy(b, x.body)
		x.body = b
	}
	x.body = append(x.body, piece...)
	return nil
}

// operator reports whether the request's tenant may send the engines'
// operations where the picker refuses them to clients (its config's
// engine_operations: true).
func (x *exchange) operator(set *Settings) bool {
	name, err := set.TenantHeader.Name("", x.tenant)
	return err == nil && x.s.fleet.Core().Tenants().Operates(name)
}

// renameModel sets the body's model to the gateway's rename, in the
// body's own buffer (grown within the picker's budget, as gather grows
// it). A body that is not a JSON object is left as it is (the lifecycle
// refuses it).
func (x *exchange) renameModel() *wire.Error {
	if t := bytes.TrimSpace(x.body); len(t) == 0 || t[0] != '{' || !wire.ValidJSON(t) {
		return nil
	}
	renamed := prompt.WithModel(x.body, x.rename, nil)
	x.body = x.body[:0]
	if e := x.gather(renamed); e != nil {
		return e
	}
	x.renamed = true
	return nil
}

// logID is the request's x-request-id (the gateway's, as Envoy makes one)
// where it is one to log (httpapi.PrintableID), for the access log.
func (x *exchange) logID() string {
	if httpapi.PrintableID(x.requestID) {
		return x.requestID
	}
	return ""
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
	case path == "/generate":
		return lifecycle.Generate
	}
	return lifecycle.Opaque
}

// decide hands the request to the lifecycle: at the headers (atHeaders:
// no body, or one that is not read) or at the body's end. An engine
// operation with its whole body is the picker's to send to every replica.
func (x *exchange) decide(atHeaders bool) error {
	if x.opHeader != nil {
		if op, ok := x.s.fleet.(Operator); ok {
			x.decided = true
			return x.operate(op, !atHeaders || x.bodiless)
		}
	}
	x.decided, x.atHeaders = true, atHeaders
	name, err := x.s.settings.Load().TenantHeader.Name("", x.tenant)
	if err != nil {
		e := wire.Errorf(http.StatusBadRequest, "%v", err)
		x.s.fleet.Core().Refused(e, x.logID())
		return x.immediate(e)
	}
	switch {
	case x.rename != "" && atHeaders && !x.bodiless:
		// Its body is not the picker's to rewrite (it comes in pieces,
		// or not at all): sent on with the client's model, the replica
		// chosen for the new one would refuse it.
		e := wire.Errorf(http.StatusBadRequest, "the gateway renames the model to %q (%s), which the picker can do only to a whole body: use request_body_mode BUFFERED or FULL_DUPLEX_STREAMED", x.rename, RenameHeader)
		x.s.fleet.Core().Refused(e, x.logID())
		return x.immediate(e)
	case x.rename != "" && !atHeaders && prompt.Model(x.body) != x.rename:
		if e := x.renameModel(); e != nil {
			x.s.fleet.Core().Refused(e, x.logID())
			return x.immediate(e)
		}
	}
	in := lifecycle.Incoming{Body: x.body, Kind: kind(x.path), Session: x.session, RequestID: x.requestID, Received: x.received,
		Parent: tracing.Parent(x.traceparent, x.tracestate), Tenant: name, Ask: x.ask,
		Header: &x.replyHeaders, Unseen: x.respNone, Stored: wire.StoredID(x.path), Endpoint: x.path, GatewaySends: true, LogID: x.logID()}
	if i := strings.IndexByte(in.Endpoint, '?'); i >= 0 {
		in.Endpoint = in.Endpoint[:i]
	}
	if id, err := url.PathUnescape(in.Stored); err == nil {
		in.Stored = id // :path is as the client escaped it; the id recorded is the answer's
	}
	if atHeaders {
		in.Kind = lifecycle.Opaque
	}
	in.Allowed = x.allowed()
	x.s.fleet.Core().Serve(x.stream.Context(), in, x)
	return x.err
}

// allowed is what the gateway's subset hint allows, nil without one (an
// empty subset leaves nothing eligible: 503).
func (x *exchange) allowed() func(id string) bool {
	if x.subset == nil {
		return nil
	}
	ids := x.s.fleet.EndpointIDs()
	allowed := map[string]bool{}
	for _, ep := range x.subset {
		if id, ok := ids[ep]; ok {
			allowed[id] = true
		}
	}
	return func(id string) bool { return allowed[id] }
}

// operation reports whether the request is an engine operation.
func (x *exchange) operation() bool {
	path, _, _ := strings.Cut(x.path, "?")
	return fleet.IsOperation(x.method, path)
}

// operationHeader is what of the client's headers goes to the replicas
// with an operation: not the pseudo-headers, nor those a proxy does not
// forward (httpapi.EndToEnd; Accept-Encoding among them: only the answer's
// Content-Type is relayed, so it must come unencoded).
func operationHeader(hs []*corev3.HeaderValue) http.Header {
	all := http.Header{}
	for _, h := range hs {
		if k := h.GetKey(); !strings.HasPrefix(k, ":") {
			all.Add(k, value(h))
		}
	}
	out, conn := make(http.Header, len(all)), all["Connection"]
	for k, v := range all {
		if httpapi.EndToEnd(k, conn) {
			out[k] = v
		}
	}
	return out
}

// operate sends an engine operation to every replica (an abort taken
// first: the requests it covers in the picker's queue end, the engines'
// aborts of the others are relayed) and answers the gateway with their
// verdict, as gorgo serve does. whole says its body is whole: one that
// came in pieces (request_body_mode STREAMED, or BUFFERED_PARTIAL past
// Envoy's buffer) is refused, not sent to one endpoint.
func (x *exchange) operate(op Operator, whole bool) error {
	path, _, _ := strings.Cut(x.path, "?")
	set := x.s.settings.Load()
	if set.RefuseOperations && !x.operator(set) {
		return x.immediate(wire.Errorf(http.StatusForbidden, "%s %s acts on every replica's engine, which this router lets only the tenants it names do (engine_operations: refuse; a tenant's engine_operations: true)", x.method, path))
	}
	if !whole {
		return x.immediate(wire.Errorf(http.StatusBadRequest, "%s %s is sent to every replica by the endpoint picker, which needs its whole body: the gateway sent it in pieces (use request_body_mode BUFFERED or FULL_DUPLEX_STREAMED)", x.method, path))
	}
	a, e := op.Operate(x.stream.Context(), fleet.Operation{Method: x.method, URI: x.path, Body: x.body,
		Wait: set.OperationWait, LongWait: set.WeightsWait, Received: x.received, Allowed: x.allowed(),
		Header: func(u *fleet.Upstream) http.Header {
			h := x.opHeader.Clone()
			if key := u.APIKey(); key != "" {
				h.Set("Authorization", "Bearer "+key)
			}
			return h
		}})
	if e != nil {
		return x.immediate(e)
	}
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
		{Header: &corev3.HeaderValue{Key: "x-gorgo-replica", RawValue: []byte(a.ID)}}}}
	if a.Missed != nil {
		hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-gorgo-missed", RawValue: []byte(strings.Join(a.Missed, ","))}})
	}
	if ct := a.Header.Get("Content-Type"); ct != "" {
		hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte(ct)}})
	}
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode(a.Status)}, Headers: hm, Body: a.Body}}})
}

// Send names replica id to the gateway (the first attempt), then hears the
// response's headers; a later attempt is the fallback the gateway says it
// took.
func (x *exchange) Send(ctx context.Context, r *lifecycle.Request, id string) (int, *lifecycle.AttemptError) {
	if x.err != nil {
		return 0, &lifecycle.AttemptError{Error: *wire.Errorf(http.StatusServiceUnavailable, "the gateway's stream broke")}
	}
	if !x.routed {
		ep, ok := x.s.fleet.Endpoint(id)
		if !ok { // left the fleet since the decision: free it, try the next
			return 0, &lifecycle.AttemptError{Error: *wire.Errorf(http.StatusServiceUnavailable, "%s left the fleet", id)}
		}
		if err := x.route(ep, r); err != nil {
			x.err = err
			return 0, &lifecycle.AttemptError{Error: *wire.Errorf(http.StatusServiceUnavailable, "the gateway's stream broke")}
		}
		x.routed = true
		x.watch(r, id)
		x.awaitResponse()
		if x.err != nil {
			return 0, &lifecycle.AttemptError{Error: *wire.Errorf(http.StatusServiceUnavailable, "the gateway's stream broke")}
		}
		switch {
		case x.unobserved || x.gone || x.status >= 300 || x.servedEP != "" && x.servedEP != ep:
			x.unwatch(false) // no answer of it (gone before its headers), or another's
		case !r.Stream():
			x.unwatch(r.AnswersJSON()) // a whole answer's headers come with its end
		case x.respNone || x.respLate:
			x.unwatch(false) // its first token will not be seen in time
		}
	}
	if x.served != "" && x.served != id {
		return 0, &lifecycle.AttemptError{Error: *wire.Errorf(http.StatusBadGateway, "the gateway fell back"), Broken: true}
	}
	if x.status == http.StatusServiceUnavailable || x.status == http.StatusTooManyRequests {
		// The replica said it is busy, and the gateway relays it (its
		// retries done): later picks pass it over for its Retry-After,
		// as the proxy's do (lifecycle.AttemptError.Busy).
		now := time.Now()
		core := x.s.fleet.Core()
		core.Router().Busy(id, core.Now(now), wire.RetryWait(x.retryAfter, now))
	}
	if x.status == http.StatusNotFound && r.Format() == wire.Native {
		// SGLang answers no 404 to a /generate: the replica has none (a
		// vLLM replica in a fleet of both). The gateway relays it; later
		// picks pass the replica over for it (lifecycle.AttemptError.NoEndpoint).
		core := x.s.fleet.Core()
		core.Router().Lacks(id, r.Route.Endpoint, core.Now(time.Now()))
	}
	return x.status, nil
}

// watch registers the request routed to replica id with its stall check,
// if the fleet has one (Watcher), until its answer begins: a whole
// answer's headers, a stream's first token.
func (x *exchange) watch(r *lifecycle.Request, id string) {
	w, ok := x.s.fleet.(Watcher)
	if !ok {
		return
	}
	if x.of = w.Upstream(id); x.of == nil {
		return
	}
	x.noCut = func(error) {}
	x.watched = x.of.Watch(&x.noCut, r)
}

// unwatch ends the watch, if one is on.
func (x *exchange) unwatch(answered bool) {
	if x.watched != nil {
		x.watched(answered)
		x.watched = nil
	}
	if !answered {
		x.of = nil // no progress of it to hear
	}
}

// route sends the gateway the destination: the chosen endpoint and the
// ranked fallbacks, in the header and the metadata (the protocol forbids
// them to differ), with the request's body in full-duplex mode.
func (x *exchange) route(ep string, r *lifecycle.Request) error {
	eps := []string{ep}
	for _, fb := range r.Fallbacks() {
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
	traceAttempt(common.HeaderMutation, r, ep)
	md, _ := structpb.NewStruct(map[string]any{LBNamespace: map[string]any{DestinationHeader: list}})
	// The body goes on as the client sent it, or with the model the
	// gateway renamed it to, or with the served name an alias stood for.
	body, rewritten := x.body, x.renamed
	if r.Rewritten() != nil {
		body, rewritten = r.Rewritten(), true
	}
	switch {
	case x.atHeaders && x.body != nil && !x.duplex:
		// A partial body (buffered-partial, streamed): the answer is the
		// body message's.
		return x.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: common}}})
	case x.atHeaders || x.duplex:
		if err := x.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
			return err
		}
		if x.atHeaders {
			return nil
		}
		// Full duplex: the body goes on after the headers, in pieces.
		for {
			n := min(len(body), bodyChunk)
			// Trailers end a body that came with them: its last piece
			// does not end the stream before them.
			eos := n == len(body) && !x.trailers
			if err := x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
					Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body[:n], EndOfStream: eos}}}}}}}); err != nil {
				return err
			}
			if n == len(body) {
				break
			}
			body = body[n:]
		}
		if x.trailers {
			return x.send(continueTrailers())
		}
		return nil
	}
	if rewritten { // a buffered body, replaced whole
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
		common.HeaderMutation.SetHeaders = append(common.HeaderMutation.SetHeaders, &corev3.HeaderValueOption{
			Header: &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))}})
	}
	return x.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: common}}})
}

// traceAttempt has the gateway pass a traced attempt's trace context on to
// the replica (a traceparent, and the tracestate, replacing the client's)
// and names the endpoint on the attempt's span. A request not traced keeps
// the client's trace headers as they came.
func traceAttempt(hm *extprocv3.HeaderMutation, r *lifecycle.Request, ep string) {
	sp := r.AttemptSpan()
	tp, ts := tracing.Headers(sp.SpanContext())
	if tp == "" {
		return
	}
	hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: tracing.TraceparentHeader, RawValue: []byte(tp)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	if ts != "" {
		hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: tracing.TracestateHeader, RawValue: []byte(ts)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	} else {
		hm.RemoveHeaders = append(hm.RemoveHeaders, tracing.TracestateHeader)
	}
	if sp.IsRecording() {
		host, port, _ := net.SplitHostPort(ep)
		n, _ := strconv.Atoi(port)
		sp.SetAttributes(attribute.String("server.address", host), attribute.Int("server.port", n))
	}
}

// awaitResponse reads the stream up to the response's headers (answering
// the request's remaining pieces): its status and the endpoint that served
// it. A stream that ends first had no response events: the gateway sends
// none, and the request is counted as served; or, where the gateway said
// it sends the response's body and none of it came, the client left (or
// the gateway gave up) before the response began.
func (x *exchange) awaitResponse() {
	for {
		msg := x.recv()
		if msg == nil {
			x.status = http.StatusOK
			x.unobserved = !x.expect || x.responding
			x.gone = !x.unobserved
			return
		}
		rh, ok := msg.Request.(*extprocv3.ProcessingRequest_ResponseHeaders)
		if !ok {
			if err := x.request(msg); err != nil {
				x.err, x.closed = err, true
			}
			if x.flush() != nil {
				return // the stream broke: Send says so
			}
			continue
		}
		x.served, x.servedEP = x.servedID(msg.GetMetadataContext())
		for _, h := range rh.ResponseHeaders.GetHeaders().GetHeaders() {
			switch strings.ToLower(h.GetKey()) {
			case ":status":
				x.status, _ = strconv.Atoi(value(h))
			case "retry-after":
				x.retryAfter = value(h)
			}
		}
		// Without a body to come (Envoy said it sends none), the headers
		// are all the picker will see of the answer: it was served, with
		// their status. Waiting on would only see the stream end (Envoy
		// closes it once it has nothing more to send), and count a 499.
		x.answered = rh.ResponseHeaders.GetEndOfStream() || x.respNone
		x.pending = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
			ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: x.budgetHeaders()}}}}
		return
	}
}

// Relay hears the response's body (SSE events of a stream, or a whole JSON
// answer) as the gateway passes it on, until its end.
func (x *exchange) Relay(r *lifecycle.Request) lifecycle.Outcome {
	for !x.answered && !x.unobserved {
		if x.flush() != nil {
			break
		}
		msg := x.recv()
		if msg == nil {
			break
		}
		switch m := msg.Request.(type) {
		case *extprocv3.ProcessingRequest_ResponseBody:
			body, eos := m.ResponseBody.GetBody(), m.ResponseBody.GetEndOfStream()
			x.observe(r, body, eos)
			if x.of != nil && len(body) > 0 {
				if x.watched != nil && r.Began() {
					x.unwatch(true) // a stream's first token
				}
				if x.watched == nil {
					x.of.Progressed(time.Now())
				}
			}
			x.answered = eos
			x.pending = continueResponse(msg, x.respDuplex)
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			x.answered = true
			x.pending = continueResponse(msg, x.respDuplex)
		default:
			if err := x.request(msg); err != nil {
				x.err, x.closed = err, true
			}
		}
	}
	out := lifecycle.Outcome{Status: x.status}
	switch {
	case x.unobserved, x.respNone && x.answered:
		// No response events, or no body: all the picker knows is the
		// end (or the status), so the answer counts as complete, with
		// no tokens.
		r.Done()
	case !x.answered:
		out.ClientGone = true // the stream ended mid-answer
	case r.Stream() && x.status == http.StatusOK && !r.Ended():
		// The body ended without the answer's end: the replica closed
		// its stream early (as gorgo serve judges it).
		out.Err = lifecycle.ErrNoEnd
	case r.Stream() && x.status == http.StatusOK:
		r.Done() // its end without [DONE] (a Responses API stream's)
	}
	return out
}

// Refuse answers the client directly, before the decision; after it (the
// gateway fell back to an endpoint the router no longer has) the response
// goes on through the gateway regardless.
func (x *exchange) Refuse(e *wire.Error) {
	if x.routed || x.err != nil {
		return
	}
	if e.Status >= 500 {
		e = &wire.Error{Status: http.StatusServiceUnavailable, Type: wire.TypeOf(http.StatusServiceUnavailable),
			Message: "no endpoint available: " + e.Message, RetryAfter: e.RetryAfter}
	}
	if err := x.immediate(e); err != nil {
		x.err = err
	}
}

// observe takes a piece of the response body: SSE events of a stream, or
// a whole JSON answer.
func (x *exchange) observe(r *lifecycle.Request, body []byte, eos bool) {
	if !r.Stream() {
		// A whole JSON answer: keep its tail (the usage comes last), not
		// the whole of a large answer, and read it at the end; its first
		// bytes say which stored response it is, if one.
		x.sse = append(x.sse, body...)
		r.AnswerPart(body)
		if !x.head && (len(x.sse) >= headBytes || eos) {
			// Enough of its head (the gateway's first piece may end
			// anywhere, even inside the id).
			x.head = true
			if x.status == http.StatusOK {
				r.AnswerHead(x.sse)
			}
		}
		if n := len(x.sse); n > maxTail {
			x.sse = x.sse[:copy(x.sse, x.sse[n-maxTail:])]
			x.cut = true
		}
		if eos {
			if x.cut { // too long to hold: counted as it passed, or from its tail
				r.AnswerEnd(x.sse)
			} else {
				r.Complete(r.Format().Body(x.sse))
			}
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
		if x.long { // the end of an event too long to hold
			x.longEnd(r, ev)
			continue
		}
		x.event(r, ev, now)
	}
	x.sse = x.sse[:copy(x.sse, rest)]
	if len(x.sse) > maxTail {
		if !x.long {
			x.long = true
			r.LongEvent(x.sse) // its head still read
		}
		// Its last bytes kept to read, and the last two left to find its
		// end (a blank line may be split between two pieces).
		n := len(x.sse) - 2
		r.LongEventPart(x.sse[:n])
		x.sse = x.sse[:copy(x.sse, x.sse[n:])]
	}
	if eos {
		switch {
		case x.long:
			x.longEnd(r, x.sse)
		case len(x.sse) > 0:
			x.event(r, x.sse, now)
		}
		x.sse = x.sse[:0]
	}
}

// longEnd ends an event too long to hold, whose last piece is ev.
func (x *exchange) longEnd(r *lifecycle.Request, ev []byte) {
	r.LongEventPart(ev)
	r.LongEventEnd()
	x.long = false
}

func (x *exchange) event(r *lifecycle.Request, ev []byte, at time.Time) {
	data := wire.EventData(ev, &x.scratch)
	if len(data) == 0 {
		return
	}
	if wire.IsDone(data) {
		r.Done()
		return
	}
	p := r.Format().Chunk(data)
	r.Chunk(&p, at)
}

// budgetHeaders are the tenant's x-ratelimit-* headers as a mutation of
// the answer's (nil without a budget).
func (x *exchange) budgetHeaders() *extprocv3.HeaderMutation {
	if len(x.replyHeaders) == 0 {
		return nil
	}
	hm := &extprocv3.HeaderMutation{}
	for _, h := range x.replyHeaders {
		hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: strings.ToLower(h[0]), RawValue: []byte(h[1])}})
	}
	return hm
}

// immediate answers the client directly (an error in OpenAI's shape).
func (x *exchange) immediate(e *wire.Error) error {
	body, contentType := e.JSON(), "application/json"
	if e.Answer != nil {
		body, contentType = e.Answer, e.AnswerType
	}
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
		Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte(contentType)}}}}
	if e.RetryAfter != "" {
		hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "retry-after", RawValue: []byte(e.RetryAfter)}})
	}
	if b := x.budgetHeaders(); b != nil {
		hm.SetHeaders = append(hm.SetHeaders, b.SetHeaders...)
	}
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode(e.Status)}, Headers: hm, Body: body, Details: e.Message}}})
}

func (x *exchange) send(r *extprocv3.ProcessingResponse) error { return x.stream.Send(r) }

// flush sends the pending answer, if any.
func (x *exchange) flush() error {
	if x.pending == nil {
		return nil
	}
	p := x.pending
	x.pending = nil
	if err := x.send(p); err != nil {
		x.err, x.closed = err, true
		return err
	}
	return nil
}

// servedID is the replica the gateway says served the request ("" if it
// says nothing or names an endpoint the fleet does not have).
func (x *exchange) servedID(md *corev3.Metadata) (id, ep string) {
	ep = md.GetFilterMetadata()[LBNamespace].GetFields()[ServedKey].GetStringValue()
	if ep == "" {
		return "", ""
	}
	return x.s.fleet.EndpointIDs()[ep], ep
}

func continueHeaders() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}}
}

func continueBody() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}}
}

func continueTrailers() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{}}}
}

// continueResponse answers a response message with "go on" (a full-duplex
// response body piece goes back as it came).
func continueResponse(msg *extprocv3.ProcessingRequest, duplex bool) *extprocv3.ProcessingResponse {
	switch m := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
			ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		resp := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}
		if duplex {
			resp.Response.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: m.ResponseBody.GetBody(), EndOfStream: m.ResponseBody.GetEndOfStream()}}}
		}
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: resp}}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}}
	}
	return nil
}

// value is a header's value (Envoy sends it raw or as a string).
func value(h *corev3.HeaderValue) string {
	if v := h.GetValue(); v != "" {
		return v
	}
	return string(h.GetRawValue())
}

// subset reads the gateway's subset hint from the request metadata: nil
// without one; else the endpoints it names (a list, or one string, each
// comma-separated as some gateways send them), none if it names none, so
// that nothing is eligible.
func subset(md *corev3.Metadata) []string {
	st := md.GetFilterMetadata()[SubsetNamespace]
	if st == nil {
		return nil
	}
	v := st.GetFields()[SubsetKey]
	if v == nil {
		return nil
	}
	out := []string{}
	add := func(s string) {
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
	}
	if l := v.GetListValue(); l != nil {
		for _, e := range l.GetValues() {
			add(e.GetStringValue())
		}
	} else {
		add(v.GetStringValue())
	}
	return out
}

// The request headers of tenants, lower-cased as ext_proc gives them.
var (
	tenantHeader   = strings.ToLower(tenant.TenantHeader)
	priorityHeader = strings.ToLower(tenant.PriorityHeader)
	ttftSLOHeader  = strings.ToLower(tenant.TTFTSLOHeader)
	tpotSLOHeader  = strings.ToLower(tenant.TPOTSLOHeader)
)

// replyHeaders are headers for the client, as the lifecycle sets them
// (lifecycle.HeaderSetter).
type replyHeaders [][2]string

func (h *replyHeaders) Set(name, value string) { *h = append(*h, [2]string{name, value}) }
