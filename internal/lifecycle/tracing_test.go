package lifecycle

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// recorder traces the core's requests into a span recorder, sampling all.
func recorder(c *Core) *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	c.SetTracer(tp.Tracer("test"))
	return rec
}

func named(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// spanFrontEnd is frontEnd noting each attempt's trace context, as a front
// end passes it to the replica.
type spanFrontEnd struct {
	frontEnd
	passed []trace.SpanContext
}

func (f *spanFrontEnd) Send(ctx context.Context, r *Request, id string) (int, *AttemptError) {
	f.passed = append(f.passed, r.AttemptSpan().SpanContext())
	return f.frontEnd.Send(ctx, r, id)
}

var clientParent = func() trace.SpanContext {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}()

// A traced request: its span is the client's span's child; the decision,
// each attempt (the failed ones with their errors) and the first token are
// recorded; each attempt's own context is what the front end passes on;
// the access log carries the trace id.
func TestTracedServe(t *testing.T) {
	c, _, _, _ := setup(t)
	var log bytes.Buffer
	c.cfg.Log = slog.New(slog.NewTextHandler(&log, nil))
	rec := recorder(c)
	fe := &spanFrontEnd{frontEnd: frontEnd{fails: map[string]*AttemptError{
		"a": {Error: *wire.Errorf(502, "refused"), Broken: true},
		"b": {Error: *wire.Errorf(503, "busy")},
	}}}
	if st := c.Serve(context.Background(), Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now(), Parent: clientParent}, fe); st != 200 {
		t.Fatalf("status %d", st)
	}
	spans := rec.Ended()
	reqs, routes, attempts := named(spans, "gorgo.request"), named(spans, "gorgo.route"), named(spans, "gorgo.attempt")
	if len(reqs) != 1 || len(routes) != 1 || len(attempts) != 3 || len(spans) != 5 {
		t.Fatalf("spans: %d requests, %d routes, %d attempts of %d", len(reqs), len(routes), len(attempts), len(spans))
	}
	req, route := reqs[0], routes[0]
	if !req.Parent().Equal(clientParent) || req.SpanKind() != trace.SpanKindServer || req.SpanContext().TraceID() != clientParent.TraceID() {
		t.Errorf("request span's parent %v kind %v", req.Parent(), req.SpanKind())
	}
	if attr(req, "http.response.status_code").AsInt64() != 200 || attr(req, "gorgo.replica").AsString() != "c" || attr(req, "gorgo.attempts").AsInt64() != 3 {
		t.Errorf("request span attributes %v", req.Attributes())
	}
	if route.Parent().SpanID() != req.SpanContext().SpanID() || attr(route, "gorgo.replica").AsString() != "a" ||
		strings.Join(attr(route, "gorgo.fallbacks").AsStringSlice(), ",") != "b,c" || attr(route, "gorgo.cost.total").AsFloat64() <= 0 {
		t.Errorf("route span: parent %v, attributes %v", route.Parent(), route.Attributes())
	}
	for i, a := range attempts { // in the order they ended: a, b, c
		want := []string{"a", "b", "c"}[i]
		if attr(a, "gorgo.replica").AsString() != want || a.SpanKind() != trace.SpanKindClient || a.Parent().SpanID() != req.SpanContext().SpanID() {
			t.Errorf("attempt %d: %v kind %v", i, a.Attributes(), a.SpanKind())
		}
		if !fe.passed[i].Equal(a.SpanContext()) {
			t.Errorf("attempt %d passed on %v, its span is %v", i, fe.passed[i], a.SpanContext())
		}
	}
	if a := attempts[0]; a.Status().Code != codes.Error || !attr(a, "gorgo.replica_broken").AsBool() || attr(a, "http.response.status_code").AsInt64() != 502 {
		t.Errorf("the broken attempt: %v %v", a.Status(), a.Attributes())
	}
	if b := attempts[1]; b.Status().Code != codes.Error || attr(b, "gorgo.replica_broken").AsBool() || attr(b, "http.response.status_code").AsInt64() != 503 {
		t.Errorf("the busy attempt: %v %v", b.Status(), b.Attributes())
	}
	served := attempts[2]
	if served.Status().Code == codes.Error || len(served.Events()) != 1 || served.Events()[0].Name != "gorgo.first_token" {
		t.Errorf("the serving attempt: %v, events %v", served.Status(), served.Events())
	}
	if !strings.Contains(log.String(), "trace_id="+clientParent.TraceID().String()) {
		t.Errorf("access log %q lacks the trace id", log.String())
	}
}

