package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/servetest"
	"github.com/gorgo-llm/gorgo/internal/tracing"
	"github.com/gorgo-llm/gorgo/internal/tracing/tracingtest"
)

// startTracing exports to the receiver, sampling at ratio, in batches sent
// every 50 ms, until the test ends.
func startTracing(t testing.TB, rc *tracingtest.Receiver, ratio float64) *tracing.Tracing {
	t.Helper()
	tr, err := tracing.Start(tracing.Config{Endpoint: rc.URL, SamplingRatio: &ratio, ServiceName: "gorgo-test"},
		tracing.Options{BatchDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Shutdown(context.Background()) })
	return tr
}

// traceparent splits a W3C traceparent into its trace id, parent id and
// flags.
func traceparent(t *testing.T, h string) (traceID, parentID, flags string) {
	t.Helper()
	p := strings.Split(h, "-")
	if len(p) != 4 || p[0] != "00" || len(p[1]) != 32 || len(p[2]) != 16 || len(p[3]) != 2 {
		t.Fatalf("traceparent %q is not W3C's", h)
	}
	return p[1], p[2], p[3]
}

const (
	clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan  = "00f067aa0ba902b7"
)

// Tracing on at ratio 1: a client's traceparent reaches the replica with
// the same trace id (the attempt's span as its parent), and the request's
// spans reach an OTLP receiver: the request (a child of the client's
// span), the routing decision with the chosen replica and its cost terms,
// the attempt with the first token. The access log carries the trace id.
func TestTracingEndToEnd(t *testing.T) {
	rc := tracingtest.Start(t)
	tr := startTracing(t, rc, 1)
	var log servetest.Log
	reps := []*replica{startReplica(t, 2*time.Millisecond, emulator.Faults{}), startReplica(t, 30*time.Millisecond, emulator.Faults{})}
	s, url := startProxy(t, testConfig{AccessLog: slog.New(slog.NewTextHandler(&log, nil))}, reps...)
	s.Core().SetTracer(tr.Tracer())

	res := chat(t, url, "where does a traced request go? long enough to fill a few blocks of the index", 4,
		"traceparent", "00-"+clientTrace+"-"+clientSpan+"-01", "tracestate", "vendor=x")
	if res.Status != 200 || !res.Done || res.Replica == "" {
		t.Fatalf("answer %+v", res)
	}
	chosen, other := reps[res.Replica[0]-'a'], "a"
	if res.Replica == "a" {
		other = "b"
	}
	tid, parent, flags := traceparent(t, chosen.LastHeader().Get("Traceparent"))
	if tid != clientTrace || parent == clientSpan || flags != "01" {
		t.Errorf("the replica's traceparent: trace %s parent %s flags %s; want trace %s, a parent of gorgo's, sampled", tid, parent, flags, clientTrace)
	}
	if ts := chosen.LastHeader().Values("Tracestate"); len(ts) != 1 || ts[0] != "vendor=x" {
		t.Errorf("the replica's tracestate %q, want the client's", ts)
	}

	eventually(t, "the request's spans at the receiver", func() bool {
		sp := rc.Trace(clientTrace)
		return len(tracingtest.Named(sp, "gorgo.request")) == 1 && len(tracingtest.Named(sp, "gorgo.route")) == 1 &&
			len(tracingtest.Named(sp, "gorgo.attempt")) == 1
	})
	spans := rc.Trace(clientTrace)
	req := tracingtest.Named(spans, "gorgo.request")[0]
	route := tracingtest.Named(spans, "gorgo.route")[0]
	attempt := tracingtest.Named(spans, "gorgo.attempt")[0]
	if req.ParentID != clientSpan || req.Kind != tracepb.Span_SPAN_KIND_SERVER || req.Service != "gorgo-test" {
		t.Errorf("request span: parent %s kind %v service %q; want the client's span, server, gorgo-test", req.ParentID, req.Kind, req.Service)
	}
	if req.Attrs["http.response.status_code"] != int64(200) || req.Attrs["gorgo.replica"] != res.Replica || req.Attrs["gen_ai.operation.name"] != "chat" {
		t.Errorf("request span attributes %v", req.Attrs)
	}
	if _, ok := req.Attrs["gorgo.ttft_ms"]; !ok {
		t.Errorf("request span has no TTFT: %v", req.Attrs)
	}
	if route.ParentID != req.SpanID || attempt.ParentID != req.SpanID {
		t.Errorf("route's parent %s, attempt's %s; want the request's %s", route.ParentID, attempt.ParentID, req.SpanID)
	}
	// The decision: the chosen replica, its cost terms, the fallbacks.
	if route.Attrs["gorgo.replica"] != res.Replica || route.Attrs["gen_ai.request.model"] != "gorgo-emulated" || route.Attrs["gorgo.policy"] == nil {
		t.Errorf("route span attributes %v", route.Attrs)
	}
	for _, k := range []string{"gorgo.cost.rtt", "gorgo.cost.prefill", "gorgo.cost.queue", "gorgo.cost.decode", "gorgo.cost.adapter", "gorgo.cost.total", "gorgo.rtt_ms"} {
		if _, ok := route.Attrs[k].(float64); !ok {
			t.Errorf("route span has no %s: %v", k, route.Attrs)
		}
	}
	if total, _ := route.Attrs["gorgo.cost.total"].(float64); total <= 0 {
		t.Errorf("the chosen replica's total cost %v", route.Attrs["gorgo.cost.total"])
	}
	if _, ok := route.Attrs["gorgo.est_cached_tokens"].(int64); !ok {
		t.Errorf("route span has no estimated cached tokens: %v", route.Attrs)
	}
	if fb, _ := route.Attrs["gorgo.fallbacks"].([]any); len(fb) != 1 || fb[0] != other {
		t.Errorf("fallbacks %v, want [%s]", route.Attrs["gorgo.fallbacks"], other)
	}
	// The attempt: a client span whose id the replica got as its parent.
	if attempt.Kind != tracepb.Span_SPAN_KIND_CLIENT || attempt.SpanID != parent {
		t.Errorf("attempt span %s kind %v; the replica's parent %s", attempt.SpanID, attempt.Kind, parent)
	}
	if attempt.Attrs["gorgo.replica"] != res.Replica || attempt.Attrs["server.address"] != "127.0.0.1" ||
		attempt.Attrs["server.port"] != int64(chosen.Port()) || attempt.Attrs["http.response.status_code"] != int64(200) || attempt.Error {
		t.Errorf("attempt span attributes %v (error %v)", attempt.Attrs, attempt.Error)
	}
	if _, ok := attempt.Events["gorgo.first_token"]; !ok {
		t.Errorf("attempt span has no first token event: %v", attempt.Events)
	}
	if attempt.Start < req.Start || attempt.End > req.End || route.End > attempt.Start {
		t.Errorf("spans out of order: request %d–%d, route %d–%d, attempt %d–%d", req.Start, req.End, route.Start, route.End, attempt.Start, attempt.End)
	}
	if line := log.String(); !strings.Contains(line, "trace_id="+clientTrace) {
		t.Errorf("access log %q lacks the trace id", line)
	}
}

