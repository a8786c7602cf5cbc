package epp

import (
	"context"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gorgo-llm/gorgo/internal/lifecycle"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

type countingHealth struct {
	mu       sync.Mutex
	failures []string
}

func (h *countingHealth) Failure(id string) {
	h.mu.Lock()
	h.failures = append(h.failures, id)
	h.mu.Unlock()
}
func (h *countingHealth) Success(string)           {}
func (h *countingHealth) ModelMissing(_, _ string) {}

// The gateway was told [a b] and fell back to b; b was marked down before
// its answer's headers came. The lifecycle's later attempts mirror the
// gateway's, from the list it was given, not ranked again: a replica the
// gateway was never told of is not charged "the gateway fell back"
// (review, 2026-12-06).
func TestNoRerankWhereTheGatewaySends(t *testing.T) {
	p, _ := policy.New(policy.DefaultName, policy.Options{})
	rt, err := router.New(router.Config{Policy: p, BlockTokens: 16, TieMargin: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"a", "b", "c"} {
		rt.Add(router.ReplicaConfig{ID: id, KVCapacityTokens: 1 << 20, PrefillMSPerToken: 0.06, QueueMSPerToken: 0.06})
		rt.ObserveRTT(id, time.Duration(10+40*i)*time.Millisecond)
	}
	rt.SetHealthy("c", false)
	h := &countingHealth{}
	core := lifecycle.NewCore(lifecycle.Config{Router: rt, BlockTokens: 16, MaxAttempts: 3, Start: time.Now(), Seed: 1, Health: h})
	f := &testFleet{core: core, eps: map[string]string{"a": "10.0.0.1:8000", "b": "10.0.0.2:8000", "c": "10.0.0.3:8000"}}
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if hd, _ := destination(t, routeChat(t, s)); hd != "10.0.0.1:8000,10.0.0.2:8000" {
		t.Fatalf("the gateway was told %q", hd)
	}
	rt.SetHealthy("b", false) // ejected meanwhile
	rt.SetHealthy("c", true)  // back from its ejection
	served, _ := structpb.NewStruct(map[string]any{ServedKey: "10.0.0.2:8000"})
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{LBNamespace: served}}})
	s.CloseSend()
	for {
		if _, err := s.Recv(); err != nil {
			break
		}
	}
	// The stream ended: Serve returned, its failures recorded.
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range h.failures {
		if id == "c" {
			t.Fatalf("failures charged %v: c was never sent the request", h.failures)
		}
	}
}
