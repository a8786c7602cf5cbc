// Package wire reads the OpenAI wire format as OpenAI-compatible servers
// (SGLang, vLLM, OpenAI) speak it: the events of a streamed completion
// (Server-Sent Events carrying chat.completion.chunk objects, usage and
// in-stream errors) and the message of an error body. The replayer and the
// proxy share it.
package wire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Event is one server-sent event of a streamed chat completion.
type Event struct {
	// Done is set for the "data: [DONE]" sentinel that ends the stream.
	Done bool
	// Content is choices[0].delta.content, or, in a legacy completions
	// chunk, choices[0].text; empty when absent or null.
	Content string
	// Reasoning is choices[0].delta.reasoning_content (SGLang, vLLM) or
	// .reasoning (newer vLLM): tokens a reasoning model emits before its
	// answer. Empty when absent or null.
	Reasoning string
	// ToolCall is set when choices[0].delta.tool_calls is a non-empty
	// array: the model is writing a function call (its arguments are
	// generated tokens too).
	ToolCall bool
	// Delta is, in a Responses API stream, the "delta" of an event whose
	// "type" ends in ".delta" (response.output_text.delta,
	// response.function_call_arguments.delta, response.reasoning_text.delta
	// ...): generated text. Empty otherwise.
	Delta string
	// FinishReason is choices[0].finish_reason; empty while generating.
	FinishReason string
	// End says the event is an answer's last but for [DONE]: a usage with
	// no choice (an OpenAI stream's usage chunk), a Responses API
	// stream's response.completed or response.incomplete (Peek.End).
	End bool
	// Usage is the chunk's usage, nil when the chunk has none (or null).
	Usage *Usage
	// Err is the message of an error the server sent inside the stream
	// (for example {"error":{"message":...}}); empty otherwise.
	Err string
	// ResponseID is, in a Responses API stream, the id of the response an
	// event carries (response.created, .in_progress, .completed): the
	// engine stores the response under it. Empty otherwise.
	ResponseID string
}

// HasToken reports whether the event carries generated tokens: content,
// reasoning, a tool call's, or a Responses API delta. Tokens are timed
// from these events.
func (e *Event) HasToken() bool {
	return e.Content != "" || e.Reasoning != "" || e.ToolCall || e.Delta != ""
}

// Usage is the token accounting of a completion.
type Usage struct {
	// PromptTokens is usage.prompt_tokens.
	PromptTokens int
	// CompletionTokens is usage.completion_tokens.
	CompletionTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens, the prompt
	// tokens served from the engine's prefix cache; -1 when the server did
	// not report it (vLLM reports it only with
	// --enable-prompt-tokens-details, SGLang sends null details by default).
	CachedTokens int
}

// Stream reads the events of a text/event-stream body. It follows the SSE
// rules that matter for OpenAI streams: lines end with "\n" or "\r\n", an
// event is its "data:" lines joined by "\n" and ends at a blank line,
// comment lines (":...") and other fields are ignored. An event, and a
// line, may be up to MaxEventBytes long: a longer one is an error, so that
// a broken or hostile server cannot grow the reader's memory without
// bound, after which the stream is not to be read on. A Stream is not safe
// for concurrent use.
type Stream struct {
	r    *bufio.Reader
	data []byte
	line []byte
	done bool
}

// MaxEventBytes bounds an event's data, and a line, that a Stream holds:
// far more than an OpenAI stream's chunk of a token or a few.
const MaxEventBytes = 4 << 20

// ErrEventTooLong is returned for an event or a line longer than
// MaxEventBytes.
var ErrEventTooLong = fmt.Errorf("an event longer than %d bytes", MaxEventBytes)

// NewStream returns a Stream reading r.
func NewStream(r io.Reader) *Stream {
	return &Stream{r: bufio.NewReaderSize(r, 16<<10)}
}

// Next returns the next event. After the [DONE] event, or at the end of r,
// it returns io.EOF; a stream cut in the middle of a line gives
// io.ErrUnexpectedEOF, and a read error is returned as is. An event whose
// data is not valid JSON is an error; the stream may still be read on.
// A final event without the blank line after it is still returned.
func (s *Stream) Next() (Event, error) {
	if s.done {
		return Event{}, io.EOF
	}
	for {
		line, err := s.readLine()
		if err != nil && !(err == io.EOF && len(line) > 0) {
			if err == io.EOF && len(s.data) > 0 {
				return s.dispatch()
			}
			return Event{}, err
		}
		if len(line) == 0 {
			if len(s.data) > 0 {
				return s.dispatch()
			}
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte{':'})
		if string(field) != "data" {
			continue
		}
		value = bytes.TrimPrefix(value, []byte{' '})
		if len(s.data) > 0 && len(s.data)+1+len(value) > MaxEventBytes || len(value) > MaxEventBytes {
			return Event{}, ErrEventTooLong
		}
		if len(s.data) > 0 {
			s.data = append(s.data, '\n')
		}
		s.data = append(s.data, value...)
	}
}