// A failed attempt is a span of its own, with the replica's error; the
// fallback's attempt serves.
func TestTracedFailover(t *testing.T) {
	rc := tracingtest.Start(t)
	tr := startTracing(t, rc, 1)
	bad := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusInternalServerError) })
	good := startReplica(t, 30*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, testConfig{}, bad, good)
	s.Core().SetTracer(tr.Tracer())
	res := chat(t, url, "a request the nearer replica fails", 2, "traceparent", "00-"+clientTrace+"-"+clientSpan+"-01")
	if res.Status != 200 || res.Replica != "b" {
		t.Fatalf("answer %+v", res)
	}
	if tid, _, _ := traceparent(t, bad.LastHeader().Get("Traceparent")); tid != clientTrace {
		t.Errorf("the failed replica got trace %s", tid)
	}
	eventually(t, "two attempts at the receiver", func() bool {
		sp := rc.Trace(clientTrace)
		return len(tracingtest.Named(sp, "gorgo.attempt")) == 2 && len(tracingtest.Named(sp, "gorgo.request")) == 1
	})
	for _, a := range tracingtest.Named(rc.Trace(clientTrace), "gorgo.attempt") {
		switch a.Attrs["gorgo.replica"] {
		case "a":
			if !a.Error || a.Attrs["http.response.status_code"] != int64(500) || a.Attrs["gorgo.replica_broken"] != true || a.Attrs["gorgo.attempt"] != int64(1) {
				t.Errorf("failed attempt %+v", a)
			}
		case "b":
			if a.Error || a.Attrs["http.response.status_code"] != int64(200) || a.Attrs["gorgo.attempt"] != int64(2) {
				t.Errorf("serving attempt %+v", a)
			}
		default:
			t.Errorf("attempt on %v", a.Attrs["gorgo.replica"])
		}
	}
}

