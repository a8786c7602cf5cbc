package emulator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/gorgo-llm/gorgo/internal/wire"
)

// The official OpenAI Go client holds a conversation through the
// emulator's Responses API with its store on, streamed and not: each
// follow-up opens with the conversation so far, which the replica has
// cached; GET returns a stored response; gorgo's relay reads the answers'
// ids, tokens and usage.
func TestResponsesConversation(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, Model: "qwen3.5", StoreResponses: true})
	client := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()
	question := strings.Repeat("Tell me about ships. ", 60)

	prev, prevTokens := "", int64(0)
	for turn := range 4 {
		params := responses.ResponseNewParams{Model: "qwen3.5", MaxOutputTokens: openai.Int(6),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(fmt.Sprintf("%s (turn %d)", question, turn))}}
		if prev != "" {
			params.PreviousResponseID = openai.String(prev)
		}
		var resp *responses.Response
		if turn%2 == 0 {
			var err error
			if resp, err = client.Responses.New(ctx, params); err != nil {
				t.Fatalf("turn %d: %v", turn, err)
			}
		} else {
			stream := client.Responses.NewStreaming(ctx, params)
			var text strings.Builder
			var created string
			for stream.Next() {
				switch ev := stream.Current(); ev.Type {
				case "response.created":
					created = ev.Response.ID
				case "response.output_text.delta":
					text.WriteString(ev.Delta)
				case "response.completed":
					r := ev.Response
					resp = &r
				}
				if p := wire.PeekChunk([]byte(stream.Current().RawJSON())); p.ResponseID != "" && p.ResponseID != created {
					t.Errorf("turn %d: gorgo reads the id %q in an event, the stream's is %q", turn, p.ResponseID, created)
				}
			}
			if err := stream.Err(); err != nil || resp == nil {
				t.Fatalf("turn %d: stream: %v", turn, err)
			}
			if created != resp.ID || text.String() != resp.OutputText() {
				t.Errorf("turn %d: created %q, completed %q; streamed %q, completed with %q", turn, created, resp.ID, text.String(), resp.OutputText())
			}
		}
		if !strings.HasPrefix(resp.ID, "resp_") || resp.Status != "completed" || len(strings.Fields(resp.OutputText())) != 6 {
			t.Errorf("turn %d: %s %s %q", turn, resp.ID, resp.Status, resp.OutputText())
		}
		u := resp.Usage
		if u.OutputTokens != 6 || u.TotalTokens != u.InputTokens+6 {
			t.Errorf("turn %d: usage %+v", turn, u)
		}
		// A follow-up's prompt is the conversation so far and its input:
		// more tokens than the last, the last's prompt cached.
		if turn > 0 && (u.InputTokens <= prevTokens+200 || u.InputTokensDetails.CachedTokens < prevTokens-16) {
			t.Errorf("turn %d: %d input tokens, %d cached, after a prompt of %d", turn, u.InputTokens, u.InputTokensDetails.CachedTokens, prevTokens)
		}
		prev, prevTokens = resp.ID, u.InputTokens
	}

	got, err := client.Responses.Get(ctx, prev, responses.ResponseGetParams{})
	if err != nil || got.ID != prev || got.Usage.InputTokens != prevTokens {
		t.Errorf("GET %s: %+v, %v", prev, got, err)
	}
	raw := get(t, url+"/v1/responses/"+prev)
	if wire.ResponseID(raw) != prev {
		t.Errorf("gorgo reads the id %q of %s", wire.ResponseID(raw), raw)
	}
	if n, cached := wire.PeekBody(raw); n != 6 || cached < 0 {
		t.Errorf("gorgo reads %d output tokens, %d cached of %s", n, cached, raw)
	}

	// Unknown ids are 404s, as vLLM's.
	_, err = client.Responses.New(ctx, responses.ResponseNewParams{Model: "qwen3.5", PreviousResponseID: openai.String("resp_gone"),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("and?")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("a follow-up of an unknown response: %v", err)
	}
	if _, err := client.Responses.Get(ctx, "resp_gone", responses.ResponseGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("GET of an unknown response: %v", err)
	}
	if status, body := postText(t, url+"/v1/responses/"+prev+"/cancel", ""); status != http.StatusBadRequest {
		t.Errorf("cancel of a finished response: %d %s", status, body)
	}
}

// Without StoreResponses (vLLM's default) a request's "store" is ignored,
// and with it "store": false keeps nothing: a follow-up is a 404.
func TestResponsesNotStored(t *testing.T) {
	for _, c := range []struct {
		name  string
		store bool
		body  string
	}{
		{"store off", false, `{"model":"m","input":"hi","max_output_tokens":2}`},
		{"store false", true, `{"model":"m","input":"hi","max_output_tokens":2,"store":false}`},
	} {
		_, url := start(t, Config{Speedup: 50, Model: "m", StoreResponses: c.store})
		status, body := postText(t, url+"/v1/responses", c.body)
		id := wire.ResponseID([]byte(body))
		if status != http.StatusOK || id == "" {
			t.Fatalf("%s: %d %s", c.name, status, body)
		}
		if status, body := postText(t, url+"/v1/responses", `{"model":"m","input":"and?","previous_response_id":"`+id+`"}`); status != http.StatusNotFound || !strings.Contains(body, "not found") {
			t.Errorf("%s: a follow-up: %d %s", c.name, status, body)
		}
	}
}

// The store is bounded: the oldest responses go first.
func TestResponseStoreIsBounded(t *testing.T) {
	var st responseStore
	for i := range maxStoredResponses + 10 {
		st.put(fmt.Sprint(i), storedResponse{conversation: []byte("c"), body: []byte("b")})
	}
	if _, ok := st.get("9"); ok {
		t.Error("the oldest kept past the count")
	}
	if _, ok := st.get("10"); !ok || len(st.byID) != maxStoredResponses || st.bytes != 2*maxStoredResponses {
		t.Errorf("%d kept, %d bytes", len(st.byID), st.bytes)
	}
	big := make([]byte, maxStoredBytes/3)
	for i := range 4 {
		st.put(fmt.Sprint("big", i), storedResponse{conversation: big})
	}
	if _, ok := st.get("big0"); ok || st.bytes > maxStoredBytes {
		t.Errorf("%d bytes kept, the oldest big one among them", st.bytes)
	}
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, raw)
	}
	return raw
}
