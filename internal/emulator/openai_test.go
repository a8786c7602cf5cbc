package emulator

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// The official OpenAI Go client streams a chat completion from the
// emulator, with usage and cached tokens, and reads the model list.
func TestOfficialOpenAIClient(t *testing.T) {
	_, url := start(t, Config{Speedup: 50, Model: "qwen3.5"})
	client := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()

	models, err := client.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != "qwen3.5" {
		t.Fatalf("models: %+v, %v", models, err)
	}
	params := openai.ChatCompletionNewParams{
		Model:         "qwen3.5",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage(strings.Repeat("Tell me about ships. ", 60))},
		MaxTokens:     openai.Int(6),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	for turn := range 2 {
		stream := client.Chat.Completions.NewStreaming(ctx, params)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("turn %d: stream: %v", turn, err)
		}
		if got := len(strings.Fields(acc.Choices[0].Message.Content)); got != 6 {
			t.Errorf("turn %d: %d words of content, want 6", turn, got)
		}
		u := acc.Usage
		if u.CompletionTokens != 6 || u.PromptTokens < 300 {
			t.Errorf("turn %d: usage %+v", turn, u)
		}
		if cached := u.PromptTokensDetails.CachedTokens; (turn == 0) != (cached == 0) {
			t.Errorf("turn %d: %d cached tokens", turn, cached)
		}
	}
	// A non-streaming call, and an error the client understands.
	resp, err := client.Chat.Completions.New(ctx, params)
	if err != nil || resp.Choices[0].FinishReason != "length" {
		t.Errorf("non-streaming: %+v, %v", resp, err)
	}
	params.Model = "nope"
	_, err = client.Chat.Completions.New(ctx, params)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("unknown model: %v", err)
	}
}
