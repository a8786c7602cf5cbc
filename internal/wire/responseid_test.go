package wire

import (
	"strings"
	"testing"
)

// vLLM's ResponsesResponse serialises its fields in declaration order:
// id, created_at, incomplete_details, instructions, metadata, model, then
// object (vllm/entrypoints/openai/responses/protocol.py). The request's
// instructions are echoed before "object", so the first bytes of a large
// answer (a front end reads only those: the epp's first body chunk, the
// proxy's first MaxAnswerBytes) may hold the id but not the object: a
// whole id that another member follows counts then.
func TestResponseIDVLLMOrderCutShort(t *testing.T) {
	body := `{"id":"resp_abc","created_at":1700000000,"incomplete_details":null,"instructions":"` +
		strings.Repeat("You are a helpful agent. ", 4000) + `","metadata":null,"model":"m","object":"response","output":[]}`
	if got := ResponseID([]byte(body)); got != "resp_abc" {
		t.Fatalf("whole body: %q", got)
	}
	cut := body[:16<<10] // a first chunk, inside the echoed instructions
	if got := ResponseID([]byte(cut)); got != "resp_abc" {
		t.Errorf("vLLM-shaped answer cut inside its instructions: ResponseID %q, want resp_abc", got)
	}
}
