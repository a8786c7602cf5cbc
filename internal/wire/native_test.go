package wire

import "testing"

func TestPeekNative(t *testing.T) {
	for _, c := range []struct {
		name, data string
		want       Peek
	}{
		{"a token", `{"text":" the","output_ids":[5],"meta_info":{"id":"r","finish_reason":null,"prompt_tokens":3,"completion_tokens":1,"cached_tokens":2}}`,
			Peek{Token: true, Usage: true, CompletionTokens: 1, CachedTokens: 2}},
		{"the last, cumulative", `{"text":" the quick","meta_info":{"finish_reason":{"type":"length","length":2},"completion_tokens":2,"cached_tokens":0}}`,
			Peek{Token: true, Finish: true, Usage: true, CompletionTokens: 2, CachedTokens: 0}},
		{"ids alone (skip_tokenizer_init)", `{"output_ids":[5,6],"meta_info":{"completion_tokens":2}}`,
			Peek{Token: true, Usage: true, CompletionTokens: 2, CachedTokens: -1}},
		{"an abort of no tokens", `{"text":"","output_ids":[],"meta_info":{"finish_reason":{"type":"abort","message":"Aborted"},"completion_tokens":0}}`,
			Peek{Finish: true, Abort: true, Usage: true, CachedTokens: -1}},
		{"an error", `{"error":{"message":"bad"}}`, Peek{Error: true, CachedTokens: -1}},
		{"counts out of range", `{"text":"x","meta_info":{"completion_tokens":-5,"cached_tokens":"7"}}`,
			Peek{Token: true, Usage: true, CachedTokens: -1}},
		{"not an object", `[1]`, Peek{CachedTokens: -1}},
		{"not JSON", `{"text":"x`, Peek{CachedTokens: -1}},
	} {
		if got := PeekNative([]byte(c.data)); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestPeekNativeBody(t *testing.T) {
	for _, c := range []struct {
		body              string
		completion, cache int
		aborted           bool
	}{
		{`{"text":"a b","meta_info":{"finish_reason":{"type":"length"},"completion_tokens":2,"cached_tokens":64}}`, 2, 64, false},
		{`[{"text":"a","meta_info":{"completion_tokens":1,"cached_tokens":3}},{"text":"b c","meta_info":{"completion_tokens":2}}]`, 3, -1, false},
		{`{"text":"","meta_info":{"finish_reason":{"type":"abort"},"completion_tokens":0}}`, 0, -1, true},
		{`{"text":"a","meta_info":{"finish_reason":{"type":"abort"},"completion_tokens":1}}`, 1, -1, false},
		{`{"text":`, 0, -1, false},
	} {
		completion, cached := PeekNativeBody([]byte(c.body))
		if completion != c.completion || cached != c.cache {
			t.Errorf("%s: %d %d, want %d %d", c.body, completion, cached, c.completion, c.cache)
		}
		if got := NativeAbortedUnanswered([]byte(c.body)); got != c.aborted {
			t.Errorf("%s: aborted unanswered %v", c.body, got)
		}
	}
}

func FuzzPeekNative(f *testing.F) {
	f.Add([]byte(`{"text":"x","meta_info":{"finish_reason":{"type":"abort"},"completion_tokens":1}}`))
	f.Add([]byte(`[{"meta_info":{"completion_tokens":1e400}}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := PeekNative(data) // must not panic
		if p.CompletionTokens < 0 || p.CachedTokens < -1 {
			t.Fatalf("%q: %+v", data, p)
		}
		if c, k := PeekNativeBody(data); c < 0 || k < -1 {
			t.Fatalf("%q: body %d %d", data, c, k)
		}
		NativeAbortedUnanswered(data)
	})
}

func TestPeekNativeTail(t *testing.T) {
	for _, c := range []struct {
		tail              string
		completion, cache int
	}{
		{`lazy dog","meta_info":{"id":"r","finish_reason":{"type":"length","length":900},"completion_tokens":900,"cached_tokens":12}}`, 900, 12},
		{`x"}},{"text":"y","meta_info":{"completion_tokens":3}}]`, 3, -1},
		{`cut","meta_info":{"completion_tokens":9`, 0, -1},
		{`no meta here`, 0, -1},
	} {
		if completion, cached := PeekNativeTail([]byte(c.tail)); completion != c.completion || cached != c.cache {
			t.Errorf("%s: %d %d, want %d %d", c.tail, completion, cached, c.completion, c.cache)
		}
	}
}
