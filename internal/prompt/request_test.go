package prompt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"gopkg.in/yaml.v3"

	"github.com/gorgo-llm/gorgo/internal/jsonrecipe"
)

// reference parses a request body the old way: encoding/json into the
// structs the emulator and the proxy used, then ChatRequestBytes or
// CompletionBytes.
func reference(body []byte, chat bool) (Request, error) {
	type options struct {
		IncludeUsage bool `json:"include_usage"`
	}
	out := Request{MaxTokens: -1}
	var (
		text      []byte
		err       error
		max       *int
		opts      *options
		stream    bool
		minTokens json.RawMessage // a hint
	)
	if chat {
		var in struct {
			Model               string          `json:"model"`
			Messages            []WireMessage   `json:"messages"`
			MaxTokens           *int            `json:"max_tokens"`
			MaxCompletionTokens *int            `json:"max_completion_tokens"`
			Stream              bool            `json:"stream"`
			StreamOptions       *options        `json:"stream_options"`
			User                string          `json:"user"`
			N                   json.RawMessage `json:"n"`
			MinTokens           json.RawMessage `json:"min_tokens"`
			Tools               json.RawMessage `json:"tools"`
		}
		if err := json.Unmarshal(body, &in); err != nil {
			return out, err
		}
		text, out.Media, err = chatRequestBytes(in.Messages)
		// Tools: a non-empty array (anything else is none), raw, first.
		var tools []json.RawMessage
		if t := bytes.TrimSpace(in.Tools); len(t) > 0 && t[0] == '[' && json.Unmarshal(t, &tools) == nil && len(tools) > 0 && err == nil {
			text = append(append(append([]byte("tools\n"), t...), '\n'), text...)
			out.Tools = len(t) + len("tools\n\n")
			for i := range out.Media {
				out.Media[i] += out.Tools
			}
		}
		n := 0 // the opening system or developer messages
		for n < len(in.Messages) && (in.Messages[n].Role == "system" || in.Messages[n].Role == "developer") {
			n++
		}
		if opening, err := ChatRequestBytes(in.Messages[:n]); n > 0 && err == nil {
			out.Instructions = len(opening)
		}
		max = in.MaxTokens
		if in.MaxCompletionTokens != nil {
			max = in.MaxCompletionTokens
		}
		out.Model, out.User, stream, opts = in.Model, in.User, in.Stream, in.StreamOptions
		out.N = hintOf(in.N, HintN, 1, 1<<16, 1, &out.Odd)
		minTokens = in.MinTokens
	} else {
		var in struct {
			Model         string          `json:"model"`
			Prompt        json.RawMessage `json:"prompt"`
			MaxTokens     *int            `json:"max_tokens"`
			Stream        bool            `json:"stream"`
			StreamOptions *options        `json:"stream_options"`
			User          string          `json:"user"`
			N             json.RawMessage `json:"n"`
			BestOf        json.RawMessage `json:"best_of"`
			MinTokens     json.RawMessage `json:"min_tokens"`
		}
		if err := json.Unmarshal(body, &in); err != nil {
			return out, err
		}
		text, out.PromptEnds, err = CompletionBytes(in.Prompt)
		max = in.MaxTokens
		out.Model, out.User, stream, opts = in.Model, in.User, in.Stream, in.StreamOptions
		out.N = hintOf(in.N, HintN, 1, 1<<16, 1, &out.Odd)
		out.BestOf = hintOf(in.BestOf, HintBestOf, 1, 1<<16, 0, &out.Odd)
		minTokens = in.MinTokens
	}
	if err != nil {
		return out, err
	}
	out.Text, out.Stream = text, stream
	out.IncludeUsage = opts != nil && opts.IncludeUsage
	if max != nil {
		out.MaxTokens, out.HasMaxTokens = *max, true
	}
	out.MinTokens = hintOf(minTokens, HintMinTokens, 0, 1<<24, 0, &out.Odd)
	return out, nil
}

// hintOf is what a hint takes from its raw value: a whole number from lo
// to hi (hi when more), or a string of one; else def, and, unless the
// value is absent or null, h marked in odd.
func hintOf(raw json.RawMessage, h Hints, lo, hi, def int, odd *Hints) int {
	if len(raw) == 0 || string(raw) == "null" {
		return def
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= int64(lo) {
			return int(min(n, int64(hi)))
		}
	} else if f := 0.0; json.Unmarshal(raw, &f) == nil && f == math.Trunc(f) && f >= float64(lo) {
		return int(min(f, float64(hi)))
	}
	*odd |= h
	return def
}

// imageOf is what stands for an image part whose "image_url" is v.
func imageOf(v string) []byte {
	return appendMedia(nil, "image", xxhash.Sum64String(v)|1, Estimator{}.ImageBytes())
}

// same reports how got and want differ ("" if they do not).
func same(got, want Request) string {
	if want.N == 0 {
		want.N = 1 // the cases leave it out
	}
	if len(got.PromptEnds) == 0 && len(want.PromptEnds) == 0 {
		got.PromptEnds, want.PromptEnds = nil, nil // a reused buffer, or none
	}
	if len(got.Media) == 0 && len(want.Media) == 0 {
		got.Media, want.Media = nil, nil
	}
	if !bytes.Equal(got.Text, want.Text) {
		return fmt.Sprintf("text %q, want %q", got.Text, want.Text)
	}
	got.Text, want.Text = nil, nil
	if !reflect.DeepEqual(got, want) {
		return fmt.Sprintf("%+v, want %+v", got, want)
	}
	return ""
}

// topKeys counts the top-level keys of a JSON object that encoding/json
// would match to name.
func topKeys(body []byte, name string) int {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return 0
	}
	n := 0
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return n
		}
		if k, _ := t.(string); strings.EqualFold(k, name) {
			n++
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return n
		}
	}
	return n
}

// check compares ParseRequest with the reference on one body.
func check(t *testing.T, body []byte, chat bool) {
	t.Helper()
	want, werr := reference(body, chat)
	r := Request{Text: []byte("left over"), Model: "old model", User: "old user", Stream: true}
	err := ParseRequest(body, chat, &r)
	switch {
	case err != nil && werr != nil:
	case err != nil:
		t.Fatalf("ParseRequest(%q, chat=%v) refused (%v); encoding/json reads %+v (text %q)", body, chat, err, want, want.Text)
	case werr != nil:
		t.Fatalf("ParseRequest(%q, chat=%v) accepted (%+v, text %q); encoding/json refuses: %v", body, chat, r, r.Text, werr)
	default:
		if d := same(r, want); d != "" {
			t.Fatalf("ParseRequest(%q, chat=%v): %s", body, chat, d)
		}
	}
}

