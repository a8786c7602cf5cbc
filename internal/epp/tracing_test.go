package epp

import (
	"context"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/servetest"
	"github.com/gorgo-llm/gorgo/internal/tracing"
	"github.com/gorgo-llm/gorgo/internal/tracing/tracingtest"
)

// pick sends a buffered chat request with the given headers and returns
// the picker's answer to its body (the destination), then ends the
// response.
func pick(t *testing.T, f *testFleet, kv ...string) *extprocv3.CommonResponse {
	t.Helper()
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	send := func(r *extprocv3.ProcessingRequest) {
		if err := s.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false, kv...)},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
	recv(t, s)
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody), EndOfStream: true}}})
	common := recv(t, s).GetRequestBody().GetResponse()
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
	recv(t, s)
	events := "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n"
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(events), EndOfStream: true}}})
	recv(t, s)
	s.CloseSend()
	return common
}

// mutation returns a header the picker sets, and how.
func mutation(c *extprocv3.CommonResponse, key string) (*corev3.HeaderValueOption, bool) {
	for _, h := range c.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == key {
			return h, true
		}
	}
	return nil, false
}

// Traced, the picker has the gateway send the replica a traceparent of the
// client's trace whose parent is the attempt's span, and the request's
// spans, the decision's attributes among them, reach the collector.
// Untraced, it leaves the client's trace headers alone.
func TestTraceparentMutation(t *testing.T) {
	const tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	t.Setenv("OTEL_SERVICE_NAME", "") // the default service name
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "")
	rc := tracingtest.Start(t)
	one := 1.0
	tr, err := tracing.Start(tracing.Config{Endpoint: rc.URL, SamplingRatio: &one}, tracing.Options{BatchDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Shutdown(context.Background()) })
	f := newFleet(t, admit.Config{})
	f.core.SetTracer(tr.Tracer())
	common := pick(t, f, "traceparent", "00-"+tid+"-"+sid+"-01", "tracestate", "vendor=x")
	tp, ok := mutation(common, "traceparent")
	if !ok {
		t.Fatalf("no traceparent in the header mutation: %v", common.GetHeaderMutation())
	}
	p := strings.Split(string(tp.GetHeader().GetRawValue()), "-")
	if len(p) != 4 || p[1] != tid || p[2] == sid || p[3] != "01" || tp.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
		t.Fatalf("traceparent %q (%v), want trace %s with the attempt as parent, replacing the client's", tp.GetHeader().GetRawValue(), tp.GetAppendAction(), tid)
	}
	if ts, ok := mutation(common, "tracestate"); !ok || string(ts.GetHeader().GetRawValue()) != "vendor=x" {
		t.Errorf("tracestate %v, want the client's", ts)
	}
	servetest.Eventually(t, "the request's spans at the receiver", func() bool {
		return len(tracingtest.Named(rc.Trace(tid), "gorgo.request")) == 1
	})
	spans := rc.Trace(tid)
	route, attempt := tracingtest.Named(spans, "gorgo.route"), tracingtest.Named(spans, "gorgo.attempt")
	if len(route) != 1 || len(attempt) != 1 {
		t.Fatalf("%d route and %d attempt spans", len(route), len(attempt))
	}
	if fb, _ := route[0].Attrs["gorgo.fallbacks"].([]any); route[0].Attrs["gorgo.replica"] != "a" || len(fb) != 1 || fb[0] != "b" {
		t.Errorf("route span attributes %v", route[0].Attrs)
	}
	if _, ok := route[0].Attrs["gorgo.cost.total"].(float64); !ok {
		t.Errorf("route span has no cost: %v", route[0].Attrs)
	}
	if a := attempt[0]; a.SpanID != p[2] || a.Attrs["server.address"] != "10.0.0.1" || a.Attrs["server.port"] != int64(8000) {
		t.Errorf("attempt span %s %v; the replica's parent %s", a.SpanID, a.Attrs, p[2])
	}
	if _, ok := attempt[0].Events["gorgo.first_token"]; !ok {
		t.Errorf("no first token on the attempt: %v", attempt[0].Events)
	}
	if req := tracingtest.Named(spans, "gorgo.request")[0]; req.ParentID != sid || req.Service != tracing.DefaultServiceName {
		t.Errorf("request span's parent %s, service %q", req.ParentID, req.Service)
	}

	untraced := pick(t, newFleet(t, admit.Config{}), "traceparent", "00-"+tid+"-"+sid+"-01", "tracestate", "vendor=x")
	for _, key := range []string{"traceparent", "tracestate"} {
		if h, ok := mutation(untraced, key); ok {
			t.Errorf("untraced, the picker sets %s: %v", key, h)
		}
	}
	if rm := untraced.GetHeaderMutation().GetRemoveHeaders(); len(rm) != 0 {
		t.Errorf("untraced, the picker removes %v", rm)
	}
}