// A request no replica serves ends its span with the error; one whose
// client left is no error of the router's.
func TestTracedEndings(t *testing.T) {
	c, _, _, _ := setup(t)
	rec := recorder(c)
	fail := &AttemptError{Error: *wire.Errorf(502, "refused"), Broken: true}
	fe := &frontEnd{fails: map[string]*AttemptError{"a": fail, "b": fail, "c": fail}}
	if st := c.Serve(context.Background(), Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now()}, fe); st != 502 {
		t.Fatalf("status %d", st)
	}
	req := named(rec.Ended(), "gorgo.request")
	if len(req) != 1 || req[0].Status().Code != codes.Error || attr(req[0], "http.response.status_code").AsInt64() != 502 || req[0].Parent().IsValid() {
		t.Fatalf("refused request's span %+v", req)
	}
	rec.Reset()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if st := c.Serve(ctx, Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now()}, &frontEnd{gone: cancel}); st != statusClientGone {
		t.Fatalf("status %d", st)
	}
	req = named(rec.Ended(), "gorgo.request")
	if len(req) != 1 || req[0].Status().Code == codes.Error || attr(req[0], "http.response.status_code").AsInt64() != statusClientGone {
		t.Fatalf("abandoned request's span %+v", req)
	}
	if n := len(rec.Started()) - len(rec.Ended()); n != 0 {
		t.Errorf("%d spans never ended", n)
	}
}

// A request admission held has its wait recorded, and the decision made
// when it was released; one that went at once has no wait.
func TestTracedQueueWait(t *testing.T) {
	c, _ := admissionCore(t, admit.ModeQueue)
	rec := recorder(c)
	big := []*Request{begin(t, c, chatOf(6000, "one")), begin(t, c, chatOf(6000, "two"))}
	fe := &frontEnd{}
	done := make(chan int, 1)
	go func() {
		done <- c.Serve(context.Background(), Incoming{Body: chatOf(10, "three"), Kind: Chat, Received: time.Now()}, fe)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for testutil.ToFloat64(c.cfg.Metrics.queue) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the small request was not held")
		}
		time.Sleep(time.Millisecond)
	}
	big[0].sendAt(time.Now())
	big[0].Chunk(&wire.Peek{Token: true}, time.Now())
	if st := <-done; st != 200 {
		t.Fatalf("status %d", st)
	}
	spans := rec.Ended()
	queue, route, req := named(spans, "gorgo.queue"), named(spans, "gorgo.route"), named(spans, "gorgo.request")
	if len(queue) != 1 || len(route) != 1 || len(req) != 1 {
		t.Fatalf("%d queue, %d route, %d request spans", len(queue), len(route), len(req))
	}
	if q := queue[0]; attr(q, "gorgo.admission").AsString() != "released" || q.Parent().SpanID() != req[0].SpanContext().SpanID() || !q.EndTime().After(q.StartTime()) {
		t.Errorf("queue span %v, %v–%v", q.Attributes(), q.StartTime(), q.EndTime())
	}
	if attr(route[0], "gorgo.replica").AsString() != big[0].Replica() {
		t.Errorf("released to %v, want %s", attr(route[0], "gorgo.replica"), big[0].Replica())
	}
	for _, r := range big {
		r.end(Outcome{Status: 200}, time.Now())
	}
	rec.Reset()
	if st := c.Serve(context.Background(), Incoming{Body: chatOf(10, "four"), Kind: Chat, Received: time.Now()}, fe); st != 200 {
		t.Fatalf("status %d", st)
	}
	if q := named(rec.Ended(), "gorgo.queue"); len(q) != 0 {
		t.Errorf("a request that was not held has a queue span")
	}
}