var requestCases = []struct {
	name string
	chat bool
	body string
	want Request // compared when wantErr is ""
	err  string  // a substring of the error
}{
	{name: "chat basic", chat: true,
		body: `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true},"user":"u1"}`,
		want: Request{Text: []byte("system\nbe brief\nuser\nhi\n"), Model: "m", MaxTokens: 7, HasMaxTokens: true, Stream: true, IncludeUsage: true, User: "u1", Instructions: 16}},
	{name: "instructions", chat: true,
		body: `{"messages":[{"role":"developer","content":"a"},{"role":"system","content":"b"},{"role":"user","content":"c"},{"role":"system","content":"d"}]}`,
		want: Request{Text: []byte("developer\na\nsystem\nb\nuser\nc\nsystem\nd\n"), MaxTokens: -1, Instructions: 21}},
	{name: "no opening instructions", chat: true,
		body: `{"messages":[{"role":"user","content":"c"},{"role":"system","content":"d"}]}`,
		want: Request{Text: []byte("user\nc\nsystem\nd\n"), MaxTokens: -1}},
	{name: "content parts", chat: true,
		body: `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},null,{"text":"b","type":"text"},{"type":"input_audio","text":"ignored"}]}]}`,
		want: Request{Text: slices.Concat([]byte("user\na"), imageOf(`"x"`), []byte("b\n")), MaxTokens: -1, Media: []int{6, 6 + 4096}}},
	// An image stands for its tokens, named by its value's hash: the
	// same image gives the same bytes, another image others.
	{name: "images", chat: true,
		body: `{"messages":[{"role":"user","content":[{"image_url":"data:image/png;base64,AAAA","type":"image_url"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}},{"type":"image_url","image_url":null},{"type":"image_url"},{"type":"image_url","image_url":7}]}]}`,
		want: Request{Text: slices.Concat([]byte("user\n"), imageOf(`"data:image/png;base64,AAAA"`), imageOf(`"https://x/y.png"`), []byte("\n")), MaxTokens: -1,
			Media: []int{5, 5 + 4096, 5 + 4096, 5 + 2*4096}}},
	// An assistant's tool calls are its prompt too, on a line of their own.
	{name: "tool calls", chat: true,
		body: `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"},{"role":"assistant","content":"y","tool_calls":[]}]}`,
		want: Request{Text: []byte("user\nx\nassistant\n\n[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]\ntool\n42\nassistant\ny\n"), MaxTokens: -1}},
	{name: "null and absent content, empty parts", chat: true,
		body: `{"messages":[{"role":"a","content":null},{"role":"b"},{"role":"c","content":[]},{"role":"d","content":""}]}`,
		want: Request{Text: []byte("a\n\nb\n\nc\n\nd\n\n"), MaxTokens: -1}},
	{name: "escapes", chat: true,
		body: `{"messages":[{"role":"us\u0065r","content":"line\nbreak \"quoted\" tab\t back\\slash \/ \u00e9t\u00e9 \ud83d\ude00 \b\f\r"}]}`,
		want: Request{Text: []byte("user\nline\nbreak \"quoted\" tab\t back\\slash / été 😀 \b\f\r\n"), MaxTokens: -1}},
	{name: "bad surrogates and invalid UTF-8 become U+FFFD", chat: true,
		body: "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800 \\ud800\\u0041 \\udc00\\ud800 x\xffy \xe2\x82\"}]}",
		want: Request{Text: []byte("user\n\uFFFD \uFFFDA \uFFFD\uFFFD x\uFFFDy \uFFFD\uFFFD\n"), MaxTokens: -1}},
	{name: "raw UTF-8", chat: true,
		body: `{"messages":[{"role":"user","content":"日本語 – ✓"}]}`,
		want: Request{Text: []byte("user\n日本語 – ✓\n"), MaxTokens: -1}},
	{name: "max_completion_tokens wins", chat: true,
		body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_completion_tokens":9}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: 9}},
	{name: "null max_completion_tokens falls back", chat: true,
		body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_completion_tokens":null}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: 5}},
	{name: "null fields", chat: true,
		body: `{"model":null,"messages":[{"role":"user","content":"x"}],"max_tokens":null,"stream":null,"stream_options":null,"user":null}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1}},
	{name: "include_usage null or false", chat: true,
		body: `{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":false,"other":[1]}}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1}},
	{name: "keys fold case, last wins", chat: true,
		body: `{"MODEL":"a","model":"b","Messages":[{"ROLE":"user","Content":"x","content":"y"}],"stream":true,"Stream":null,"max_tokens":1,"MAX_TOKENS":2}`,
		want: Request{Text: []byte("user\ny\n"), Model: "b", MaxTokens: 2, Stream: true}},
	{name: "Unicode folding: long s and Kelvin sign", chat: true,
		body: `{"ſtream":true,"messages":[{"role":"user","content":"x"}],"max_to\u212Aens":1}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: 1, Stream: true}},
	{name: "stream_options merge like encoding/json", chat: true,
		body: `{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true},"stream_options":{},"stream_options":{"include_usage":null}}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1, IncludeUsage: true}},
	{name: "stream_options null resets", chat: true,
		body: `{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true},"stream_options":null}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1}},
	{name: "other fields of any type", chat: true,
		body: `{"messages":[{"role":"user","content":"x","name":5,"tool_calls":7}],"temperature":0.5,"tool_choice":{"a":[1]},"prompt":7,"n":null}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1}},
	// The engines' chat templates render a chat's tools into the prompt,
	// most at its start: they come first, raw, wherever the body has them.
	{name: "tools", chat: true,
		body: `{"messages":[{"role":"system","content":"s"},{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}`,
		want: Request{Text: []byte("tools\n[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]\nsystem\ns\nuser\nx\n"), MaxTokens: -1, Instructions: 9, Tools: 68}},
	{name: "tools first", chat: true,
		body: `{"Tools": [ {"type":"function"} ] ,"messages":[{"role":"user","content":"x"}]}`,
		want: Request{Text: []byte("tools\n[ {\"type\":\"function\"} ]\nuser\nx\n"), MaxTokens: -1, Tools: 30}},
	{name: "tools null or empty", chat: true,
		body: `{"tools":[{"type":"function"}],"messages":[{"role":"user","content":"x"}],"tools":null}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1}},
	{name: "tools empty", chat: true,
		body: `{"tools":[ ],"messages":[{"role":"user","content":"x"}]}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1}},
	{name: "tools of a completion", chat: false,
		body: `{"prompt":"p","tools":5}`,
		want: Request{Text: []byte("p"), MaxTokens: -1}},
	{name: "tools not an array", chat: true,
		body: `{"messages":[{"role":"user","content":"x"}],"tools":{"type":"function"},"tools":5}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1}},
	{name: "white space", chat: true,
		body: " \n{ \"messages\" :\t[ { \"role\" : \"user\" , \"content\" : [ { \"type\" : \"text\" , \"text\" : \"x\" } ] } ] } \r\n",
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1}},
	{name: "max_tokens -0", chat: true,
		body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":-0}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: 0}},

	{name: "completion string", body: `{"model":"m","prompt":"once\nupon","max_tokens":3,"stream":true}`,
		want: Request{Text: []byte("once\nupon"), Model: "m", MaxTokens: 3, Stream: true}},
	{name: "completion list of one", body: `{"prompt":["once"]}`,
		want: Request{Text: []byte("once"), MaxTokens: -1}},
	{name: "completion token ids", body: `{"prompt":[1, 2 ,3]}`,
		want: Request{Text: []byte("[1, 2 ,3]"), MaxTokens: -1}},
	{name: "completion token ids with a null", body: `{"prompt":[1,null]}`,
		want: Request{Text: []byte("[1,null]"), MaxTokens: -1}},
	{name: "completion list of one null", body: `{"prompt":[null]}`,
		want: Request{MaxTokens: -1}},
	{name: "completion ignores max_completion_tokens and messages", body: `{"prompt":"p","max_completion_tokens":"x","messages":3}`,
		want: Request{Text: []byte("p"), MaxTokens: -1}},

	{name: "chat n", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"n":4,"best_of":9}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1, N: 4}},
	{name: "chat n a whole float", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"n":4.0}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1, N: 4}},
	{name: "chat n null after a count", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"n":4,"N":null}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1}},
	{name: "chat n a string of a count", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"n":"4"}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1, N: 4}},
	{name: "chat n a string of no count", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"n":"4.5"}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1, Odd: HintN}},
	{name: "chat n an escaped string", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"n":"\u0034"}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1, N: 4}},
	{name: "chat n fractional, zero, huge", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"n":2.5,"n":0,"n":1e300}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1, N: 1 << 16}},
	{name: "chat n zero", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"n":0}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1, Odd: HintN}},
	{name: "chat n fractional", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"n":2.5}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1, Odd: HintN}},
	{name: "completion best_of odd, min_tokens negative", body: `{"prompt":"p","best_of":true,"min_tokens":-1}`,
		want: Request{Text: []byte("p"), MaxTokens: -1, Odd: HintBestOf | HintMinTokens}},
	{name: "huge min_tokens", body: `{"prompt":"p","min_tokens":1e30}`,
		want: Request{Text: []byte("p"), MaxTokens: -1, MinTokens: 1 << 24}},
	{name: "completion batch of strings", body: `{"prompt":["a","bc"],"n":2}`,
		want: Request{Text: []byte("a\nbc\n"), MaxTokens: -1, N: 2, PromptEnds: []int{1, 4}}},
	{name: "completion batch of token id lists", body: `{"prompt":[[1,2], [3,null]]}`,
		want: Request{Text: []byte("[1,2]\n[3,null]\n"), MaxTokens: -1, PromptEnds: []int{5, 14}}},
	{name: "completion batch of one token id list", body: `{"prompt":[[1,2]]}`,
		want: Request{Text: []byte("[1,2]"), MaxTokens: -1}},
	{name: "completion batch of nulls", body: `{"prompt":[null,null]}`,
		want: Request{Text: []byte("\n\n"), MaxTokens: -1, PromptEnds: []int{0, 1}}},
	{name: "chat min_tokens", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"min_tokens":12,"max_tokens":40}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: 40, HasMaxTokens: true, MinTokens: 12}},
	// ignore_eos is not read (see MinTokens).
	{name: "completion min_tokens, ignore_eos", body: `{"prompt":"p","ignore_eos":true,"min_tokens":3,"max_tokens":40}`,
		want: Request{Text: []byte("p"), MaxTokens: 40, HasMaxTokens: true, MinTokens: 3}},
	{name: "min_tokens of other types", body: `{"prompt":"p","min_tokens":2.5,"max_tokens":9}`,
		want: Request{Text: []byte("p"), MaxTokens: 9, HasMaxTokens: true, Odd: HintMinTokens}},
	{name: "min_tokens a string", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"min_tokens":"7"}`,
		want: Request{Text: []byte("user\nx\n"), MaxTokens: -1, MinTokens: 7}},
	{name: "completion best_of", body: `{"prompt":"p","n":2,"best_of":5}`,
		want: Request{Text: []byte("p"), MaxTokens: -1, N: 2, BestOf: 5}},
	{name: "completion n", body: `{"prompt":"p","n":3,"best_of":null}`,
		want: Request{Text: []byte("p"), MaxTokens: -1, N: 3}},

	{name: "invalid JSON", chat: true, body: `{"messages": [`, err: "malformed JSON"},
	{name: "trailing data", chat: true, body: `{"messages":[{"role":"user","content":"x"}]} {}`, err: "malformed JSON"},
	{name: "empty body", chat: true, body: ``, err: "malformed JSON"},
	// A literal cut short where a null may stand: this once spun forever.
	{name: "part nul", chat: true, body: `{"messages":[{"role":"user","content":[nul,{"type":"text","text":"x"}]}]}`, err: "malformed JSON"},
	{name: "message nul", chat: true, body: `{"messages":[nul]}`, err: "malformed JSON"},
	{name: "not an object", chat: true, body: `[{"role":"user","content":"x"}]`, err: "JSON object"},
	{name: "null body", chat: true, body: `null`, err: "JSON object"},
	{name: "no messages", chat: true, body: `{}`, err: "messages: at least one message is required"},
	{name: "empty messages", chat: true, body: `{"messages":[]}`, err: "messages: at least one message is required"},
	{name: "null messages", chat: true, body: `{"messages":null}`, err: "messages: at least one message is required"},
	{name: "messages not an array", chat: true, body: `{"messages":{"role":"user"}}`, err: "messages must be an array"},
	{name: "message not an object", chat: true, body: `{"messages":["hi"]}`, err: "messages[0] must be an object"},
	{name: "no role", chat: true, body: `{"messages":[{"role":"user","content":"x"},{"content":"x"}]}`, err: "messages[1].role is required"},
	{name: "empty role", chat: true, body: `{"messages":[{"role":"","content":"x"}]}`, err: "messages[0].role is required"},
	{name: "null message", chat: true, body: `{"messages":[null]}`, err: "messages[0].role is required"},
	{name: "role not a string", chat: true, body: `{"messages":[{"role":1,"content":"x"}]}`, err: "messages[0].role must be a string"},
	{name: "content a number", chat: true, body: `{"messages":[{"role":"user","content":7}]}`, err: "messages[0]: content must be a string or an array of content parts"},
	{name: "content an object", chat: true, body: `{"messages":[{"role":"user","content":{"text":"x"}}]}`, err: "content must be"},
	{name: "part not an object", chat: true, body: `{"messages":[{"role":"user","content":["x"]}]}`, err: "content must be"},
	{name: "part text not a string", chat: true, body: `{"messages":[{"role":"user","content":[{"type":"image_url","text":5}]}]}`, err: "content must be"},
	{name: "part type not a string", chat: true, body: `{"messages":[{"role":"user","content":[{"type":["text"],"text":"x"}]}]}`, err: "content must be"},
	{name: "stream not a bool", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"stream":"true"}`, err: "stream must be a boolean"},
	{name: "max_tokens a float", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":1.0}`, err: "max_tokens must be an integer"},
	{name: "max_tokens an exponent", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":1e3}`, err: "max_tokens must be an integer"},
	{name: "max_tokens too big", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":9223372036854775808}`, err: "max_tokens must be an integer"},
	{name: "max_tokens a string", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":"5"}`, err: "max_tokens must be an integer"},
	{name: "max_completion_tokens a string", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":"5"}`, err: "max_completion_tokens must be an integer"},
	{name: "model not a string", chat: true, body: `{"model":1,"messages":[{"role":"user","content":"x"}]}`, err: "model must be a string"},
	{name: "user not a string", chat: true, body: `{"user":{},"messages":[{"role":"user","content":"x"}]}`, err: "user must be a string"},
	{name: "stream_options not an object", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"stream_options":true}`, err: "stream_options must be an object or null"},
	{name: "include_usage not a bool", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":1}}`, err: "stream_options.include_usage must be a boolean"},
	{name: "deep nesting", chat: true, body: `{"x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `,"messages":[{"role":"user","content":"x"}]}`, err: "malformed JSON"},
	{name: "completion no prompt", body: `{"prompt":null}`, err: "prompt: want a string"},
	{name: "completion number", body: `{"prompt":3}`, err: "prompt: want a string"},

	{name: "completion empty list", body: `{"prompt":[]}`, err: "prompt: want a string"},
	{name: "completion mixed list", body: `{"prompt":[1,"a"]}`, err: "prompt: want a string"},
	{name: "completion float ids", body: `{"prompt":[1.5]}`, err: "prompt: want a string"},
	{name: "completion nested ids", body: `{"prompt":[[1,[2]]]}`, err: "prompt: want a string"},
}

func TestParseRequest(t *testing.T) {
	for _, tt := range requestCases {
		t.Run(tt.name, func(t *testing.T) {
			var r Request
			err := ParseRequest([]byte(tt.body), tt.chat, &r)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("error %v, want one containing %q", err, tt.err)
				}
			} else if err != nil {
				t.Errorf("error %v", err)
			} else {
				want := tt.want
				want.HasMaxTokens = want.MaxTokens != -1 // every case with a limit sets one
				if d := same(r, want); d != "" {
					t.Error(d)
				}
			}
			check(t, []byte(tt.body), tt.chat)
		})
	}
}

func TestParseRequestReusesBuffers(t *testing.T) {
	body := []byte(`{"model":"gorgo","messages":[{"role":"user","content":"hello there"}],"user":"alice"}`)
	var r Request
	if err := ParseRequest(body, true, &r); err != nil {
		t.Fatal(err)
	}
	text, model := &r.Text[:1][0], r.Model
	if err := ParseRequest(body, true, &r); err != nil {
		t.Fatal(err)
	}
	if &r.Text[0] != text {
		t.Error("Text's buffer was not reused")
	}
	// Model and User never alias the body.
	copy(body, bytes.Repeat([]byte{' '}, len(body)))
	if r.Model != model || r.Model != "gorgo" || r.User != "alice" {
		t.Errorf("model %q user %q after the body changed", r.Model, r.User)
	}
	// Fields of an earlier request do not leak into the next.
	if err := ParseRequest([]byte(`{"messages":[{"role":"user","content":"x"}]}`), true, &r); err != nil {
		t.Fatal(err)
	}
	if r.Model != "" || r.User != "" || r.MaxTokens != -1 {
		t.Errorf("left over: %+v", r)
	}
}

// bodyOf builds a chat request of about tokens estimated tokens: a system
// prompt and a few turns of English text with new lines and quotes.
func bodyOf(tokens int) []byte {
	para := "Prefix caching keeps the KV blocks of a prompt's leading tokens on the GPU, so a request that shares " +
		"them with an earlier one skips their prefill. \"Which replica holds my prefix?\" is what the router asks.\n" +
		"It weighs that against each replica's queue: a long wait can cost more than the cached prefill saves.\n\n"
	turn := func(n int) string { return strings.Repeat(para, max(1, n*4/len(para))) }
	msgs := []map[string]string{
		{"role": "system", "content": turn(tokens / 4)},
		{"role": "user", "content": turn(tokens / 4)},
		{"role": "assistant", "content": turn(tokens / 4)},
		{"role": "user", "content": turn(tokens / 4)},
	}
	b, _ := json.Marshal(map[string]any{"model": "gorgo-emulated", "messages": msgs, "max_tokens": 256,
		"stream": true, "temperature": 0.7, "user": "session-42"})
	return b
}

func TestParseRequestRealBodies(t *testing.T) {
	for _, tokens := range []int{10, 1000, 16000} {
		check(t, bodyOf(tokens), true)
	}
	dir := "../../../shared/data/engines/openai"
	files, _ := filepath.Glob(filepath.Join(dir, "openai-recorded-*.yaml"))
	if len(files) == 0 {
		t.Skipf("no recorded OpenAI requests in %s (it lives in ../shared/data, outside the project)", dir)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var cassette struct {
			Interactions []struct {
				Request struct {
					Body string `yaml:"body"`
					URL  string `yaml:"url"`
				} `yaml:"request"`
			} `yaml:"interactions"`
		}
		if err := yaml.Unmarshal(data, &cassette); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, in := range cassette.Interactions {
			chat := strings.HasSuffix(in.Request.URL, "/chat/completions")
			body := []byte(in.Request.Body)
			check(t, body, chat)
			var r Request
			if err := ParseRequest(body, chat, &r); err != nil {
				t.Errorf("%s: %v", filepath.Base(f), err)
			}
			t.Logf("%s: %d bytes of prompt, model %q, max %d, stream %v, usage %v", filepath.Base(f), len(r.Text), r.Model, r.MaxTokens, r.Stream, r.IncludeUsage)
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, tt := range requestCases {
		if len(tt.body) < 1000 {
			f.Add([]byte(tt.body), tt.chat)
		}
	}
	f.Add(bodyOf(10), true)
	f.Add([]byte(`{"messages":[{"role":"user","content":"x"}],"messages":[{"content":"y"}]}`), true)
	f.Add([]byte(`{"prompt":[1,2],"prompt":"s","Prompt":["t"]}`), false)
	f.Add([]byte(`{"messages":[{"role":"u","content":[{"TYPE":"text","Text":"a","text":null},{"type":"te\u0078t","text":"\ud834\udd1e"}]}]}`), true)
	f.Fuzz(func(t *testing.T, data []byte, chat bool) {
		// The data as a body, and as the recipe of a valid request made
		// of the keys and values that matter.
		for _, body := range [][]byte{data, recipe(data)} {
			// encoding/json merges the elements of duplicated
			// "messages" arrays; ParseRequest takes the last array.
			if chat && topKeys(body, "messages") > 1 {
				continue
			}
			check(t, body, chat)
		}
	})
}

var (
	recipeKeys = []string{`"min_tokens"`, `"tools"`, `"tool_calls"`, `"image_url"`, `"url"`, `"input_audio"`, `"audio_url"`, `"video_url"`, `"data"`, `"model"`, `"messages"`, `"prompt"`, `"max_tokens"`, `"max_completion_tokens"`, `"stream"`,
		`"stream_options"`, `"include_usage"`, `"user"`, `"role"`, `"content"`, `"type"`, `"text"`, `"MESSAGES"`, `"Role"`,
		`"ſtream"`, `"max_to\u212Aens"`, `"te\u0078t"`, `"Content"`, `"x"`, `"in\u0063lude_usage"`, `"\ud800role"`}
	recipeScalars = []string{`"user"`, `"text"`, `"image_url"`, `"input_audio"`, `"audio_url"`, `"video_url"`, `"data:audio/wav;base64,UklGRiQAAABXQVZFZm10IBAAAAABAAEAgD4AAAB9AAACABAAZGF0YQAAAAA="`, `""`, `"a\nb"`, `"\u00e9\ud83d\ude00"`, `"\ud800\u0041"`, "\"\xff\"", `"te\u0078t"`,
		`0`, `1`, `-1`, `-0`, `7`, `1.0`, `1e3`, `9223372036854775807`, `9223372036854775808`, `true`, `false`, `null`}
)

// recipe builds a valid JSON object from fuzz data out of recipeKeys and
// recipeScalars.
func recipe(data []byte) []byte {
	r := jsonrecipe.Recipe{Data: data, Keys: recipeKeys, Scalars: recipeScalars, MaxDepth: 4, MaxItems: 4}
	return r.Object(nil)
}

// mapOf decodes a JSON object as a generic map (exact keys, last wins, as
// the Python engines read it).
func mapOf(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("%q: %v", body, err)
	}
	return m
}

// checkIncludeUsage checks WithIncludeUsage on a valid JSON object.
func checkIncludeUsage(t *testing.T, body []byte) []byte {
	t.Helper()
	got := WithIncludeUsage(body, []byte("garbage"))
	if !json.Valid(got) {
		t.Fatalf("WithIncludeUsage(%q) = %q: not valid JSON", body, got)
	}
	want := mapOf(t, body)
	opts, ok := want["stream_options"].(map[string]any)
	if !ok {
		opts = map[string]any{}
	}
	opts["include_usage"] = true
	want["stream_options"] = opts
	if m := mapOf(t, got); !reflect.DeepEqual(m, want) {
		t.Fatalf("WithIncludeUsage(%q) = %q: reads %v, want %v", body, got, m, want)
	}
	return got
}

func TestWithIncludeUsage(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{}`, `{"stream_options":{"include_usage":true}}`},
		{` { } `, ` {"stream_options":{"include_usage":true} } `},
		{`{"stream":true}`, `{"stream_options":{"include_usage":true},"stream":true}`},
		{`{"stream":true,"stream_options":null}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream_options" : null , "x":1}`, `{"stream_options" : {"include_usage":true} , "x":1}`},
		{`{"stream_options":{}}`, `{"stream_options":{"include_usage":true}}`},
		{`{"stream_options":{ "continuous_usage_stats":true}}`, `{"stream_options":{"include_usage":true, "continuous_usage_stats":true}}`},
		{`{"stream_options":{"include_usage":false},"n":1}`, `{"stream_options":{"include_usage":true},"n":1}`},
		{`{"stream_options":{"include_usage":null}}`, `{"stream_options":{"include_usage":true}}`},
		{`{"stream_options":{"include_usage":true}}`, `{"stream_options":{"include_usage":true}}`},
		{`{"stream_options":{"include_usage":false},"stream_options":{"include_usage":false}}`, `{"stream_options":{"include_usage":false},"stream_options":{"include_usage":true}}`},
		{`{"stream_options":{"include_usage":false,"include_usage":false}}`, `{"stream_options":{"include_usage":false,"include_usage":true}}`},
		{`{"stream_options":3}`, `{"stream_options":{"include_usage":true}}`},
		{`{"Stream_Options":null}`, `{"stream_options":{"include_usage":true},"Stream_Options":null}`},
		{`{"stream\u005foptions":{"include_usage":false}}`, `{"stream\u005foptions":{"include_usage":true}}`},
		{`{"a":"{\"stream_options\":null}"}`, `{"stream_options":{"include_usage":true},"a":"{\"stream_options\":null}"}`},
		{`{"messages":[{"role":"user","content":"stream_options"}]}`, `{"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"stream_options"}]}`},
		{`{"a":{"stream_options":null},"b":[{"stream_options":null}]}`, `{"stream_options":{"include_usage":true},"a":{"stream_options":null},"b":[{"stream_options":null}]}`},
		{`{"a":{"stream_options":null},"stream_options":{"a":{"include_usage":false}}}`, `{"a":{"stream_options":null},"stream_options":{"include_usage":true,"a":{"include_usage":false}}}`},
		{"{\"messages\":[{\"role\":\"user\",\"content\":\"h\\u00e9\"}],\n \"stream\": true}", "{\"stream_options\":{\"include_usage\":true},\"messages\":[{\"role\":\"user\",\"content\":\"h\\u00e9\"}],\n \"stream\": true}"},
	}
	for _, tt := range tests {
		got := checkIncludeUsage(t, []byte(tt.body))
		if string(got) != tt.want {
			t.Errorf("WithIncludeUsage(%s) = %s, want %s", tt.body, got, tt.want)
		}
	}
	// What is not a JSON object comes back as it was.
	for _, body := range []string{``, `[]`, ` null`, `"x"`} {
		if got := WithIncludeUsage([]byte(body), nil); string(got) != body {
			t.Errorf("WithIncludeUsage(%q) = %q", body, got)
		}
	}
	// The result is appended to dst[:0].
	dst := make([]byte, 0, 256)
	if got := WithIncludeUsage([]byte(`{}`), dst); &got[:1][0] != &dst[:1][0] {
		t.Error("dst's buffer was not used")
	}
	// The stream the proxy rewrites reads as asking for usage.
	var r Request
	if err := ParseRequest(WithIncludeUsage(bodyOf(100), nil), true, &r); err != nil || !r.IncludeUsage {
		t.Errorf("rewritten body: %+v, %v", r, err)
	}
}

