package tracing_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/gorgo-llm/gorgo/internal/tracing"
	"github.com/gorgo-llm/gorgo/internal/tracing/tracingtest"
)

// A span keeps at most MaxAttributeLen bytes of a string attribute: the
// span queue is bounded in spans, and a client's strings must not make it
// unbounded in bytes.
func TestLongAttributesAreCut(t *testing.T) {
	rc := tracingtest.Start(t)
	tr, err := tracing.Start(tracing.Config{Endpoint: rc.URL}, tracing.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, sp := tr.Tracer().Start(context.Background(), "x")
	sp.SetAttributes(attribute.String("long", strings.Repeat("m", 1<<20)))
	sp.End()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	spans := rc.Spans()
	if len(spans) != 1 {
		t.Fatalf("%d spans exported, want 1", len(spans))
	}
	if got, _ := spans[0].Attrs["long"].(string); len(got) != tracing.MaxAttributeLen {
		t.Errorf("a 1 MiB attribute exported as %d bytes, want %d", len(got), tracing.MaxAttributeLen)
	}
}
