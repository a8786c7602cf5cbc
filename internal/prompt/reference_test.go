package prompt

// The encoding/json reading of a request's prompt, which ParseRequest
// replaced: the reference its tests and fuzzers hold it to.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
)

// WireMessage is a chat message as an OpenAI request carries it.
type WireMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

// ChatRequestBytes returns the canonical bytes of a chat request's
// messages: at least one, each with a role and textual content, and an
// assistant's tool calls on a line of their own.
func ChatRequestBytes(msgs []WireMessage) ([]byte, error) {
	text, _, err := chatRequestBytes(msgs)
	return text, err
}

// chatRequestBytes is ChatRequestBytes, and where its media stand
// (Request.Media).
func chatRequestBytes(msgs []WireMessage) ([]byte, []int, error) {
	if len(msgs) == 0 {
		return nil, nil, errors.New("messages: at least one message is required")
	}
	out := make([]Message, len(msgs))
	mediaLeft := maxMediaBytes
	var images []int
	at := 0 // where the message's content starts
	for i, m := range msgs {
		if m.Role == "" {
			return nil, nil, fmt.Errorf("messages[%d].role is required", i)
		}
		text, spans, err := ContentText(m.Content, &mediaLeft)
		if err != nil {
			return nil, nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		at += len(m.Role) + 1
		for _, s := range spans {
			images = append(images, at+s)
		}
		var calls []json.RawMessage
		if len(m.ToolCalls) > 0 && m.ToolCalls[0] == '[' && json.Unmarshal(m.ToolCalls, &calls) == nil && len(calls) > 0 {
			text += "\n" + string(m.ToolCalls) // its own line, raw
		}
		at += len(text) + 1
		out[i] = Message{Role: m.Role, Content: text}
	}
	return Chat(nil, out), images, nil
}

// CompletionBytes returns the bytes of a completions request's prompt: a
// string, a list of one string, or a list of token ids (whose JSON then
// stands in for the text; a caller that needs the exact token count reads
// the list's length); for a batch (a list of several strings, or a list of
// lists of token ids), each prompt followed by a newline, and where each
// ends (nil for one).
func CompletionBytes(raw json.RawMessage) (text []byte, ends []int, err error) {
	var one string
	var list []string
	var ids []int64
	var lists [][]int64
	switch {
	case len(raw) == 0 || string(raw) == "null":
	case json.Unmarshal(raw, &one) == nil:
		return []byte(one), nil, nil
	case json.Unmarshal(raw, &list) == nil && len(list) == 1:
		return []byte(list[0]), nil, nil
	case json.Unmarshal(raw, &list) == nil && len(list) > 1:
		for _, p := range list {
			text = append(text, p...)
			ends = append(ends, len(text))
			text = append(text, '\n')
		}
		return text, ends, nil
	case json.Unmarshal(raw, &ids) == nil && len(ids) > 0:
		return raw, nil, nil
	case json.Unmarshal(raw, &lists) == nil && len(lists) > 0 && !slices.ContainsFunc(lists, func(l []int64) bool { return len(l) == 0 }):
		var elems []json.RawMessage
		_ = json.Unmarshal(raw, &elems)
		for _, e := range elems {
			text = append(text, e...)
			if len(elems) > 1 {
				ends = append(ends, len(text))
				text = append(text, '\n')
			}
		}
		return text, ends, nil
	}
	return nil, nil, errors.New("prompt: want a string, a list of token ids, or a batch of them: a non-empty list of strings or of lists of token ids")
}

// ContentText returns the text of a chat message's content as an OpenAI
// request carries it: a string, null, or an array of content parts whose
// "text" parts are concatenated, and whose "image_url", "input_audio",
// "audio_url" and "video_url" parts stand for their media (appendMedia,
// while mediaLeft lasts; where they stand in the text, pairs of offsets);
// other parts are ignored.
func ContentText(raw json.RawMessage, mediaLeft *int) (string, []int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil, nil
	}
	var parts []struct {
		Type       string          `json:"type"`
		Text       string          `json:"text"`
		ImageURL   json.RawMessage `json:"image_url"`
		InputAudio json.RawMessage `json:"input_audio"`
		AudioURL   json.RawMessage `json:"audio_url"`
		VideoURL   json.RawMessage `json:"video_url"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", nil, errors.New("content must be a string or an array of content parts")
	}
	var est Estimator
	var b []byte
	var spans []int
	for _, p := range parts {
		var name string
		var value json.RawMessage
		switch p.Type {
		case "text":
			b = append(b, p.Text...)
			continue
		case "image_url":
			name, value = "image", p.ImageURL
		case "input_audio":
			name, value = "audio", p.InputAudio
		case "audio_url":
			name, value = "audio", p.AudioURL
		case "video_url":
			name, value = "video", p.VideoURL
		}
		if len(value) == 0 || value[0] != '"' && value[0] != '{' {
			continue
		}
		hash, length := referenceMediaKey(value)
		full := map[string]int{"image": est.ImageBytes(), "audio": est.AudioBytes(length), "video": est.VideoBytes()}[name]
		size := 0
		if *mediaLeft >= full {
			size, *mediaLeft = full, *mediaLeft-full
		}
		spans = append(spans, len(b))
		b = appendMedia(b, name, hash, size)
		spans = append(spans, len(b))
	}
	return string(b), spans, nil
}

// referenceMediaKey is mediaKey read with encoding/json: a string's hash
// and, as an audio clip's URL, its length (urlLength); an object's last
// "url" (the same) or "data" (its hash, clipLength) member that is a
// string, as they come; else the whole object's hash and audioURLSeconds.
func referenceMediaKey(v json.RawMessage) (uint64, time.Duration) {
	var s string
	if json.Unmarshal(v, &s) == nil {
		v = decoded(v)
		return xxhash.Sum64(v) | 1, urlLength(rawString(v))
	}
	hash, length := xxhash.Sum64(v)|1, audioURLSeconds*time.Second
	d := json.NewDecoder(bytes.NewReader(v))
	if _, err := d.Token(); err != nil {
		return hash, length
	}
	for d.More() {
		k, err := d.Token()
		if err != nil {
			break
		}
		var m json.RawMessage
		if err := d.Decode(&m); err != nil {
			break
		}
		if m[0] != '"' {
			continue
		}
		m = decoded(m)
		switch k {
		case "url":
			hash, length = xxhash.Sum64(m)|1, urlLength(rawString(m))
		case "data":
			hash, length = xxhash.Sum64(m)|1, clipLength(rawString(m))
		}
	}
	return hash, length
}

// decoded is a JSON string with its escapes decoded, in quotes (as is
// without escapes): the string the engines read.
func decoded(v json.RawMessage) json.RawMessage {
	v = bytes.TrimSpace(v)
	if bytes.IndexByte(v, '\\') < 0 {
		return v
	}
	var s string
	_ = json.Unmarshal(v, &s)
	return append(append(json.RawMessage{'"'}, s...), '"')
}

// rawString is a JSON string's bytes between its quotes, escapes and all
// (the base64 data a request carries is read so).
func rawString(v json.RawMessage) []byte { return bytes.TrimSpace(v)[1 : len(bytes.TrimSpace(v))-1] }
