package wire

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// engines is the shared directory of real engine captures (see
// ../shared/data/README.md); tests that need it skip when it is absent.
const engines = "../../../shared/data/engines"

func readCapture(t *testing.T, parts ...string) []byte {
	t.Helper()
	path := filepath.Join(append([]string{engines}, parts...)...)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("engine capture %s not present (it lives in ../shared/data, outside the project)", path)
	}
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// collected is everything read from a stream.
type collected struct {
	content string
	finish  string
	usage   *Usage
	done    bool
	events  int
	errMsg  string
}

func collect(r io.Reader) (collected, error) {
	var c collected
	st := NewStream(r)
	for {
		ev, err := st.Next()
		if err == io.EOF {
			return c, nil
		}
		if err != nil {
			return c, err
		}
		c.events++
		c.content += ev.Content
		if ev.FinishReason != "" {
			c.finish = ev.FinishReason
		}
		if ev.Usage != nil {
			c.usage = ev.Usage
		}
		if ev.Err != "" {
			c.errMsg = ev.Err
		}
		c.done = c.done || ev.Done
	}
}

func TestStreamReadsRealCaptures(t *testing.T) {
	tests := []struct {
		file    string
		content string
		usage   Usage
		done    bool
	}{
		{"vllm-0.6-chat-stream-usage.sse", "The image depicts a serene", Usage{6421, 5, -1}, true},
		{"vllm-0.8-chat-stream-tail.sse", " a sequence", Usage{5, 2, -1}, false},
		{"sglang-2025-chat-stream-tail.sse", " on", Usage{5, 1, -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			data := readCapture(t, "sse", tt.file)
			c, err := collect(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			if c.content != tt.content {
				t.Errorf("content %q, want %q", c.content, tt.content)
			}
			if c.usage == nil || *c.usage != tt.usage {
				t.Errorf("usage %+v, want %+v", c.usage, tt.usage)
			}
			if c.done != tt.done {
				t.Errorf("done %v, want %v", c.done, tt.done)
			}
			if c.finish != "length" {
				t.Errorf("finish reason %q, want length", c.finish)
			}
			// Whatever follows [DONE] is never read.
			if tt.done {
				c, err := collect(io.MultiReader(bytes.NewReader(data), strings.NewReader("data: {not json\n\n"), errReader{}))
				if err != nil || !c.done || c.content != tt.content {
					t.Errorf("after [DONE]: %+v, %v", c, err)
				}
			}
		})
	}
}

// errReader fails every read.
type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("read past [DONE]") }

func TestStreamEdgeCases(t *testing.T) {
	long := strings.Repeat("x", 40<<10)
	tests := []struct {
		name    string
		in      string
		want    collected
		wantErr error
	}{
		{"crlf and comments", ": ping\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n",
			collected{content: "a", done: true, events: 2}, nil},
		{"no space after colon, other fields", "event: chunk\nid: 1\ndata:{\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
			collected{content: "b", events: 1}, nil},
		{"data split over lines", "data: {\"choices\":[{\"delta\":\ndata: {\"content\":\"c\"}}]}\n\n",
			collected{content: "c", events: 1}, nil},
		{"long line", "data: {\"choices\":[{\"delta\":{\"content\":\"" + long + "\"}}]}\n\n",
			collected{content: long, events: 1}, nil},
		{"unterminated [DONE]", "data: {\"choices\":[{\"delta\":{\"content\":\"d\"}}]}\n\ndata: [DONE]",
			collected{content: "d", done: true, events: 2}, nil},
		{"null content and usage", "data: {\"choices\":[{\"delta\":{\"content\":null},\"finish_reason\":null}],\"usage\":null}\n\n",
			collected{events: 1}, nil},
		{"reasoning is not content", "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hmm\"}}]}\n\n",
			collected{events: 1}, nil},
		{"cached tokens", "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n",
			collected{usage: &Usage{9, 2, 8}, events: 1}, nil},
		{"nested error in stream", "data: {\"error\":{\"message\":\"engine died\",\"code\":500}}\n\n",
			collected{errMsg: "engine died", events: 1}, nil},
		{"flat error in stream", "data: {\"object\":\"error\",\"message\":\"out of memory\",\"code\":500}\n\n",
			collected{errMsg: "out of memory", events: 1}, nil},
		{"cut mid-line", "data: {\"choices\":[{\"delta\":{\"content\":\"e\"}}]}\n\ndata: {\"choi",
			collected{content: "e", events: 1}, io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := collect(strings.NewReader(tt.in))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if c.content != tt.want.content || c.done != tt.want.done || c.events != tt.want.events || c.errMsg != tt.want.errMsg {
				t.Errorf("got %+v, want %+v", c, tt.want)
			}
			if (c.usage == nil) != (tt.want.usage == nil) || c.usage != nil && *c.usage != *tt.want.usage {
				t.Errorf("usage %+v, want %+v", c.usage, tt.want.usage)
			}
		})
	}
}

