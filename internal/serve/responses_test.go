package serve

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// Conversations through the whole router with the official OpenAI Go
// client, over three emulated replicas that each store their own
// responses (vLLM with its store on): every follow-up reaches the replica
// that holds the conversation, streamed or not, and finds it cached
// there at once, though the policy (round-robin) would send each turn
// elsewhere; a GET of the last response is answered.
func TestResponsesConversationsThroughTheRouter(t *testing.T) {
	cfg := emulator.Config{Model: "m", StoreResponses: true}
	reps := []*replica{servetest.StartReplicaWith(t, 5*time.Millisecond, cfg), servetest.StartReplicaWith(t, 10*time.Millisecond, cfg),
		servetest.StartReplicaWith(t, 15*time.Millisecond, cfg)}
	s := startRouter(t, Config{Config: fleet.Config{ProbeInterval: time.Hour, Policy: "round-robin"}}, Options{}, reps...)
	client := openai.NewClient(option.WithBaseURL(s.client+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()
	for c := range 6 {
		prev, prevTokens := "", int64(0)
		for turn := range 4 {
			params := responses.ResponseNewParams{Model: "m", MaxOutputTokens: openai.Int(4),
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(fmt.Sprintf("conversation %d, turn %d: %s", c, turn, strings.Repeat("where is my parcel? ", 30)))}}
			if prev != "" {
				params.PreviousResponseID = openai.String(prev)
			}
			var resp *responses.Response
			if (c+turn)%2 == 0 {
				var err error
				if resp, err = client.Responses.New(ctx, params); err != nil {
					t.Fatalf("conversation %d turn %d: %v", c, turn, err)
				}
			} else {
				stream := client.Responses.NewStreaming(ctx, params)
				for stream.Next() {
					if ev := stream.Current(); ev.Type == "response.completed" {
						r := ev.Response
						resp = &r
					}
				}
				if err := stream.Err(); err != nil || resp == nil {
					t.Fatalf("conversation %d turn %d: stream: %v", c, turn, err)
				}
			}
			if u := resp.Usage; turn > 0 && (u.InputTokens <= prevTokens || u.InputTokensDetails.CachedTokens < prevTokens-16) {
				t.Errorf("conversation %d turn %d: %d input tokens, %d cached, after a prompt of %d: not the conversation's replica's cache",
					c, turn, u.InputTokens, u.InputTokensDetails.CachedTokens, prevTokens)
			}
			prev, prevTokens = resp.ID, resp.Usage.InputTokens
		}
		if got, err := client.Responses.Get(ctx, prev, responses.ResponseGetParams{}); err != nil || got.ID != prev {
			t.Errorf("conversation %d: GET %s: %v", c, prev, err)
		}
	}
	posts := int64(0)
	for i, r := range reps {
		if r.Served() == 0 {
			t.Errorf("replica %d took no conversation", i)
		}
		posts += r.Served()
	}
	if posts != 6*4 { // a follow-up sent elsewhere first is a 404 there, then tried on the next
		t.Errorf("%d requests reached the replicas for 24 turns", posts)
	}
}
