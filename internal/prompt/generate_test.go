package prompt

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestParseGenerate(t *testing.T) {
	for _, c := range []struct {
		name, body string
		text       string
		ends       []int
		max, min   int
		n          int
		stream     bool
		model      string
		lora, rid  string
		err        string
	}{
		{name: "text", body: `{"text":"hello","sampling_params":{"max_new_tokens":16,"min_new_tokens":2},"stream":true}`, text: "hello", max: 16, min: 2, n: 1, stream: true},
		{name: "SGLang's default limit", body: `{"text":"hello"}`, text: "hello", max: DefaultMaxNewTokens, n: 1},
		{name: "no limit", body: `{"text":"hello","sampling_params":{"max_new_tokens":null}}`, text: "hello", max: -1, n: 1},
		{name: "a batch of texts", body: `{"text":["ab","c"],"sampling_params":[{"max_new_tokens":3},{"max_new_tokens":9}]}`, text: "ab\nc\n", ends: []int{2, 4}, max: 3, n: 1},
		{name: "token ids", body: `{"input_ids":[1, 2,3],"sampling_params":{"n":2}}`, text: "[1, 2,3]", max: DefaultMaxNewTokens, n: 2},
		{name: "a batch of token ids", body: `{"input_ids":[[1],[2,3]]}`, text: "[1]\n[2,3]\n", ends: []int{3, 9}, max: DefaultMaxNewTokens, n: 1},
		{name: "a gateway's model", body: `{"text":"x","model":"m","rid":"r1","lora_path":"sql"}`, text: "x", max: DefaultMaxNewTokens, n: 1, model: "m", lora: "sql", rid: "r1"},
		{name: "a batch's one adapter", body: `{"text":["a","b"],"lora_path":["sql","sql"]}`, text: "a\nb\n", ends: []int{1, 3}, max: DefaultMaxNewTokens, n: 1, lora: "sql"},
		{name: "a batch's adapters differ", body: `{"text":["a","b"],"lora_path":["sql","chat"]}`, text: "a\nb\n", ends: []int{1, 3}, max: DefaultMaxNewTokens, n: 1},
		{name: "a batch's prompt on the base", body: `{"text":["a","b"],"lora_path":["sql",null]}`, text: "a\nb\n", ends: []int{1, 3}, max: DefaultMaxNewTokens, n: 1},
		{name: "no adapter", body: `{"text":"x","lora_path":null}`, text: "x", max: DefaultMaxNewTokens, n: 1},
		{name: "a request id", body: `{"text":"x","rid":"r-1"}`, text: "x", max: DefaultMaxNewTokens, n: 1, rid: "r-1"},
		{name: "a batch's ids", body: `{"text":["a","b"],"rid":["r-1", "r-2"]}`, text: "a\nb\n", ends: []int{1, 3}, max: DefaultMaxNewTokens, n: 1, rid: `["r-1", "r-2"]`},
		{name: "embeddings: by load", body: `{"input_embeds":[[0.1]]}`, max: DefaultMaxNewTokens, n: 1},
		{name: "text and its ids", body: `{"text":"the text","input_ids":[1,2]}`, text: "[1,2]", max: DefaultMaxNewTokens, n: 1},
		{name: "text, ids and embeddings", body: `{"text":"t","input_ids":[1],"input_embeds":[[0.5]]}`, err: "not all three"},
		{name: "no prompt", body: `{"sampling_params":{}}`, err: "either text or input_ids"},
		{name: "an empty batch", body: `{"text":[]}`, err: "either text or input_ids"},
		{name: "ids not whole", body: `{"input_ids":[1.5]}`, err: "either text or input_ids"},
		{name: "a bad limit", body: `{"text":"x","sampling_params":{"max_new_tokens":"9"}}`, err: "max_new_tokens"},
		{name: "not JSON", body: `{"text":`, err: "malformed"},
		{name: "not an object", body: `["x"]`, err: "object"},
		{name: "stream not a boolean", body: `{"text":"x","stream":1}`, err: "stream"},
	} {
		var r Request
		err := ParseGenerate([]byte(c.body), &r)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want an error saying %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if string(r.Text) != c.text || !slices.Equal(r.PromptEnds, c.ends) && len(r.PromptEnds)+len(c.ends) > 0 || r.MaxTokens != c.max || r.MinTokens != c.min ||
			r.N != c.n || r.Stream != c.stream || r.Model != c.model || r.LoRAPath != c.lora || r.RID != c.rid {
			t.Errorf("%s: %+v", c.name, r)
		}
	}
}

// A request reused for another body keeps nothing of the first.
func TestParseGenerateResets(t *testing.T) {
	var r Request
	if err := ParseGenerate([]byte(`{"text":["a","b"],"stream":true,"model":"m","lora_path":"sql","sampling_params":{"n":3,"min_new_tokens":1}}`), &r); err != nil {
		t.Fatal(err)
	}
	if err := ParseGenerate([]byte(`{"text":"c"}`), &r); err != nil {
		t.Fatal(err)
	}
	if string(r.Text) != "c" || len(r.PromptEnds) != 0 || r.Stream || r.Model != "" || r.LoRAPath != "" || r.N != 1 || r.MinTokens != 0 {
		t.Errorf("%+v", r)
	}
}

// The strings a request keeps are its own: the body's buffer is reused
// for the next request (a pool's) while they may still be read (a span
// exported after the request ended).
func TestParseGenerateKeepsNoViewOfTheBody(t *testing.T) {
	body := []byte(`{"text":"x","model":"m-1","lora_path":"sql","rid":"r-1"}`)
	var r Request
	if err := ParseGenerate(body, &r); err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = 'z'
	}
	if r.Model != "m-1" || r.LoRAPath != "sql" || r.RID != "r-1" {
		t.Errorf("after the body's buffer was reused: model %q, lora_path %q, rid %q", r.Model, r.LoRAPath, r.RID)
	}
}

// A /generate body nested 8 Mi levels deep is refused, not a crash
// (2026-12-07, a review: gjson's validator recursed once per level).
func TestDeepGenerateBodyIsRefused(t *testing.T) {
	var r Request
	if err := ParseGenerate(bytes.Repeat([]byte{'['}, 8<<20), &r); err == nil {
		t.Error("a body of 8 MiB of '[' parsed")
	}
}
