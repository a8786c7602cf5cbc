package emulator

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

type reviewUsage struct {
	ID    string `json:"id"`
	Usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

func reviewRespond(t *testing.T, url, body string) (int, reviewUsage, string) {
	t.Helper()
	status, raw := postText(t, url+"/v1/responses", body)
	var u reviewUsage
	_ = json.Unmarshal([]byte(raw), &u)
	return status, u, raw
}

// vLLM's ResponsesRequest.to_sampling_params takes
// min(max_output_tokens, max_model_len - prompt): a request (a follow-up
// whose conversation has grown) with max_output_tokens past the context
// left is served, its answer cut to the room left (2026-12-05: the
// emulator refused it with a 400, as it does a chat's max_tokens).
func TestFollowUpNearTheContextIsServed(t *testing.T) {
	p, _ := engine.LookupProfile("paper")
	p.MaxContextTokens = 2048
	_, url := start(t, Config{Speedup: 50, Model: "m", StoreResponses: true, Profile: p})
	input := strings.Repeat("Tell me about ships. ", 100) // some 500 tokens
	status, first, raw := reviewRespond(t, url, `{"model":"m","input":"`+input+`","max_output_tokens":700}`)
	if status != http.StatusOK {
		t.Fatalf("turn 1: %d %s", status, raw)
	}
	// The conversation is now ~1,200 tokens; with this input ~1,700, and
	// 700 more do not fit in 2,048: vLLM answers with the ~350 left.
	status, second, raw := reviewRespond(t, url, `{"model":"m","input":"`+input+`","max_output_tokens":700,"previous_response_id":"`+first.ID+`"}`)
	if status != http.StatusOK {
		t.Fatalf("a follow-up whose max_output_tokens passes the context left: %d %s (vLLM serves it, capped at the room left)", status, raw)
	}
	if second.Usage.InputTokens+second.Usage.OutputTokens > p.MaxContextTokens {
		t.Errorf("usage %+v past the context", second.Usage)
	}
}

// vLLM rebuilds a follow-up as the request's instructions, then the
// previous messages without their system (instructions) message, the
// previous output, and the new input (responses_utils.construct_input_messages:
// "instructions should NOT carry over across responses"), so that an
// application that sends its instructions with every turn (OpenAI's own
// guidance with previous_response_id) is charged them once (2026-12-05:
// the emulator prepended the whole stored prompt, so the prompt grew by
// the instructions each turn).
func TestFollowUpDoesNotRepeatInstructions(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, Model: "m", StoreResponses: true})
	instr := strings.Repeat("You are a careful assistant who answers briefly. ", 40) // some 400 tokens
	status, first, raw := reviewRespond(t, url, `{"model":"m","instructions":"`+instr+`","input":"hi","max_output_tokens":4}`)
	if status != http.StatusOK {
		t.Fatalf("turn 1: %d %s", status, raw)
	}
	status, second, raw := reviewRespond(t, url, `{"model":"m","instructions":"`+instr+`","input":"and?","max_output_tokens":4,"previous_response_id":"`+first.ID+`"}`)
	if status != http.StatusOK {
		t.Fatalf("turn 2: %d %s", status, raw)
	}
	// The follow-up's prompt: the instructions once, "hi", the 4-token
	// answer and "and?" — a few dozen tokens more than turn 1's, not
	// another copy of the instructions.
	if grew := second.Usage.InputTokens - first.Usage.InputTokens; grew > 100 {
		t.Errorf("turn 1 %d input tokens, turn 2 %d: the follow-up's prompt grew by %d, the instructions counted again",
			first.Usage.InputTokens, second.Usage.InputTokens, grew)
	}
}

// vLLM sends a streamed response's response.output_item.added and
// response.content_part.added with its first delta (serving_responses.py,
// "if not first_delta_sent"), after the request's wait in the engine's
// queue; only response.created and response.in_progress come at once.
// The emulator does the same (2026-12-05: it sent all four at once, so
// that through gorgo's proxy, whose firstEvent skips only wire.IsOpening's
// events, an emulated stream began while it was still queued).
func TestStreamOpensOnlyWithOpeningEventsWhileQueued(t *testing.T) {
	p, _ := engine.LookupProfile("paper")
	p.MaxRunning = 1
	s, url := start(t, Config{Profile: p})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// One long request holds the only running slot (in real time).
	busy, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chat("hello", 5000)))
	go func() {
		if resp, err := http.DefaultClient.Do(busy); err == nil {
			defer resp.Body.Close()
			_, _ = bufio.NewReader(resp.Body).ReadString(0)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if g, _ := s.drv.gauges(); g.Running == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the long request never ran")
		}
		time.Sleep(5 * time.Millisecond)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/responses", strings.NewReader(`{"model":"gorgo-emulated","input":"hi","stream":true,"max_output_tokens":3}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(300 * time.Millisecond)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				return
			}
			data, isData := strings.CutPrefix(line, "data: ")
			if isData && !wire.IsOpening([]byte(data)) {
				if g, _ := s.drv.gauges(); g.Waiting > 0 {
					t.Fatalf("while the request waits in the queue the stream sends %.80s…: gorgo reads the answer as begun", data)
				}
				return
			}
		case <-timeout:
			return // only opening events while queued
		}
	}
}