func TestStreamRejectsInvalidChunk(t *testing.T) {
	_, err := collect(strings.NewReader("data: {oops}\n\n"))
	if err == nil || !strings.Contains(err.Error(), "invalid stream chunk") {
		t.Errorf("error %v", err)
	}
}

func TestErrorMessageOnRealBodies(t *testing.T) {
	tests := []struct{ file, prefix string }{
		{"vllm-0.10-400-nested.json", "This model's maximum context length is 32768 tokens."},
		{"vllm-0.9-400-flat.json", "This model's maximum context length is 32768 tokens."},
		{"sglang-400-flat-as-pasted.txt", "The input (61709 tokens) is longer than the model's context length (40960 tokens)."},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got := ErrorMessage(readCapture(t, "errors", tt.file))
			if !strings.HasPrefix(got, tt.prefix) {
				t.Errorf("ErrorMessage = %q, want it to start with %q", got, tt.prefix)
			}
		})
	}
}

func TestErrorMessageShapes(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"error":{"message":"bad\nrequest","type":"invalid_request_error","code":"unsupported_parameter"}}`, "bad request"},
		{`{"error":"model not found"}`, "model not found"},
		{`{"object":"error","message":"flat","code":400}`, "flat"},
		{`{"detail":"Not Found"}`, "Not Found"},
		{`{"detail":[{"loc":["body"],"msg":"field required"}]}`, `[{"loc":["body"],"msg":"field required"}]`},
		{"upstream connect error or disconnect/reset before headers", "upstream connect error or disconnect/reset before headers"},
		{`{"message": "it\'s \u00e9t\u00e9", broken`, "it's été"},
		{"  ", ""},
		{strings.Repeat("y", 1000), strings.Repeat("y", 297) + "..."},
	}
	for _, tt := range tests {
		if got := ErrorMessage([]byte(tt.body)); got != tt.want {
			t.Errorf("ErrorMessage(%.40q) = %q, want %q", tt.body, got, tt.want)
		}
	}
}

func FuzzStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte(": c\r\n\r\ndata:{}\r\n\r\n"))
	f.Add([]byte("data: {\"error\":{\"message\":\"x\"}}\n\ndata: {\"choi"))
	f.Fuzz(func(t *testing.T, data []byte) {
		st := NewStream(bytes.NewReader(data))
		for range len(data) + 2 {
			if _, err := st.Next(); err != nil && !strings.Contains(err.Error(), "invalid stream chunk") {
				return
			}
		}
		t.Fatalf("more events than bytes in %q", data)
	})
}

// A line, or an event of many lines, longer than MaxEventBytes is an
// error, not held whole (a review: a server sending an endless line grew
// the replayer's memory without bound); one of MaxEventBytes is read.
func TestStreamEventTooLong(t *testing.T) {
	long := strings.Repeat("a", MaxEventBytes)
	for _, c := range []struct {
		name, body string
		err        error
	}{
		{"a line", "data: \"" + long + "\"\n\n", ErrEventTooLong},
		{"an endless line", "data: " + long + long, ErrEventTooLong},
		{"an event of lines", strings.Repeat("data: "+long[:MaxEventBytes/4]+"\n", 5) + "\n", ErrEventTooLong},
		{"at the bound", "data: {\"x\":\"" + long[:MaxEventBytes-8] + "\"}\n\n", nil},
	} {
		_, err := NewStream(strings.NewReader(c.body)).Next()
		if !errors.Is(err, c.err) {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
	}
}
