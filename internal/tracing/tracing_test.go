package tracing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

func ratio(r float64) *float64 { return &r }

func TestConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string // "" valid, else part of the error
	}{
		{Config{}, ""},
		{Config{Endpoint: "http://collector:4318"}, ""},
		{Config{Endpoint: "https://collector.example/otlp/v1/traces", SamplingRatio: ratio(0), ServiceName: "x"}, ""},
		{Config{Endpoint: "http://[::1]:4318", SamplingRatio: ratio(1)}, ""},
		{Config{Endpoint: "http://collector:4318", SamplingRatio: ratio(1.01)}, "outside [0, 1]"},
		{Config{Endpoint: "http://collector:4318", SamplingRatio: ratio(-1)}, "outside [0, 1]"},
		{Config{Endpoint: "collector:4318"}, "not a collector's URL"},
		{Config{Endpoint: "grpc://collector:4317"}, "not a collector's URL"},
		{Config{Endpoint: "http://:4318"}, "not a collector's URL"},
		{Config{Endpoint: "http://collector:4318?x=1"}, "not a collector's URL"},
		{Config{Endpoint: "http://user:pw@collector:4318"}, "not a collector's URL"},
		{Config{Endpoint: " http://collector:4318"}, "not a collector's URL"},
		{Config{SamplingRatio: ratio(0.5)}, "no endpoint"},
		{Config{ServiceName: "gorgo"}, "no endpoint"},
	} {
		err := c.cfg.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.cfg, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n")):
			t.Errorf("%+v: error %v, want one line with %q", c.cfg, err, c.want)
		}
		if c.want != "" {
			if _, err := Start(c.cfg, Options{}); err == nil {
				t.Errorf("%+v: started", c.cfg)
			}
		}
	}
	for in, want := range map[string]string{
		"http://collector:4318":           "http://collector:4318/v1/traces",
		"http://collector:4318/":          "http://collector:4318/v1/traces",
		"https://c.example/otlp/traces":   "https://c.example/otlp/traces",
		"https://c.example:443/v1/traces": "https://c.example:443/v1/traces",
	} {
		if got, err := (Config{Endpoint: in}).url(); err != nil || got != want {
			t.Errorf("%s: %s %v, want %s", in, got, err, want)
		}
	}
	if (Config{}).Ratio() != 1 || !(Config{SamplingRatio: ratio(0)}).Equal(Config{SamplingRatio: ratio(0)}) || (Config{}).Equal(Config{SamplingRatio: ratio(1)}) {
		t.Error("Ratio or Equal")
	}
}

// Off, the tracer is a no-op one: its spans record nothing and carry no
// context to pass on.
func TestOff(t *testing.T) {
	tr, err := Start(Config{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Enabled() {
		t.Fatal("enabled without an endpoint")
	}
	_, sp := tr.Tracer().Start(context.Background(), "x")
	if sp.IsRecording() || sp.SpanContext().IsValid() {
		t.Error("the no-op tracer records")
	}
	sp.End()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

// W3C headers: read and written back the same; a malformed traceparent is
// no parent.
func TestHeaders(t *testing.T) {
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sc := Parent(tp, "vendor=x,other=y")
	if !sc.IsValid() || !sc.IsRemote() || !sc.IsSampled() || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("parent %+v", sc)
	}
	if p, s := Headers(sc); p != tp || s != "vendor=x,other=y" {
		t.Errorf("headers %q %q", p, s)
	}
	for _, bad := range []string{"", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", "garbage"} {
		if Parent(bad, "").IsValid() {
			t.Errorf("%q is a parent", bad)
		}
	}
	if p, s := Headers(trace.SpanContext{}); p != "" || s != "" {
		t.Errorf("an invalid context as headers: %q %q", p, s)
	}
}

// Shutdown is bounded by its context even when the collector hangs.
func TestShutdownIsBounded(t *testing.T) {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer hung.Close()
	defer close(release)
	tr, err := Start(Config{Endpoint: hung.URL}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, sp := tr.Tracer().Start(context.Background(), "x")
	sp.End()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = tr.Shutdown(ctx)
	if err == nil {
		t.Error("a hung collector was flushed to")
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("Shutdown took %v past its 100 ms context", d)
	}
}
