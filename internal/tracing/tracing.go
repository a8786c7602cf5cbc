// Package tracing is gorgo's OpenTelemetry tracing: the config (an OTLP/HTTP
// collector's endpoint, the sampling ratio, the service name; off without
// an endpoint), the tracer provider it starts (a parent-based sampler over
// a trace-id ratio, a batch span processor with bounded queues, the OTLP
// exporter), and the W3C trace context's headers (traceparent, tracestate)
// read from a client and written for a replica.
//
// The spans themselves belong to the request's life (internal/lifecycle,
// tracing.go there); the front ends (internal/proxy, internal/epp) read the
// client's trace context and pass the attempt's on.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Config is the tracing: part of gorgo serve's (and gorgo epp's) config
// file. Tracing is off without an Endpoint.
type Config struct {
	// Endpoint is an OTLP/HTTP collector's URL, http://HOST:4318 (spans
	// are posted to its /v1/traces; a URL with a path is used as it is).
	Endpoint string `yaml:"endpoint"`
	// SamplingRatio is the share of traces started here that are sampled,
	// in [0, 1] (default 1). A client's traceparent decides for its own
	// trace (a parent-based sampler): sampled by the client, sampled here.
	SamplingRatio *float64 `yaml:"sampling_ratio"`
	// ServiceName names this router in the traces (default gorgo; the
	// OTEL_SERVICE_NAME environment variable when the file gives none).
	ServiceName string `yaml:"service_name"`
}

// DefaultServiceName is the service name of gorgo's spans unless the
// config or OTEL_SERVICE_NAME says otherwise.
const DefaultServiceName = "gorgo"

// Enabled reports whether the config turns tracing on.
func (c Config) Enabled() bool { return c.Endpoint != "" }

// Ratio is the sampling ratio in effect (1 unless given).
func (c Config) Ratio() float64 {
	if c.SamplingRatio == nil {
		return 1
	}
	return *c.SamplingRatio
}

// Equal reports whether two configs say the same.
func (c Config) Equal(o Config) bool {
	return c.Endpoint == o.Endpoint && c.ServiceName == o.ServiceName && (c.SamplingRatio == nil) == (o.SamplingRatio == nil) && c.Ratio() == o.Ratio()
}

// Validate reports the config's first problem, in one line.
func (c Config) Validate() error {
	if c.SamplingRatio != nil {
		if r := *c.SamplingRatio; math.IsNaN(r) || r < 0 || r > 1 {
			return fmt.Errorf("config: tracing.sampling_ratio %v is outside [0, 1]", r)
		}
	}
	if c.Endpoint == "" {
		if c.SamplingRatio != nil || c.ServiceName != "" {
			return errors.New("config: tracing has no endpoint (want tracing.endpoint: http://HOST:4318, an OTLP/HTTP collector; without one tracing is off)")
		}
		return nil
	}
	if _, err := c.url(); err != nil {
		return err
	}
	return nil
}

