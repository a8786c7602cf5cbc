package lifecycle

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// Tracing. With a tracer (SetTracer), every request Serve reads is a span
// of server kind, "gorgo.request", a child of the client's trace context
// when the front end read one (Incoming.Parent). Its children, when it is
// sampled: "gorgo.queue", the wait in the admission queue (only when the
// request was held); "gorgo.route", the routing decision (the chosen
// replica, its cost terms, the estimated cached tokens, the fallbacks);
// and "gorgo.attempt" for each attempt, of client kind, whose context the
// front end passes to the replica (AttemptSpan), with the first token as
// its event. A request that is not sampled has its own span's context
// passed on (same trace, not sampled) and no children.
//
// Without a tracer, nothing here does more than a nil check: no span, no
// allocation, no clock.

// Span and event names.
const (
	spanRequest = "gorgo.request"
	spanQueue   = "gorgo.queue"
	spanRoute   = "gorgo.route"
	spanAttempt = "gorgo.attempt"
	eventFirst  = "gorgo.first_token"
)

// tracer is the Core's tracer, behind an atomic pointer (nil: off).
type tracer struct{ t trace.Tracer }

// coreTracer is the Core's part of tracing.
type coreTracer struct{ p atomic.Pointer[tracer] }

// reqTrace is a request's spans; zero when the request is not traced.
type reqTrace struct {
	t       trace.Tracer
	ctx     context.Context // carries span: the parent of the others
	span    trace.Span      // the request's (nil: not traced)
	attempt trace.Span      // the current attempt's, until it ends
	heldAt  time.Time       // when admission held the request (zero: not held)
}

// SetTracer has the core trace the requests it starts serving from now on
// with t; nil turns tracing off (the default).
func (c *Core) SetTracer(t trace.Tracer) {
	if t == nil {
		c.trc.p.Store(nil)
		return
	}
	c.trc.p.Store(&tracer{t: t})
}

// Tracing reports whether the core traces requests: then a front end reads
// the client's trace context into Incoming.Parent and passes each
// attempt's (AttemptSpan) on to the replica. Without tracing a front end
// leaves the client's trace headers as they came.
func (c *Core) Tracing() bool { return c.trc.p.Load() != nil }

// AttemptSpan is the span of the current attempt: a front end adds what it
// knows of where the attempt went (when the span IsRecording) and passes
// its context on to the replica (a W3C traceparent). For a request not
// sampled it is the request's span (not recording, its context valid);
// for one not traced, a no-op span whose context is invalid.
func (r *Request) AttemptSpan() trace.Span {
	switch {
	case r.tr.attempt != nil:
		return r.tr.attempt
	case r.tr.span != nil:
		return r.tr.span
	}
	return trace.SpanFromContext(context.Background()) // the no-op span
}

// recording reports whether the request's span records: its children are
// made only then.
func (t *reqTrace) recording() bool { return t.span != nil && t.span.IsRecording() }

// traceStart starts the request's span, a child of parent when valid.
func (r *Request) traceStart(ctx context.Context, parent trace.SpanContext, kind Kind) {
	p := r.core.trc.p.Load()
	if p == nil {
		return
	}
	if parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	r.tr.t = p.t
	r.tr.ctx, r.tr.span = p.t.Start(ctx, spanRequest, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(r.Received))
	if !r.tr.span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", operation(kind)),
		attribute.Bool("gorgo.stream", r.Parsed.Stream),
		attribute.Int("gorgo.prompt_tokens", r.Route.PromptTokens),
	}
	if r.Route.Model != "" {
		attrs = append(attrs, attribute.String("gen_ai.request.model", r.Route.Model))
	}
	if r.Parsed.MaxTokens > 0 {
		attrs = append(attrs, attribute.Int("gen_ai.request.max_tokens", r.Parsed.MaxTokens))
	}
	r.tr.span.SetAttributes(attrs...)
}

