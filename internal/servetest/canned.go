package servetest

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// cannedUpstream answers every completion at once with a canned answer: a
// chat.completion, or 17 content chunks, a finish chunk, a usage chunk and
// [DONE] (21 events), each flushed on its own.
// Canned is an upstream that answers every chat request at once with a
// precomputed answer: a ~1k-token prompt's usage and 17 tokens, whole or
// as a stream of 21 SSE events, each written on its own as an engine does.
func Canned(b testing.TB) string {
	b.Helper()
	body := `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"canned"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1000,"completion_tokens":17,"total_tokens":1017,"prompt_tokens_details":{"cached_tokens":0}}}`
	var events []string
	events = append(events, `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n")
	for range 17 {
		events = append(events, `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" tok"}}]}`+"\n\n")
	}
	events = append(events, `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n",
		`data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":17,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\n",
		"data: [DONE]\n\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/health" {
			return
		}
		if !bytes.Contains(data, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, body)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			io.WriteString(w, e)
			w.(http.Flusher).Flush()
		}
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}
