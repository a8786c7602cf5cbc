package epp

import (
	"context"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gorgo-llm/gorgo/internal/admit"
)

// The request bodies the picker gathers are bounded one by one
// (max_body_bytes: a 413) and together (max_body_bytes_in_flight: a 503
// with Retry-After, the body no further gathered); a body's room is given
// back when its stream ends. 2026-12-07, a review: 64 streams each
// sending 8 MiB and never ending their bodies held 600 MiB, without
// bound.
func TestBodiesGatheredAreBounded(t *testing.T) {
	f := newFleet(t, admit.Config{})
	reg := prometheus.NewRegistry()
	pk := New(f, reg)
	pk.SetSettings(Settings{MaxBodyBytes: 1 << 20, MaxBodyBytesInFlight: 3 << 19})
	c := servePicker(t, pk)
	open := func() extprocv3.ExternalProcessor_ProcessClient {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a missing answer fails, not hangs
		t.Cleanup(cancel)
		s, err := c.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false)},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
		return s
	}
	send := func(s extprocv3.ExternalProcessor_ProcessClient, b string, end bool) {
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: end}}})
	}
	// piece sends the start of a chat of n bytes or so.
	piece := func(s extprocv3.ExternalProcessor_ProcessClient, n int) {
		send(s, `{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("x", n), false)
	}
	refusal := func(s extprocv3.ExternalProcessor_ProcessClient) (int, string) {
		t.Helper()
		imm := recv(t, s).GetImmediateResponse()
		if imm == nil {
			t.Fatal("no immediate answer")
		}
		retry := ""
		for _, h := range imm.GetHeaders().GetSetHeaders() {
			if h.GetHeader().GetKey() == "retry-after" {
				retry = string(h.GetHeader().GetRawValue())
			}
		}
		return int(imm.GetStatus().GetCode()), retry
	}

	big := open()
	piece(big, 1<<20+1)
	if code, _ := refusal(big); code != 413 {
		t.Errorf("a body past max_body_bytes: %d, want 413", code)
	}
	big.CloseSend()

	held := open() // 900 KiB gathered, its end not come
	piece(held, 900<<10)
	waitFor(t, "the first body to be gathered", func() bool { return pk.bodies.Used() >= 900<<10 })
	second := open()
	piece(second, 900<<10)
	if code, retry := refusal(second); code != 503 || retry == "" {
		t.Errorf("a second body past the budget: %d, Retry-After %q", code, retry)
	}
	if n := testutil.ToFloat64(pk.refused.WithLabelValues("max_body_bytes_in_flight")); n != 1 {
		t.Errorf("gorgo_refused_total{limit=max_body_bytes_in_flight} = %v, want 1 (as gorgo serve counts it)", n)
	}
	if n, err := testutil.GatherAndCount(reg, "gorgo_refused_total"); n != 1 || err != nil {
		t.Errorf("the registry has %d gorgo_refused_total series (%v), want 1", n, err)
	}
	second.CloseSend()
	held.CloseSend()
	waitFor(t, "the bodies' room to be given back as their streams end", func() bool { return pk.bodies.Used() == 0 })
	third := open()
	piece(third, 900<<10)
	send(third, `"}]}`, true)
	if r := recv(t, third); r.GetImmediateResponse() != nil {
		t.Errorf("with the others' streams ended, a body of 900 KiB was refused: %v", r.GetImmediateResponse().GetDetails())
	}
	third.CloseSend()
}

// The picker's access log names a request by the gateway's x-request-id
// where it is one to log, as gorgo serve's does (a review: a refusal's
// line carried one of 300 bytes with a control character, and served
// requests' lines none).
func TestLogIDIsPrintable(t *testing.T) {
	for id, want := range map[string]string{"req-1": "req-1", "": "", "a\x01b": "", strings.Repeat("x", 257): ""} {
		if got := (&exchange{requestID: id}).logID(); got != want {
			t.Errorf("x-request-id %.20q: logged as %.20q, want %q", id, got, want)
		}
	}
}
