package serve

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/servetest"
	"github.com/gorgo-llm/gorgo/internal/tracing"
	"github.com/gorgo-llm/gorgo/internal/tracing/tracingtest"
)

// The tracing: key: read from the file, checked with a one-line error each.
func TestTracingConfig(t *testing.T) {
	base := "replicas: [{id: a, url: \"http://127.0.0.1:1\"}]\n"
	cfg, err := ParseConfig([]byte(base+"tracing: {endpoint: \"http://collector:4318\", sampling_ratio: 0.1, service_name: gorgo-eu}\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Defaults().Validate(); err != nil {
		t.Fatal(err)
	}
	if tc := cfg.Tracing; tc.Endpoint != "http://collector:4318" || tc.Ratio() != 0.1 || tc.ServiceName != "gorgo-eu" || !tc.Enabled() {
		t.Errorf("tracing %+v", tc)
	}
	if cfg, _ := ParseConfig([]byte(base), "test"); cfg.Tracing.Enabled() {
		t.Error("tracing is on by default")
	}
	for _, c := range []struct{ yaml, want string }{
		{"tracing: {endpoint: \"http://collector:4318\", sampling_ratio: 1.5}", "tracing.sampling_ratio 1.5 is outside [0, 1]"},
		{"tracing: {endpoint: \"http://collector:4318\", sampling_ratio: -0.1}", "outside [0, 1]"},
		{"tracing: {endpoint: \"collector:4318\"}", `tracing.endpoint "collector:4318" is not a collector's URL`},
		{"tracing: {endpoint: \"udp://collector:4318\"}", "is not a collector's URL"},
		{"tracing: {endpoint: \"http://\"}", "is not a collector's URL"},
		{"tracing: {sampling_ratio: 0.5}", "tracing has no endpoint"},
	} {
		cfg, err := ParseConfig([]byte(base+c.yaml+"\n"), "test")
		if err == nil {
			err = cfg.Defaults().Validate()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %v, want one line with %q", c.yaml, err, c.want)
		}
		if _, err := New(cfg, Options{Proxy: true}); err == nil {
			t.Errorf("%s: a router was built", c.yaml)
		}
	}
}

// gorgo serve with tracing in its config: requests are traced, the
// replica gets the trace, and Shutdown exports what ended (the batch delay,
// 5 s, has not passed). A reload cannot change the tracing.
func TestTracingFromTheConfig(t *testing.T) {
	rc := tracingtest.Start(t)
	rep := startReplica(t, 2*time.Millisecond, emulator.Faults{})
	s := startRouter(t, Config{Tracing: tracing.Config{Endpoint: rc.URL, ServiceName: "gorgo-serve-test"}}, Options{}, rep)
	if !s.Fleet.Core().Tracing() {
		t.Fatal("the config's tracing is off")
	}
	res := servetest.Chat(t, s.client, "a traced request through gorgo serve", 2)
	if res.Status != 200 {
		t.Fatalf("answer %+v", res)
	}
	tp := strings.Split(rep.LastHeader().Get("Traceparent"), "-")
	if len(tp) != 4 || tp[3] != "01" {
		t.Fatalf("the replica's traceparent %v", tp)
	}
	// The request's spans ended once it is counted.
	eventually(t, "the request counted", func() bool {
		_, body := do(t, http.MethodGet, s.client+"/metrics", "")
		return strings.Contains(body, `gorgo_requests_total{code="200",model="gorgo-emulated",replica="a"} 1`)
	})
	cur := s.Config()
	next := cur
	next.Tracing.ServiceName = "renamed"
	if err := s.Apply(next); err != nil {
		t.Fatal(err)
	}
	if s.Config().Tracing.ServiceName != "gorgo-serve-test" {
		t.Errorf("a reload changed the tracing: %+v", s.Config().Tracing)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	spans := rc.Trace(tp[1])
	if len(tracingtest.Named(spans, "gorgo.request")) != 1 || len(tracingtest.Named(spans, "gorgo.route")) != 1 || len(tracingtest.Named(spans, "gorgo.attempt")) != 1 {
		t.Fatalf("after Shutdown the receiver has %+v", spans)
	}
	if spans[0].Service != "gorgo-serve-test" {
		t.Errorf("service %q", spans[0].Service)
	}
	if res := servetest.Chat(t, s.client, "after the shutdown of the tracing", 2); res.Status != 200 {
		t.Errorf("a request after the tracing's shutdown: %+v", res)
	}
}
