package epp

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// A replica that passes its health checks and never answers what the
// picker routed to it (the gateway hears nothing back) is ejected by the
// fleet's stall check, and picked no more: the picker registers what it
// routes with its replica until the answer begins, as gorgo serve does.
func TestStalledReplicaIsPickedNoMore(t *testing.T) {
	f, pk := stallFleet(t)
	eps := f.EndpointIDs()
	route := func() (string, extprocv3.ExternalProcessor_ProcessClient) {
		s, err := pk.Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		hd, _ := destination(t, routeChat(t, s))
		ep, _, _ := strings.Cut(hd, ",")
		return eps[ep], s
	}
	// A stream that began (its headers, its first token) and decodes
	// long is no stall.
	began, s := route()
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
		Body: []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n")}}})
	recv(t, s)
	time.Sleep(time.Second) // three stall timeouts, probed every 50 ms
	if st, _ := f.Router().Replica(began); !st.Healthy {
		t.Fatalf("%s, its stream under way, was ejected", began)
	}
	s.CloseSend()

	first, s := route() // the gateway hears nothing back from it
	defer s.CloseSend()
	servetest.Eventually(t, "the replica that never answered to be ejected", func() bool {
		st, _ := f.Router().Replica(first)
		return !st.Healthy
	})
	if next, s := route(); next == first {
		t.Errorf("picked %s again, ejected as stalled", next)
	} else {
		s.CloseSend()
	}
}

const wholeChatBody = `{"model":"m","messages":[{"role":"user","content":"where should this go? a question long enough for a few blocks"}]}`

// stallFleet is a fleet of two replicas that pass their health checks and
// have no metrics, its stall timeout 300 ms, and a picker over it.
func stallFleet(t *testing.T) (*fleet.Fleet, extprocv3.ExternalProcessorClient) {
	idle := func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) } // health passes; no metrics
	cfg := servetest.FleetConfig(fleet.Config{ProbeInterval: 50 * time.Millisecond, ScrapeInterval: 50 * time.Millisecond, StallTimeout: 300 * time.Millisecond},
		servetest.Fake(t, idle), servetest.Fake(t, idle))
	f, err := fleet.New(cfg, fleet.Options{Registry: prometheus.NewRegistry(), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	servetest.RunFleet(t, f)
	servetest.Eventually(t, "both replicas probed", func() bool {
		a, _ := f.Router().Replica("a")
		b, _ := f.Router().Replica("b")
		return a.Available() && b.Available()
	})
	return f, picker(t, f)
}

// healthy reports whether replica id is up.
func healthy(f *fleet.Fleet, id string) bool { st, _ := f.Router().Replica(id); return st.Healthy }

// routeTo routes a chat request to replica id (the subset hint) with the
// response body mode given; false if the picker answered it directly.
func routeTo(t *testing.T, ctx context.Context, pk extprocv3.ExternalProcessorClient, f *fleet.Fleet, id, body string, mode filterv3.ProcessingMode_BodySendMode) (extprocv3.ExternalProcessor_ProcessClient, bool) {
	t.Helper()
	ep, _ := f.Endpoint(id)
	s, err := pk.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := structpb.NewStruct(map[string]any{SubsetKey: []any{ep}})
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false)},
		ProtocolConfig:  &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: mode},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: st}}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}})
	r := recv(t, s)
	if r.GetImmediateResponse() != nil {
		return s, false
	}
	if hd, _ := destination(t, r); !strings.HasPrefix(hd, ep) {
		t.Fatalf("routed to %s, not %s", hd, ep)
	}
	return s, true
}

// A stalled stream waits on a; clients of whole answers routed to a give
// up before its headers. Nothing of a began: a is ejected (review,
// 2026-12-06: each whole answer given up on counted as a's progress).
func TestAbortedWholeAnswerIsNoProgress(t *testing.T) {
	f, pk := stallFleet(t)
	s, _ := routeTo(t, context.Background(), pk, f, "a", chatBody, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	defer s.CloseSend()
	if !ejectedWhile(f, "a", func() {
		ctx, cancel := context.WithCancel(context.Background())
		routeTo(t, ctx, pk, f, "a", wholeChatBody, filterv3.ProcessingMode_BUFFERED)
		cancel() // the client gave up before the answer's headers
	}) {
		t.Fatal("a, its stream unanswered for 15 s, was not ejected: each aborted whole answer counted as its progress")
	}
}

// ejectedWhile does step every 50 ms until replica id is out, for at most
// 15 s; it reports whether it went out.
func ejectedWhile(f *fleet.Fleet, id string, step func()) bool {
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if !healthy(f, id) {
			return true
		}
		step()
	}
	return false
}

// The gateway says an endpoint the fleet does not know served the
// request: its tokens are no progress of the replica picked (review,
// 2026-12-06).
func TestUnknownServedEndpointIsNotThePicked(t *testing.T) {
	f, pk := stallFleet(t)
	s, _ := routeTo(t, context.Background(), pk, f, "a", chatBody, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	defer s.CloseSend()
	s2, _ := routeTo(t, context.Background(), pk, f, "a", chatBody, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	defer s2.CloseSend()
	served, _ := structpb.NewStruct(map[string]any{ServedKey: "10.9.9.9:8000"})
	s2.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{LBNamespace: served}}})
	recv(t, s2)
	if !ejectedWhile(f, "a", func() {
		s2.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n")}}})
		recv(t, s2)
	}) {
		t.Fatal("a, its stream unanswered for 15 s, was not ejected: 10.9.9.9:8000's tokens counted as its progress")
	}
}

// A stream whose response body Envoy buffers (BUFFERED): its tokens come
// only at its end. A healthy replica decoding it long is no stall
// (review, 2026-12-06).
func TestBufferedStreamIsNoStall(t *testing.T) {
	f, pk := stallFleet(t)
	s, _ := routeTo(t, context.Background(), pk, f, "a", chatBody, filterv3.ProcessingMode_BUFFERED)
	defer s.CloseSend()
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers("", false, ":status", "200")}})
	recv(t, s)
	time.Sleep(1500 * time.Millisecond) // five stall timeouts, probed every 50 ms
	if !healthy(f, "a") {
		t.Fatal("a, streaming an answer Envoy buffers, was ejected as stalled")
	}
}