// operation is a request kind as OpenTelemetry's gen_ai.operation.name.
func operation(k Kind) string {
	switch k {
	case Chat:
		return "chat"
	case Completion:
		return "text_completion"
	case Input:
		return "input"
	case Generate:
		return "text_completion"
	}
	return "other"
}

// traceHold notes that admission held the request (call it under the
// admission lock, before anything can release it).
func (r *Request) traceHold() {
	if r.tr.span != nil {
		r.tr.heldAt = time.Now()
	}
}

// traceQueue records the wait of a request admission held, once admit
// returned (e: refused; gone: the client left).
func (r *Request) traceQueue(e *wire.Error, gone error) {
	if r.tr.heldAt.IsZero() || !r.tr.recording() {
		return
	}
	_, sp := r.tr.t.Start(r.tr.ctx, spanQueue, trace.WithTimestamp(r.tr.heldAt))
	switch {
	case gone == errAborted:
		sp.SetAttributes(attribute.String("gorgo.admission", "aborted"))
	case gone != nil:
		sp.SetAttributes(attribute.String("gorgo.admission", "client_gone"))
	case e != nil:
		sp.SetAttributes(attribute.String("gorgo.admission", "refused"))
		sp.SetStatus(codes.Error, e.Message)
	default:
		sp.SetAttributes(attribute.String("gorgo.admission", "released"))
	}
	sp.End()
}

// traceDecision records the routing decision made from start: the ticket
// t of the chosen replica and the ranked fallbacks, or err. It may run on
// the admission goroutine (a held request's decision), which only reads
// the request's trace.
func (r *Request) traceDecision(start time.Time, t *router.Ticket, fallbacks []router.Candidate, err error) {
	if !r.tr.recording() {
		return
	}
	_, sp := r.tr.t.Start(r.tr.ctx, spanRoute, trace.WithTimestamp(start))
	defer sp.End()
	attrs := []attribute.KeyValue{attribute.String("gorgo.policy", r.core.cfg.Router.Policy().Name())}
	if r.Route.Model != "" {
		attrs = append(attrs, attribute.String("gen_ai.request.model", r.Route.Model))
	}
	if err != nil {
		sp.SetAttributes(attrs...)
		sp.SetStatus(codes.Error, err.Error())
		return
	}
	ids := make([]string, len(fallbacks))
	totals := make([]float64, len(fallbacks))
	for i := range fallbacks {
		ids[i], totals[i] = fallbacks[i].ID, fallbacks[i].Terms.Total
	}
	attrs = append(attrs,
		attribute.String("gorgo.replica", t.ID),
		attribute.Float64("gorgo.cost.rtt", t.Terms.RTT),
		attribute.Float64("gorgo.cost.prefill", t.Terms.Prefill),
		attribute.Float64("gorgo.cost.queue", t.Terms.Queue),
		attribute.Float64("gorgo.cost.decode", t.Terms.Decode),
		attribute.Float64("gorgo.cost.adapter", t.Terms.Adapter),
		attribute.Float64("gorgo.cost.total", t.Terms.Total),
		attribute.Int("gorgo.prompt_tokens", t.PromptTokens),
		attribute.Int("gorgo.est_cached_tokens", t.EstCachedTokens),
		attribute.Int("gorgo.backlog_tokens", t.Backlog),
		attribute.Float64("gorgo.rtt_ms", ms(t.RTT)),
		attribute.Int("gorgo.in_flight", t.InFlight),
		attribute.Float64("gorgo.predicted_ttft_ms", t.Predicted),
		attribute.StringSlice("gorgo.fallbacks", ids),
		attribute.Float64Slice("gorgo.fallbacks.cost_total", totals),
	)
	if t.Adapter != "" {
		attrs = append(attrs, attribute.String("gorgo.adapter", t.Adapter),
			attribute.Float64("gorgo.adapter_load_ms", t.AdapterLoadMS), attribute.Float64("gorgo.adapter_wait_ms", t.WeightsWaitMS))
	}
	sp.SetAttributes(attrs...)
}