func FuzzWithIncludeUsage(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"stream":true,"stream_options":null}`))
	f.Add([]byte(`{"stream_options":{"include_usage":false,"x":[1,{"y":"\"}"}]}}`))
	f.Add([]byte(`{"stream_options":{}, "stream_options":{"include_usage":null}}`))
	f.Add([]byte(`{"s\u0074ream_options":{"include_usage":false}}`))
	f.Add([]byte(`{"stream_options":"x","messages":[{"role":"user","content":"a\\\"b"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		// The data as a body, and as the recipe of a valid one.
		for _, body := range [][]byte{data, recipe(data)} {
			var m map[string]any
			if json.Unmarshal(body, &m) != nil || m == nil {
				WithIncludeUsage(body, nil) // must not panic
				continue
			}
			checkIncludeUsage(t, body)
		}
	})
}

// Bodies that nest deep are refused (beyond encoding/json's limit of
// 10000) without harm: the decoder does not recurse.
func TestDeepNesting(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct {
		body string
		ok   bool
	}{
		{`{"x":` + strings.Repeat("[", 9998) + strings.Repeat("]", 9998) + "," + msgs + "}", true},
		{`{"x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + "," + msgs + "}", false},
		{strings.Repeat("[", 1<<22), false},
		{`{"x":` + strings.Repeat("{", 1<<20), false},
	} {
		var r Request
		err := ParseRequest([]byte(c.body), true, &r)
		if (err == nil) != c.ok {
			t.Errorf("%.30q... (%d bytes): %v, want ok=%v", c.body, len(c.body), err, c.ok)
		}
	}
}

// oldParse is the proxy's old path: encoding/json into its inbound struct,
// then ChatRequestBytes.
func oldParse(body []byte) ([]byte, error) {
	var in struct {
		Messages            []WireMessage   `json:"messages"`
		Prompt              json.RawMessage `json:"prompt"`
		MaxTokens           *int            `json:"max_tokens"`
		MaxCompletionTokens *int            `json:"max_completion_tokens"`
		Stream              bool            `json:"stream"`
		StreamOptions       *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		User string `json:"user"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, err
	}
	return ChatRequestBytes(in.Messages)
}

// oldIncludeUsage is the proxy's old rewrite: decode into raw fields,
// set include_usage, encode again.
func oldIncludeUsage(body []byte) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, err
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := fields["stream_options"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &opts); err != nil {
			return nil, err
		}
	}
	opts["include_usage"] = json.RawMessage("true")
	fields["stream_options"], _ = json.Marshal(opts)
	return json.Marshal(fields)
}