// readLine returns the next line without its end of line. At the end of
// the input it returns a last unterminated line with io.EOF, or, when the
// input ends in the middle of a line inside an event, io.ErrUnexpectedEOF.
func (s *Stream) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		chunk, err := s.r.ReadSlice('\n')
		if len(s.line)+len(chunk) > MaxEventBytes+64 { // and its field name, end of line
			return nil, ErrEventTooLong
		}
		s.line = append(s.line, chunk...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF && len(s.line) > 0 {
			// An unterminated last line: complete if it is a whole
			// [DONE] or JSON value, cut otherwise.
			if !complete(s.line) {
				return nil, io.ErrUnexpectedEOF
			}
			return bytes.TrimRight(s.line, "\r"), io.EOF
		}
		if err != nil {
			return nil, err
		}
		return bytes.TrimRight(s.line[:len(s.line)-1], "\r"), nil
	}
}

// complete reports whether an unterminated last line is whole: a comment,
// a field other than data, or data holding [DONE] or a whole JSON value.
func complete(line []byte) bool {
	if line[0] == ':' {
		return true
	}
	field, v, ok := bytes.Cut(line, []byte{':'})
	if !ok {
		return false
	}
	if string(field) != "data" {
		return true
	}
	v = bytes.TrimSpace(v)
	return string(v) == "[DONE]" || json.Valid(v)
}

// dispatch turns the accumulated data into an Event.
func (s *Stream) dispatch() (Event, error) {
	data := s.data
	s.data = s.data[:0]
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		s.done = true
		return Event{Done: true}, nil
	}
	ev, err := ParseChunk(data)
	if err != nil {
		return Event{}, err
	}
	return ev, nil
}

// chunk is the part of a chat.completion.chunk (or of an error sent in its
// place) that the replayer and the proxy read.
type chunk struct {
	Object  string          `json:"object"`
	Message string          `json:"message"`
	Error   json.RawMessage `json:"error"`
	Type    string          `json:"type"`  // a Responses API event's
	Delta   json.RawMessage `json:"delta"` // a Responses API event's
	Choices []struct {
		Delta struct {
			Content          string          `json:"content"`
			ReasoningContent string          `json:"reasoning_content"`
			Reasoning        string          `json:"reasoning"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		Text         string `json:"text"` // legacy completions
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage    *chunkUsage `json:"usage"`
	Response *struct {
		ID    string      `json:"id"`
		Usage *chunkUsage `json:"usage"`
	} `json:"response"` // a Responses API event's (response.created, .completed)
}

// chunkUsage is a usage object: Chat Completions' fields or the Responses
// API's (a server sends one set).
type chunkUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokens        int `json:"input_tokens"`
	OutputTokens       int `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// usage is u as the Event says it.
func (u *chunkUsage) usage() *Usage {
	v := &Usage{PromptTokens: u.PromptTokens + u.InputTokens, CompletionTokens: u.CompletionTokens + u.OutputTokens, CachedTokens: -1}
	switch d, in := u.PromptTokensDetails, u.InputTokensDetails; {
	case d != nil && d.CachedTokens != nil:
		v.CachedTokens = *d.CachedTokens
	case in != nil && in.CachedTokens != nil:
		v.CachedTokens = *in.CachedTokens
	}
	return v
}

// ParseChunk decodes the data of one streamed event (a JSON chunk, not
// [DONE]).
func ParseChunk(data []byte) (Event, error) {
	var c chunk
	if err := json.Unmarshal(data, &c); err != nil {
		return Event{}, fmt.Errorf("invalid stream chunk %.80q: %w", data, err)
	}
	var ev Event
	if len(c.Choices) > 0 {
		ch := &c.Choices[0]
		ev.Content = ch.Delta.Content + ch.Text
		ev.Reasoning = ch.Delta.ReasoningContent + ch.Delta.Reasoning
		ev.ToolCall = nonEmptyArray(ch.Delta.ToolCalls)
		ev.FinishReason = ch.FinishReason
	}
	if strings.HasSuffix(c.Type, ".delta") {
		var d string
		if json.Unmarshal(c.Delta, &d) == nil {
			ev.Delta = d
		}
	}
	switch {
	case c.Usage != nil:
		ev.Usage = c.Usage.usage()
	case c.Response != nil && c.Response.Usage != nil:
		ev.Usage = c.Response.Usage.usage()
	}
	if c.Response != nil {
		ev.ResponseID = c.Response.ID
	}
	ev.End = c.Usage != nil && len(c.Choices) == 0 || c.Type == "response.completed" || c.Type == "response.incomplete"
	switch {
	case len(c.Error) > 0 && string(c.Error) != "null":
		ev.Err = ErrorMessage(data)
	case c.Object == "error":
		ev.Err = ErrorMessage(data)
	case c.Type == "error" || c.Type == "response.failed": // a Responses API stream's
		ev.Err = ErrorMessage(data)
	}
	return ev, nil
}

// nonEmptyArray reports whether raw is a JSON array with an element.
func nonEmptyArray(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '[' {
		return false
	}
	inner := bytes.TrimSpace(raw[1:])
	return len(inner) > 0 && inner[0] != ']'
}
