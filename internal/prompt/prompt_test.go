package prompt

import (
	"slices"
	"testing"
)

func TestEstimatorAndBlocks(t *testing.T) {
	var e Estimator
	if got := e.Tokens(make([]byte, 4097)); got != 1025 {
		t.Errorf("Tokens(4097 bytes) = %d, want 1025", got)
	}
	text := make([]byte, 4*100)
	for i := range text {
		text[i] = byte('a' + i%26)
	}
	b := e.Blocks(text, 16, nil)
	if len(b) != 7 { // ceil(100/16)
		t.Fatalf("%d blocks, want 7", len(b))
	}
	longer := append(slices.Clone(text), "more text"...)
	if c := e.Blocks(longer, 16, nil); !slices.Equal(c[:6], b[:6]) || c[6] == b[6] {
		t.Errorf("extending a prompt must keep its full blocks and change its partial one")
	}
}

func TestChatGrowsByAppending(t *testing.T) {
	one := Chat(nil, []Message{{"system", "be brief"}, {"user", "hi"}})
	two := Chat(nil, []Message{{"system", "be brief"}, {"user", "hi"}, {"assistant", "hello"}, {"user", "how are you"}})
	if string(two[:len(one)]) != string(one) {
		t.Errorf("turn 2 does not start with turn 1: %q vs %q", two, one)
	}
	if string(one) != "system\nbe brief\nuser\nhi\n" {
		t.Errorf("canonical form %q", one)
	}
}

func TestRequestBytes(t *testing.T) {
	got, err := ChatRequestBytes([]WireMessage{{Role: "user", Content: []byte(`[{"type":"text","text":"hi"},{"type":"image_url"}]`)}})
	if err != nil || string(got) != "user\nhi\n" {
		t.Errorf("chat: %q, %v", got, err)
	}
	for _, bad := range [][]WireMessage{nil, {{Content: []byte(`"x"`)}}, {{Role: "user", Content: []byte(`7`)}}} {
		if _, err := ChatRequestBytes(bad); err == nil {
			t.Errorf("chat %v accepted", bad)
		}
	}
	for raw, want := range map[string]string{`"once"`: "once", `["once"]`: "once", `[1,2,3]`: "[1,2,3]", `["a","b"]`: "a\nb\n", `[[1,2],[3]]`: "[1,2]\n[3]\n", `[[1,2]]`: "[1,2]"} {
		if got, _, err := CompletionBytes([]byte(raw)); err != nil || string(got) != want {
			t.Errorf("completion %s: %q, %v", raw, got, err)
		}
	}
	for _, raw := range []string{`[]`, `3`, `null`, `[[]]`, `[[1],"a"]`, `[[1.5]]`} {
		if _, _, err := CompletionBytes([]byte(raw)); err == nil {
			t.Errorf("completion %s accepted", raw)
		}
	}
}
