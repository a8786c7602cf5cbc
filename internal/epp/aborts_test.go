package epp

import (
	"context"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/gorgo-llm/gorgo/internal/admit"
)

// The picker reads a request's x-request-id, the id vLLM's engine knows
// it by (a chat's chatcmpl-ID), so that vLLM's /abort_requests naming it
// ends it before any replica has it, as through gorgo serve; a request of
// another id goes on (2026-12-06: the header's reading had no test of its
// own).
func TestAbortByVLLMIDThroughThePicker(t *testing.T) {
	f := newFleet(t, admit.Config{})
	c := picker(t, f)
	open := func(id string) extprocv3.ExternalProcessor_ProcessClient {
		s, err := c.Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers("/v1/chat/completions", false, "x-request-id", id)}})
		recv(t, s) // its headers read: it has arrived
		return s
	}
	aborted, kept := open("rid7"), open("rid8")
	time.Sleep(time.Millisecond) // the abort after both arrived, on any clock
	if _, named := f.core.Abort([]byte(`{"request_ids":["chatcmpl-rid7"]}`), time.Now()); !named {
		t.Fatal("the abort named no request")
	}
	body := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(chatBody), EndOfStream: true}}}
	aborted.Send(body)
	imm := recv(t, aborted).GetImmediateResponse()
	if imm.GetStatus().GetCode() != 200 || !strings.Contains(string(imm.GetBody()), `"finish_reason":"abort"`) {
		t.Errorf("the aborted request was answered %v, want its abort (a 200 whose finish_reason is abort)", imm)
	}
	kept.Send(body)
	if header, _ := destination(t, recv(t, kept)); header == "" {
		t.Error("a request of another id was not sent to a replica")
	}
}