func BenchmarkParseRequest(b *testing.B) {
	for _, tokens := range []int{1000, 16000} {
		body := bodyOf(tokens)
		b.Run(fmt.Sprintf("old/%dk", tokens/1000), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := oldParse(body); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("new/%dk", tokens/1000), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var r Request
			for b.Loop() {
				if err := ParseRequest(body, true, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkWithIncludeUsage(b *testing.B) {
	body := bodyOf(16000)
	b.Run("old/16k", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := oldIncludeUsage(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("new/16k", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		var dst []byte
		for b.Loop() {
			dst = WithIncludeUsage(body, dst)
		}
	})
	// A body with stream_options: gjson walks its top level.
	withOpts := append(bytes.TrimSuffix(bytes.Clone(body), []byte("}")), `,"stream_options":{"include_usage":false}}`...)
	b.Run("new-with-options/16k", func(b *testing.B) {
		b.SetBytes(int64(len(withOpts)))
		b.ReportAllocs()
		var dst []byte
		for b.Loop() {
			dst = WithIncludeUsage(withOpts, dst)
		}
	})
	b.Run("copy/16k", func(b *testing.B) { // the floor: one copy of the body
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		var dst []byte
		for b.Loop() {
			dst = append(dst[:0], body...)
		}
	})
}

func TestParseRequestAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	body := bodyOf(16000)
	var r Request
	allocs := testing.AllocsPerRun(20, func() {
		if err := ParseRequest(body, true, &r); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per parse, want none", allocs)
	}
	plain := []byte(`{"model":"gorgo","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hello"}]}],"max_tokens":9,"stream":true,"stream_options":{"include_usage":true},"user":"alice"}`)
	if allocs := testing.AllocsPerRun(20, func() { _ = ParseRequest(plain, true, &r) }); allocs != 0 {
		t.Errorf("%v allocations per parse of a body without escapes, want 0", allocs)
	}
	for _, prompt := range []string{`[1,2,3]`, `["a","b"]`, `[[1,2],[3]]`} {
		body := []byte(`{"model":"m","prompt":` + prompt + `}`)
		if allocs := testing.AllocsPerRun(20, func() { _ = ParseRequest(body, false, &r) }); allocs != 0 {
			t.Errorf("%v allocations per parse of the prompt %s, want 0", allocs, prompt)
		}
	}
}

func TestParseInput(t *testing.T) {
	for _, c := range []struct {
		body, text, err string
	}{
		{`{"model":"e","input":"hello"}`, "hello", ""},
		{`{"input":["a","b"]}`, "a\nb\n", ""},
		{`{"input":[1,2,3]}`, "[1,2,3]", ""},
		{`{"input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"x"},{"type":"input_text","text":"yo"}]},{"type":"function_call_output","output":"42"}]}`, "user\nhi\nassistant\nyo\ntool\n42\n", ""},
		// A function call and its output are an assistant's tool call and
		// a tool's message; other items that are not messages add nothing.
		{`{"input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"c","name":"f","arguments":"{\"a\":1}"},{"type":"reasoning","summary":[]},{"type":"function_call_output","call_id":"c","output":"42"},{"type":"function_call","name":7}]}`, "user\nhi\nassistant\n\nf {\"a\":1}\ntool\n42\nassistant\n\n \n", ""},
		{`{"model":"e"}`, "", ""},
		{`{"input":7}`, "", "input: want"},
		{`{"input":"x"`, "", "malformed JSON"},
		{`{"instructions":"be brief","input":"hi"}`, "system\nbe brief\nhi", ""},
		{`{"input":[{"role":"user","content":"hi"}],"instructions":"be brief"}`, "system\nbe brief\nuser\nhi\n", ""},
		{`{"instructions":"a","instructions":null,"input":"hi"}`, "system\na\nhi", ""},
		{`{"instructions":[{"role":"system","content":"x"}],"input":"hi"}`, "hi", ""},
		// A responses request's tools open its prompt, as a chat's.
		{`{"input":"hi","tools":[{"type":"function","name":"f"}],"instructions":"be brief"}`, "tools\n[{\"type\":\"function\",\"name\":\"f\"}]\nsystem\nbe brief\nhi", ""},
		{`{"tools":[{"type":"function","name":"f"}]}`, "", ""},
		{`{"input":"hi","tools":"f"}`, "hi", ""},
	} {
		var r Request
		err := ParseInput([]byte(c.body), &r)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want %q", c.body, err, c.err)
		case c.err == "" && (err != nil || string(r.Text) != c.text):
			t.Errorf("%s: %q, %v; want %q", c.body, r.Text, err, c.text)
		}
	}
	// A responses request's output limit and the stored response it
	// continues (a string: else the engine's to refuse).
	for _, c := range []struct {
		body, prev string
		max        int
	}{
		{`{"input":"hi","max_output_tokens":50,"previous_response_id":"resp_1"}`, "resp_1", 50},
		{`{"input":"hi","previous_response_id":7,"max_tokens":9}`, "", 9},
		{`{"input":"hi","previous_response_id":"resp_1","previous_response_id":null}`, "resp_1", -1},
		{`{"input":"hi","Previous_Response_ID":"resp_2"}`, "resp_2", -1},
	} {
		var r Request
		if err := ParseInput([]byte(c.body), &r); err != nil || r.PreviousResponseID != c.prev || r.MaxTokens != c.max {
			t.Errorf("%s: previous %q, max %d, %v; want %q, %d", c.body, r.PreviousResponseID, r.MaxTokens, err, c.prev, c.max)
		}
	}
	var chatPrev Request
	if err := ParseRequest([]byte(`{"messages":[{"role":"user","content":"x"}],"previous_response_id":"resp_1","max_output_tokens":5}`), true, &chatPrev); err != nil ||
		chatPrev.PreviousResponseID != "" || chatPrev.MaxTokens != -1 {
		t.Errorf("a chat read a responses request's fields: %+v", chatPrev)
	}
	// "input_text" parts are a responses-API thing: a chat does not count them.
	var r Request
	if err := ParseRequest([]byte(`{"messages":[{"role":"user","content":[{"type":"input_text","text":"no"}]}]}`), true, &r); err != nil || string(r.Text) != "user\n\n" {
		t.Errorf("chat with an input_text part: %q %v", r.Text, err)
	}
}

// FuzzParseInput: ParseInput ends on any body, never panics, refuses
// what is not JSON, and reads a body as it read it before.
func FuzzParseInput(f *testing.F) {
	for _, b := range []string{`{"input":"hello"}`, `{"input":["a",null,"b"]}`, `{"input":[1,2]}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"x"},null]},null]}`,
		`{"instructions":"be brief","input":[{"type":"function_call_output","output":"42"}]}`} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var r Request
		err := ParseInput(body, &r)
		if err == nil && !json.Valid(body) {
			t.Fatalf("%q: accepted, but it is not JSON", body)
		}
		text := string(r.Text)
		if err2 := ParseInput(body, &r); (err == nil) != (err2 == nil) || string(r.Text) != text {
			t.Fatalf("%q: read twice, %q %v then %q %v", body, text, err, r.Text, err2)
		}
	})
}

// WithModel sets the model a body names, changing nothing else; the
// result reads as the same request for the new model.
func TestWithModel(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`, `{"model":"llama-70b","messages":[{"role":"user","content":"hi"}]}`},
		{` { "stream" : true , "model" : "chat" } `, ` { "stream" : true , "model" : "llama-70b" } `},
		{`{"model":"a","model":"chat"}`, `{"model":"llama-70b","model":"llama-70b"}`},
		{`{"Model":"chat"}`, `{"model":"llama-70b","Model":"llama-70b"}`},
		{`{"model":null}`, `{"model":"llama-70b"}`},
		{`{}`, `{"model":"llama-70b"}`},
		{`{"messages":[{"role":"user","content":"\"model\":\"chat\""}],"model":"chat"}`, `{"messages":[{"role":"user","content":"\"model\":\"chat\""}],"model":"llama-70b"}`},
		{`{"a":{"model":"x"},"model":"chat"}`, `{"a":{"model":"x"},"model":"llama-70b"}`},
	}
	for _, tt := range tests {
		got := WithModel([]byte(tt.body), "llama-70b", nil)
		if string(got) != tt.want {
			t.Errorf("WithModel(%s) = %s, want %s", tt.body, got, tt.want)
		}
	}
	// Names that need escaping are escaped; what is not an object comes back.
	var r Request
	body := WithModel([]byte(`{"model":"x","prompt":"p"}`), `we"ird\name`, nil)
	if err := ParseRequest(body, false, &r); err != nil || r.Model != `we"ird\name` {
		t.Errorf("%s: model %q, %v", body, r.Model, err)
	}
	for _, b := range []string{``, `[]`, `"x"`} {
		if got := WithModel([]byte(b), "m", nil); string(got) != b {
			t.Errorf("WithModel(%q) = %q", b, got)
		}
	}
}

func TestModel(t *testing.T) {
	for body, want := range map[string]string{
		` {"query":"q","model":"m-1","x":{"model":"inner"}}`: "m-1",
		`{"x":{"model":"inner"}}`:                            "",
		`{"model":7}`:                                        "",
		`--boundary\r\nmodel`:                                "",
		``:                                                   "",
	} {
		if got := Model([]byte(body)); got != want {
			t.Errorf("Model(%q) = %q, want %q", body, got, want)
		}
	}
}

// A later "messages" key starts the instructions over, as it does the
// text; an input list of token ids has none.
func TestInstructionsStartOver(t *testing.T) {
	var r Request
	body := `{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}],"messages":[{"role":"user","content":"v"}]}`
	if err := ParseRequest([]byte(body), true, &r); err != nil || r.Instructions != 0 || string(r.Text) != "user\nv\n" {
		t.Errorf("%v: text %q, instructions %d, want the second messages' text and none", err, r.Text, r.Instructions)
	}
	if err := ParseInput([]byte(`{"input":[{"role":"system","content":"s"},1,2]}`), &r); err != nil || r.Instructions != 0 {
		t.Errorf("%v: input of token ids: instructions %d, want 0", err, r.Instructions)
	}
	if err := ParseInput([]byte(`{"input":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`), &r); err != nil || r.Instructions != len("system\ns\n") {
		t.Errorf("%v: input messages: instructions %d, want the system message's", err, r.Instructions)
	}
	// A responses request's instructions, then its input's system messages.
	if err := ParseInput([]byte(`{"instructions":"i","input":[{"role":"developer","content":"d"},{"role":"user","content":"u"}]}`), &r); err != nil || r.Instructions != len("system\ni\ndeveloper\nd\n") {
		t.Errorf("%v: instructions %d in %q, want the instructions' and the developer message's", err, r.Instructions, r.Text)
	}
	var chat Request
	if err := ParseRequest([]byte(`{"messages":[{"role":"system","content":"i"},{"role":"user","content":"u"}]}`), true, &chat); err != nil {
		t.Fatal(err)
	}
	if err := ParseInput([]byte(`{"instructions":"i","input":[{"role":"user","content":"u"}]}`), &r); err != nil || string(r.Text) != string(chat.Text) || r.Instructions != chat.Instructions {
		t.Errorf("%v: a responses request %q (%d) reads unlike the same chat %q (%d)", err, r.Text, r.Instructions, chat.Text, chat.Instructions)
	}
}

// Choices counts the sequences an engine generates (best_of's hidden ones
// too), Answers those it shows and its usage counts.
func TestChoicesAndAnswers(t *testing.T) {
	for _, c := range []struct {
		body             string
		choices, answers int
	}{
		{`{"prompt":"p"}`, 1, 1},
		{`{"prompt":"p","n":2,"best_of":5}`, 5, 2},
		{`{"prompt":"p","best_of":3}`, 3, 1},
		{`{"prompt":["a","b","c"],"n":2}`, 6, 6},
		{`{"prompt":["a","b","c"],"n":70000,"best_of":2}`, 3 << 16, 3 << 16},
	} {
		var r Request
		if err := ParseRequest([]byte(c.body), false, &r); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if r.Choices() != c.choices || r.Answers() != c.answers {
			t.Errorf("%s: %d sequences, %d answers; want %d and %d", c.body, r.Choices(), r.Answers(), c.choices, c.answers)
		}
	}
}

// An image stands for the estimator's tokens per image; a body of many
// small image parts cannot grow the prompt past maxMediaBytes of them.
func TestImagesAreBounded(t *testing.T) {
	one := `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}`
	var r Request
	est := Estimator{ImageTokens: 300}
	if err := est.ParseRequest([]byte(one), true, &r); err != nil || len(r.Text) != len("user\n")+300*4+1 {
		t.Errorf("one image of 300 tokens: %d bytes of text, %v", len(r.Text), err)
	}
	var b strings.Builder
	b.WriteString(`{"messages":[{"role":"user","content":[`)
	const n = 3000
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"type":"image_url","image_url":"%d"}`, i)
	}
	b.WriteString(`]}]}`)
	if err := ParseRequest([]byte(b.String()), true, &r); err != nil {
		t.Fatal(err)
	}
	full := maxMediaBytes / Estimator{}.ImageBytes()
	if max := maxMediaBytes + n*len("image 0123456789abcdef\n"); len(r.Text) > max || full >= n {
		t.Errorf("%d images: %d bytes of text, want at most %d", n, len(r.Text), max)
	}
	if got := bytes.Count(r.Text, []byte("image ")); got != n {
		t.Errorf("%d images named, want %d", got, n)
	}
}

// A later "content" key gives back the image allowance the one it
// replaces took; tools before images move where the images stand.
func TestImageAllowanceAndSpans(t *testing.T) {
	var parts strings.Builder
	for i := range maxMediaBytes / (Estimator{}).ImageBytes() {
		if i > 0 {
			parts.WriteByte(',')
		}
		fmt.Fprintf(&parts, `{"type":"image_url","image_url":"%d"}`, i)
	}
	check(t, []byte(`{"messages":[{"role":"user","content":[`+parts.String()+`],"content":"x"},{"role":"user","content":[{"type":"image_url","image_url":"v"}]}]}`), true)
	check(t, []byte(`{"messages":[{"role":"user","content":["x",{"type":"image_url","image_url":"v"}]}],"tools":[{"type":"function"}]}`), true)
	check(t, []byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":"v"}]}],"tools":[{"type":"function"}]}`), true)
	var r Request
	if err := ParseRequest([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":"v"}]}],"tools":[{"type":"function"}]}`), true, &r); err != nil ||
		len(r.Media) != 2 || !bytes.HasPrefix(r.Text[r.Media[0]:], []byte("image ")) || r.Media[1] != r.Media[0]+(Estimator{}).ImageBytes() {
		t.Errorf("images at %v in %d bytes (tools %d), %v", r.Media, len(r.Text), r.Tools, err)
	}
}

// The keys of a prompt's opening leave its tools and images out: the same
// question about another picture keys as it does about none.
func TestOpeningKeys(t *testing.T) {
	var est Estimator
	keys := func(body string) (uint64, uint64) {
		t.Helper()
		var r Request
		if err := ParseRequest([]byte(body), true, &r); err != nil {
			t.Fatal(err)
		}
		return OpeningKeys(&r, est)
	}
	long := strings.Repeat("a long question about the picture, ", 40)
	plain := `{"messages":[{"role":"system","content":"sys"},{"role":"user","content":"` + long + `"}]}`
	var r Request
	if err := ParseRequest([]byte(plain), true, &r); err != nil {
		t.Fatal(err)
	}
	p0, i0 := keys(plain)
	if p0 != PrefixKey(r.Text, est) || i0 != InstructionsKey(r.Text, r.Instructions, est) {
		t.Error("without tools or images the keys are not PrefixKey's and InstructionsKey's")
	}
	for _, url := range []string{"cat", "dog"} {
		body := `{"tools":[{"type":"function"}],"messages":[{"role":"system","content":"sys"},{"role":"user","content":[{"type":"image_url","image_url":"` + url + `"},{"type":"text","text":"` + long + `"}]}]}`
		if p, i := keys(body); p != p0 || i != i0 {
			t.Errorf("image %s: keys %x %x, want %x %x", url, p, i, p0, i0)
		}
	}
}

// SGLang's extensions of its chat and completions, lora_path and rid, are
// read as its /generate's are; a responses request's are not SGLang's.
func TestSGLangExtensions(t *testing.T) {
	for _, c := range []struct {
		body      string
		chat      bool
		lora, rid string
	}{
		{`{"model":"base","messages":[{"role":"user","content":"hi"}],"lora_path":"sql","rid":"r1"}`, true, "sql", "r1"},
		{`{"model":"base","prompt":"hi","lora_path":["sql"],"rid":["a","b"]}`, false, "sql", `["a","b"]`},
		{`{"model":"base","prompt":"hi","lora_path":["sql","law"],"rid":7}`, false, "", ""},
		{`{"model":"base","prompt":"hi","lora_path":null,"rid":null}`, false, "", ""},
	} {
		var r Request
		if err := ParseRequest([]byte(c.body), c.chat, &r); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if r.LoRAPath != c.lora || r.RID != c.rid {
			t.Errorf("%s: lora_path %q, rid %q; want %q and %q", c.body, r.LoRAPath, r.RID, c.lora, c.rid)
		}
	}
	var r Request
	if err := ParseInput([]byte(`{"model":"m","input":"hi","rid":"r1","lora_path":"sql"}`), &r); err != nil || r.RID != "" || r.LoRAPath != "" {
		t.Errorf("a responses request: %v, rid %q, lora_path %q; want neither read", err, r.RID, r.LoRAPath)
	}
	// vLLM's request_id, a string (its engine's id for the request).
	for body, want := range map[string]string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"request_id":"roll-1"}`: "roll-1",
		`{"model":"m","prompt":"hi","request_id":7}`:                                      "",
		`{"model":"m","prompt":"hi"}`:                                                     "",
	} {
		if err := ParseRequest([]byte(body), strings.Contains(body, "messages"), &r); err != nil || r.RequestID != want {
			t.Errorf("%s: %v, request_id %q, want %q", body, err, r.RequestID, want)
		}
	}
}
