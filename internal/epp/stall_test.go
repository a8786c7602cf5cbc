package epp

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// A replica that passes its health checks and never answers what the
// picker routed to it (the gateway hears nothing back) is ejected by the
// fleet's stall check, and picked no more: the picker registers what it
// routes with its replica until the answer begins, as gorgo serve does.
func TestStalledReplicaIsPickedNoMore(t *testing.T) {
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
	eps := f.EndpointIDs()
	pk := picker(t, f)
	route := func() (string, extprocv3.ExternalProcessor_ProcessClient) {
		s, err := pk.Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false)},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}})
		recv(t, s)
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody), EndOfStream: true}}})
		hd, _ := destination(t, recv(t, s))
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
