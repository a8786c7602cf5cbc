// Package prompt turns the prompt of an OpenAI-style request into what the
// engine model and the router reason about: an estimated token count and
// chained block hashes. The emulator, the replayer and the proxy share it,
// so that the same text always gives the same tokens and the same blocks.
//
// Tokens are estimated from bytes (BytesPerToken bytes per token, 4 by
// default, a common rule of thumb for English text and BPE vocabularies);
// a block is BlockTokens estimated tokens of the canonical prompt bytes.
package prompt

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/gorgo-llm/gorgo/internal/prefix"
)

// DefaultBytesPerToken is the estimator's default.
const DefaultBytesPerToken = 4

// Message is one chat message.
type Message struct {
	Role    string
	Content string
}

// Estimator estimates tokens from bytes. The zero value uses
// DefaultBytesPerToken.
type Estimator struct {
	BytesPerToken int
}

func (e Estimator) bpt() int {
	if e.BytesPerToken <= 0 {
		return DefaultBytesPerToken
	}
	return e.BytesPerToken
}

// Tokens estimates the tokens of text: ceil(len / BytesPerToken), at least 1
// for non-empty text.
func (e Estimator) Tokens(text []byte) int {
	b := e.bpt()
	return (len(text) + b - 1) / b
}

// Bytes returns how many bytes stand for n tokens.
func (e Estimator) Bytes(n int) int { return n * e.bpt() }

// Blocks appends to dst the chained hashes of text in blocks of blockTokens
// estimated tokens: len = ceil(Tokens(text) / blockTokens).
func (e Estimator) Blocks(text []byte, blockTokens int, dst []uint64) []uint64 {
	return prefix.Chain(text, blockTokens*e.bpt(), dst)
}

// Chat appends the canonical bytes of a chat prompt to dst: each message as
// its role, a newline, its content and a newline. A conversation that grows
// by appending messages grows by appending bytes, so its earlier turns'
// blocks stay a prefix of its later turns'.
func Chat(dst []byte, msgs []Message) []byte {
	for _, m := range msgs {
		dst = append(dst, m.Role...)
		dst = append(dst, '\n')
		dst = append(dst, m.Content...)
		dst = append(dst, '\n')
	}
	return dst
}

// WireMessage is a chat message as an OpenAI request carries it.
type WireMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// ChatRequestBytes returns the canonical bytes of a chat request's
// messages: at least one, each with a role and textual content.
func ChatRequestBytes(msgs []WireMessage) ([]byte, error) {
	if len(msgs) == 0 {
		return nil, errors.New("messages: at least one message is required")
	}
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, fmt.Errorf("messages[%d].role is required", i)
		}
		text, err := ContentText(m.Content)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		out[i] = Message{Role: m.Role, Content: text}
	}
	return Chat(nil, out), nil
}

// CompletionBytes returns the bytes of a completions request's prompt: a
// string, a list of one string, or a list of token ids (whose JSON then
// stands in for the text; a caller that needs the exact token count reads
// the list's length). Several prompts in one request are refused.
func CompletionBytes(raw json.RawMessage) ([]byte, error) {
	var one string
	var list []string
	var ids []int64
	switch {
	case len(raw) == 0 || string(raw) == "null":
	case json.Unmarshal(raw, &one) == nil:
		return []byte(one), nil
	case json.Unmarshal(raw, &list) == nil && len(list) == 1:
		return []byte(list[0]), nil
	case json.Unmarshal(raw, &ids) == nil && len(ids) > 0:
		return raw, nil
	}
	return nil, errors.New("prompt: one prompt is required: a string, a list of one string, or a list of token ids")
}

// ContentText returns the text of a chat message's content as an OpenAI
// request carries it: a string, null, or an array of content parts whose
// "text" parts are concatenated (other parts, such as images, are ignored).
func ContentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content must be a string or an array of content parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}