// url is the endpoint's URL for the exporter: /v1/traces appended to a
// URL without a path.
func (c Config) url() (string, error) {
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("config: tracing.endpoint %q is not a collector's URL (want http://HOST:4318 or https://HOST:PORT[/PATH])", c.Endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

// Tracing is the tracer provider of a config: the SDK's, exporting over
// OTLP/HTTP, or a no-op one when tracing is off.
type Tracing struct {
	provider *sdktrace.TracerProvider // nil when off
	tracer   trace.Tracer
}

// Batching bounds what waits to be exported: spans past MaxQueue are
// dropped (never blocking a request), and are sent in batches of at most
// MaxBatch every BatchDelay (the SDK's defaults, set here explicitly), each
// export bounded by ExportTimeout.
const (
	MaxQueue      = 2048
	MaxBatch      = 512
	BatchDelay    = 5 * time.Second
	ExportTimeout = 30 * time.Second
)

// Options tune Start for tests and benchmarks.
type Options struct {
	// BatchDelay overrides how long spans wait to be batched (0: the
	// default, 5 s).
	BatchDelay time.Duration
	// Log gets the exporter's errors (nil: the OpenTelemetry default, the
	// standard logger). It becomes the process's OpenTelemetry error
	// handler.
	Log *slog.Logger
}

// Start returns the tracing of a config (validated here): the SDK's
// provider exporting to the endpoint, or a no-op one when tracing is off.
// Nothing is sent until spans end; the exporter connects lazily, so a
// collector that is down costs dropped spans, not a failed start.
func Start(cfg Config, o Options) (*Tracing, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return &Tracing{tracer: noop.NewTracerProvider().Tracer(scope)}, nil
	}
	endpoint, _ := cfg.url()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(endpoint))
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	attrs := []attribute.KeyValue{}
	if cfg.ServiceName != "" {
		attrs = append(attrs, attribute.String("service.name", cfg.ServiceName))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	if cfg.ServiceName == "" && !hasServiceName(res) {
		res, _ = resource.Merge(res, resource.NewSchemaless(attribute.String("service.name", DefaultServiceName)))
	}
	delay := BatchDelay
	if o.BatchDelay > 0 {
		delay = o.BatchDelay
	}
	if o.Log != nil {
		log := o.Log
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing", "error", err) }))
	}
	// A client's strings (its model's name, a tenant header) must not make
	// the span queue, which is bounded in spans, unbounded in bytes.
	limits := sdktrace.NewSpanLimits()
	limits.AttributeValueLengthLimit = MaxAttributeLen
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithRawSpanLimits(limits),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.Ratio()))),
		sdktrace.WithResource(res),
		sdktrace.WithSpanProcessor(sdktrace.NewBatchSpanProcessor(exp,
			sdktrace.WithMaxQueueSize(MaxQueue), sdktrace.WithMaxExportBatchSize(MaxBatch),
			sdktrace.WithBatchTimeout(delay), sdktrace.WithExportTimeout(ExportTimeout))),
	)
	return &Tracing{provider: tp, tracer: tp.Tracer(scope)}, nil
}

// MaxAttributeLen is the longest string attribute a span keeps, in bytes
// (the SDK cuts longer ones).
const MaxAttributeLen = 256

// scope is the instrumentation scope of gorgo's spans.
const scope = "github.com/gorgo-llm/gorgo"

// hasServiceName reports whether a resource names its service other than
// the SDK's fallback (unknown_service:...), as OTEL_SERVICE_NAME does.
func hasServiceName(res *resource.Resource) bool {
	v, ok := res.Set().Value("service.name")
	if !ok {
		return false
	}
	s := v.AsString()
	return s != "" && !strings.HasPrefix(s, "unknown_service")
}

// Enabled reports whether spans are recorded and exported (false: the
// no-op provider).
func (t *Tracing) Enabled() bool { return t != nil && t.provider != nil }

// Tracer is the tracer of gorgo's spans (a no-op one when tracing is off).
func (t *Tracing) Tracer() trace.Tracer { return t.tracer }

// Shutdown exports the spans that ended and stops the exporter, within
// ctx (give it the shutdown timeout). Spans that end after it are dropped.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// ForceFlush exports the spans that ended, within ctx.
func (t *Tracing) ForceFlush(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	return t.provider.ForceFlush(ctx)
}

// W3C trace context headers (lower case, as HTTP/2 and Envoy carry them).
const (
	TraceparentHeader = "traceparent"
	TracestateHeader  = "tracestate"
)

var w3c = propagation.TraceContext{}

// Parent is the span context a client's traceparent (and tracestate)
// header names, remote; invalid when the header is missing or malformed.
func Parent(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	c := carrier{traceparent: traceparent, tracestate: tracestate}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), &c))
}

// Headers is a span context as W3C headers: its traceparent, and its
// tracestate ("" if it has none); both "" for an invalid context.
func Headers(sc trace.SpanContext) (traceparent, tracestate string) {
	if !sc.IsValid() {
		return "", ""
	}
	var c carrier
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), &c)
	return c.traceparent, c.tracestate
}

// carrier holds the two W3C headers.
type carrier struct{ traceparent, tracestate string }

func (c *carrier) Get(key string) string {
	switch key {
	case TraceparentHeader:
		return c.traceparent
	case TracestateHeader:
		return c.tracestate
	}
	return ""
}

func (c *carrier) Set(key, value string) {
	switch key {
	case TraceparentHeader:
		c.traceparent = value
	case TracestateHeader:
		c.tracestate = value
	}
}

func (c *carrier) Keys() []string { return []string{TraceparentHeader, TracestateHeader} }