// Tracing off: a client's trace headers reach the replica as they came.
func TestUntracedKeepsTheClientsTraceparent(t *testing.T) {
	rep := startReplica(t, 2*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, testConfig{}, rep)
	if s.Core().Tracing() {
		t.Fatal("tracing is on by default")
	}
	tp := "00-" + clientTrace + "-" + clientSpan + "-01"
	res := chat(t, url, "an untraced request", 2, "traceparent", tp, "tracestate", "vendor=x")
	if res.Status != 200 {
		t.Fatalf("answer %+v", res)
	}
	h := rep.LastHeader()
	if got := h.Values("Traceparent"); len(got) != 1 || got[0] != tp {
		t.Errorf("traceparent %q, want the client's %q", got, tp)
	}
	if got := h.Values("Tracestate"); len(got) != 1 || got[0] != "vendor=x" {
		t.Errorf("tracestate %q, want the client's", got)
	}
}

// The sampler: a client's unsampled trace stays unsampled (its id passed
// on, nothing exported); a request without a traceparent starts a trace,
// sampled at ratio 1 and not at ratio 0, and the replica is told either
// way.
func TestTraceSampling(t *testing.T) {
	rc := tracingtest.Start(t)
	rep := startReplica(t, 2*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, testConfig{}, rep)
	s.Core().SetTracer(startTracing(t, rc, 1).Tracer())

	const unsampled = "0af7651916cd43dd8448eb211c80319c"
	if res := chat(t, url, "a client's unsampled trace", 2, "traceparent", "00-"+unsampled+"-"+clientSpan+"-00"); res.Status != 200 {
		t.Fatalf("answer %+v", res)
	}
	if tid, parent, flags := traceparent(t, rep.LastHeader().Get("Traceparent")); tid != unsampled || flags != "00" || parent == clientSpan {
		t.Errorf("unsampled: the replica got trace %s parent %s flags %s", tid, parent, flags)
	}

	if res := chat(t, url, "a trace started here", 2); res.Status != 200 {
		t.Fatalf("answer %+v", res)
	}
	started, parent, flags := traceparent(t, rep.LastHeader().Get("Traceparent"))
	if flags != "01" {
		t.Errorf("a trace started at ratio 1 has flags %s", flags)
	}
	eventually(t, "the started trace at the receiver", func() bool { return len(tracingtest.Named(rc.Trace(started), "gorgo.attempt")) == 1 })
	req := tracingtest.Named(rc.Trace(started), "gorgo.request")
	attempt := tracingtest.Named(rc.Trace(started), "gorgo.attempt")[0]
	if len(req) != 1 || req[0].ParentID != "" || attempt.SpanID != parent {
		t.Errorf("started trace: request spans %+v, attempt %s, the replica's parent %s", req, attempt.SpanID, parent)
	}
	if n := len(rc.Trace(unsampled)); n != 0 {
		t.Errorf("%d spans of the client's unsampled trace were exported", n)
	}

	s.Core().SetTracer(startTracing(t, rc, 0).Tracer())
	if res := chat(t, url, "a trace started at ratio 0", 2); res.Status != 200 {
		t.Fatalf("answer %+v", res)
	}
	if tid, _, flags := traceparent(t, rep.LastHeader().Get("Traceparent")); flags != "00" || tid == started {
		t.Errorf("ratio 0: the replica got trace %s flags %s", tid, flags)
	}
}