// traceAttempt starts the span of the attempt on replica id, sent at
// r.sent.
func (r *Request) traceAttempt(id string) {
	if !r.tr.recording() {
		return
	}
	_, r.tr.attempt = r.tr.t.Start(r.tr.ctx, spanAttempt, trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(r.sent),
		trace.WithAttributes(
			attribute.String("gorgo.replica", id),
			attribute.Int("gorgo.attempt", r.attempts),
			attribute.Float64("gorgo.cost.total", r.ticket.Terms.Total),
			attribute.Int("gorgo.est_cached_tokens", r.ticket.EstCachedTokens),
		))
}

// traceSent records how the front end's Send went: a failed attempt's span
// ends with its error; an answered one stays open until the request ends.
func (r *Request) traceSent(status int, e *AttemptError) {
	sp := r.tr.attempt
	if sp == nil {
		return
	}
	if e == nil {
		sp.SetAttributes(attribute.Int("http.response.status_code", status))
		if status >= 400 {
			sp.SetStatus(codes.Error, statusText(status))
		}
		return
	}
	sp.SetAttributes(attribute.Int("http.response.status_code", e.Status), attribute.Bool("gorgo.replica_broken", e.Broken))
	if e.ModelMissing {
		sp.SetAttributes(attribute.Bool("gorgo.model_missing", true))
	}
	sp.SetStatus(codes.Error, e.Message)
	sp.End()
	r.tr.attempt = nil
}

// traceFirstToken marks the first token, read at at, on the attempt that
// produced it.
func (r *Request) traceFirstToken(at time.Time) {
	if sp := r.tr.attempt; sp != nil {
		sp.AddEvent(eventFirst, trace.WithTimestamp(at), trace.WithAttributes(attribute.Float64("gorgo.ttft_ms", ms(at.Sub(r.Received)))))
	}
}

// traceEnd ends the request's spans at at with the status the request
// ended with; err is why it failed, if it did.
func (r *Request) traceEnd(status int, at time.Time, err error) {
	if r.tr.span == nil {
		return
	}
	if sp := r.tr.attempt; sp != nil {
		if err != nil {
			sp.SetStatus(codes.Error, err.Error())
		}
		sp.End(trace.WithTimestamp(at))
		r.tr.attempt = nil
	}
	sp := r.tr.span
	if sp.IsRecording() {
		attrs := []attribute.KeyValue{
			attribute.Int("http.response.status_code", status),
			attribute.Int("gorgo.attempts", r.attempts),
			attribute.Float64("gorgo.e2e_ms", ms(at.Sub(r.Received))),
		}
		if r.ticket.ID != "" {
			attrs = append(attrs, attribute.String("gorgo.replica", r.ticket.ID))
		}
		if !r.first.IsZero() {
			attrs = append(attrs, attribute.Float64("gorgo.ttft_ms", ms(r.first.Sub(r.Received))))
		}
		if n := r.outputTokens(); n > 0 {
			attrs = append(attrs, attribute.Int("gen_ai.usage.output_tokens", n))
		}
		if r.cached >= 0 {
			attrs = append(attrs, attribute.Int("gorgo.cached_tokens", r.cached))
		}
		sp.SetAttributes(attrs...)
		if status >= statusInternal {
			msg := statusText(status)
			if err != nil {
				msg = err.Error()
			}
			sp.SetStatus(codes.Error, msg)
		}
	}
	sp.End(trace.WithTimestamp(at))
}

// traceLog adds the request's id (Incoming.LogID), and its trace id when
// it has a valid span context, to an access log line's attributes.
func (r *Request) traceLog(attrs ...any) []any {
	if r.logID != "" {
		attrs = append(attrs, "request_id", r.logID)
	}
	if r.tr.span == nil {
		return attrs
	}
	if sc := r.tr.span.SpanContext(); sc.IsValid() {
		attrs = append(attrs, "trace_id", sc.TraceID().String())
	}
	return attrs
}