// zeroFrontEnd serves every attempt with a two-token stream, allocating
// nothing itself.
type zeroFrontEnd struct{ tok wire.Peek }

func (f *zeroFrontEnd) Send(context.Context, *Request, string) (int, *AttemptError) { return 200, nil }
func (f *zeroFrontEnd) Relay(r *Request) Outcome {
	now := time.Now()
	r.Chunk(&f.tok, now)
	r.Chunk(&f.tok, now)
	r.Done()
	return Outcome{Status: 200}
}
func (f *zeroFrontEnd) Refuse(*wire.Error) {}

// Without a tracer, serving a request allocates nothing (the tracing hooks
// are a nil check); with one, the span context is valid and spans record.
func TestUntracedServeAllocatesNothing(t *testing.T) {
	c, _, _, _ := setup(t)
	c.cfg.Metrics, c.cfg.Health = nil, nil
	fe := &zeroFrontEnd{tok: wire.PeekChunk([]byte(`{"choices":[{"delta":{"content":"hi"}}]}`))}
	in := Incoming{Body: []byte(chat), Kind: Chat, Parent: clientParent}
	serve := func() {
		in.Received = time.Now()
		if st := c.Serve(context.Background(), in, fe); st != 200 {
			t.Fatalf("status %d", st)
		}
	}
	serve()
	if n := testing.AllocsPerRun(100, serve); n != 0 && !raceEnabled {
		t.Errorf("an untraced request allocates %v times", n)
	}
	rec := recorder(c)
	serve()
	if n := len(rec.Ended()); n != 3 {
		t.Errorf("a traced request ended %d spans, want 3", n)
	}
}

// discard is a span exporter that drops what it is given.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkServeTracing is one request's life through Serve (16 replicas,
// a ~1k-token prompt, a two-token stream) without a tracer, and with the
// SDK's (the batch processor's defaults, exporting to nothing), sampled
// (ratio 1) and not (ratio 0): the tracing's own cost per request.
func BenchmarkServeTracing(b *testing.B) {
	for _, ratio := range []float64{-1, 1, 0} {
		b.Run(map[float64]string{-1: "tracing=off", 1: "tracing=on/ratio=1", 0: "tracing=on/ratio=0"}[ratio], func(b *testing.B) {
			g, _ := policy.New("gorgo", policy.Options{})
			rt, _ := router.New(router.Config{Policy: g, BlockTokens: 64})
			for i := range 16 {
				id := string(rune('a' + i))
				rt.Add(router.ReplicaConfig{ID: id, KVCapacityTokens: 1 << 20, PrefillMSPerToken: 0.1, QueueMSPerToken: 0.1})
				rt.ObserveRTT(id, time.Duration(i+1)*time.Millisecond)
			}
			c := NewCore(Config{Router: rt, BlockTokens: 64, MaxAttempts: 3, Start: time.Now()})
			if ratio >= 0 {
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))))
				defer tp.Shutdown(context.Background())
				c.SetTracer(tp.Tracer("bench"))
			}
			fe := &zeroFrontEnd{tok: wire.PeekChunk([]byte(`{"choices":[{"delta":{"content":"hi"}}]}`))}
			in := Incoming{Body: []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 800) + `"}]}`), Kind: Chat}
			b.ReportAllocs()
			for b.Loop() {
				in.Received = time.Now()
				c.Serve(context.Background(), in, fe)
			}
		})
	}
}
