package epp

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/servetest"
	"github.com/gorgo-llm/gorgo/internal/tenant"
)

// operationFleet is a real fleet over two replicas that record the
// operations they are sent (path, body, Authorization, and X-Private
// where sent), answering each as SGLang does.
func operationFleet(t *testing.T) (*fleet.Fleet, *sync.Mutex, *[]string) {
	t.Helper()
	var mu sync.Mutex
	var got []string
	engine := func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/metrics" || r.URL.Path == "/is_sleeping" { // the router's scrape and probe
			return
		}
		mu.Lock()
		line := r.Method + " " + r.URL.Path + " " + string(body) + " " + r.Header.Get("Authorization")
		if p := r.Header.Get("X-Private"); p != "" {
			line += " X-Private " + p
		}
		got = append(got, line)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "Cache flushed.\n")
	}
	cfg := servetest.FleetConfig(fleet.Config{ProbeInterval: time.Hour}, servetest.Fake(t, engine), servetest.Fake(t, engine))
	reg := prometheus.NewRegistry()
	f, err := fleet.New(cfg, fleet.Options{Registry: reg, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	servetest.RunFleet(t, f)
	return f, &mu, &got
}

// The engines' operations that come through the gateway go to every
// replica, not the one endpoint the picker would name (2026-12-06: a
// gateway sent /flush_cache to one replica, whose answer said the fleet
// was flushed): the picker sends them itself and answers the gateway
// with the replicas' verdict, as gorgo serve does; with operations
// refused, a 403.
func TestOperationsGoToEveryReplica(t *testing.T) {
	f, mu, got := operationFleet(t)
	s, err := picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h := headers("/flush_cache", false, "authorization", "Bearer client", "connection", "keep-alive, x-private", "x-private", "hop")
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: h}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{}`), EndOfStream: true}}})
	imm := recv(t, s).GetImmediateResponse()
	if imm.GetStatus().GetCode() != 200 || string(imm.GetBody()) != "Cache flushed.\n" {
		t.Fatalf("flush answered %v", imm)
	}
	mu.Lock()
	if len(*got) != 2 || (*got)[0] != "POST /flush_cache {} Bearer client" || (*got)[1] != (*got)[0] {
		t.Errorf("the replicas were sent %q, want the flush at both", *got)
	}
	*got = nil
	mu.Unlock()

	// An abort, its body in one piece.
	s, err = picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/abort_request", false)}})
	recv(t, s)
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"abort_all":true}`), EndOfStream: true}}})
	if imm := recv(t, s).GetImmediateResponse(); imm.GetStatus().GetCode() != 200 {
		t.Fatalf("abort answered %v", imm)
	}
	mu.Lock()
	if len(*got) != 2 || !strings.HasPrefix((*got)[0], `POST /abort_request {"abort_all":true}`) {
		t.Errorf("the replicas were sent %q, want the abort at both", *got)
	}
	*got = nil
	mu.Unlock()

	// Its body in pieces (streamed, or past Envoy's partial buffer): it
	// cannot be read, and is refused, not sent to one endpoint (review,
	// 2026-12-06: routed by load to one).
	for _, c := range []struct {
		mode  filterv3.ProcessingMode_BodySendMode
		first string // the first piece
	}{{filterv3.ProcessingMode_STREAMED, `{"lora_name":"x",`}, {filterv3.ProcessingMode_BUFFERED_PARTIAL, `{"lora_name":"x",`}, {filterv3.ProcessingMode_STREAMED, ""}} {
		s, err = picker(t, f).Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/load_lora_adapter", false)},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: c.mode, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
		r := recv(t, s)
		if c.mode != filterv3.ProcessingMode_STREAMED {
			// Streamed, the headers' answer is the refusal: Envoy lets
			// them go on at it.
			s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(c.first)}}})
			r = recv(t, s)
		}
		if imm := r.GetImmediateResponse(); imm.GetStatus().GetCode() != 400 || !strings.Contains(string(imm.GetBody()), "whole body") {
			t.Errorf("%v, first piece %q: an operation whose body came in pieces was answered %v, want a 400", c.mode, c.first, imm)
		}
	}
	mu.Lock()
	if len(*got) != 0 {
		t.Errorf("operations in pieces reached %q", *got)
	}
	mu.Unlock()
	// A GET with no body at all goes to every replica.
	s, err = picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	get := headers("/flush_cache", true)
	get.Headers.Headers[1].RawValue = []byte("GET")
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: get}})
	if imm := recv(t, s).GetImmediateResponse(); imm.GetStatus().GetCode() != 200 {
		t.Fatalf("GET /flush_cache answered %v", imm)
	}
	mu.Lock()
	if len(*got) != 2 || !strings.HasPrefix((*got)[0], "GET /flush_cache") {
		t.Errorf("the replicas were sent %q, want the GET at both", *got)
	}
	*got = nil
	mu.Unlock()

	// The gateway's subset hint bounds the fan-out too.
	s, err = picker(t, f).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := f.Endpoint("b")
	st, _ := structpb.NewStruct(map[string]any{SubsetKey: []any{ep}})
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/flush_cache", true)},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: st}}})
	if imm := recv(t, s).GetImmediateResponse(); imm.GetStatus().GetCode() != 200 {
		t.Fatalf("a flush within a subset answered %v", imm)
	}
	mu.Lock()
	if len(*got) != 1 {
		t.Errorf("the replicas were sent %q, want the flush at b alone", *got)
	}
	*got = nil
	mu.Unlock()

	// Refused.
	pk := New(f, nil)
	pk.SetSettings(Settings{RefuseOperations: true})
	s, err = servePicker(t, pk).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/flush_cache", true)}})
	if imm := recv(t, s).GetImmediateResponse(); imm.GetStatus().GetCode() != 403 {
		t.Errorf("refused operations: %v, want a 403", imm)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(*got) != 0 {
		t.Errorf("a refused operation reached %q", *got)
	}
}

// Where the picker refuses the engines' operations to clients, a tenant
// the config names (engine_operations: true) may still send them, as
// through gorgo serve; another is refused.
func TestOperationsForTheTenantsNamed(t *testing.T) {
	var mu sync.Mutex
	sent := 0
	engine := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/flush_cache" {
			mu.Lock()
			sent++
			mu.Unlock()
		}
	}
	cfg := servetest.FleetConfig(fleet.Config{ProbeInterval: time.Hour,
		Tenants: map[string]tenant.Config{"trainer": {EngineOperations: true}, "chat": {}}}, servetest.Fake(t, engine), servetest.Fake(t, engine))
	f, err := fleet.New(cfg, fleet.Options{Registry: prometheus.NewRegistry(), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	servetest.RunFleet(t, f)
	pk := New(f, nil)
	pk.SetSettings(Settings{RefuseOperations: true, TenantHeader: tenant.HeaderTrust})
	for _, c := range []struct {
		tenant string
		want   int
	}{{"chat", 403}, {"trainer", 200}} {
		s, err := servePicker(t, pk).Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/flush_cache", true, "x-gorgo-tenant", c.tenant)}})
		if imm := recv(t, s).GetImmediateResponse(); int(imm.GetStatus().GetCode()) != c.want {
			t.Errorf("%s: %v, want %d", c.tenant, imm, c.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if sent != 2 {
		t.Errorf("the flush reached %d replicas, want the trainer's at both", sent)
	}
}
