package prompt

import (
	"bytes"
	"testing"
)

// A JSON string may escape "/" (PHP's json_encode does by default, as do
// other encoders); the engines decode the body, so "https:\/\/x\/cat.png"
// is the same image as "https://x/cat.png" to them, its blocks cached
// alike, and to the router (2026-12-05: mediaKey hashed the raw JSON,
// escapes and all, so that it named the one image two ways).
func TestMediaKeyIgnoresJSONEscapes(t *testing.T) {
	plain := `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/cat.png"}},{"type":"text","text":"what is it?"}]}]}`
	escaped := `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https:\/\/example.com\/cat.png"}},{"type":"text","text":"what is it?"}]}]}`
	var a, b Request
	if err := ParseRequest([]byte(plain), true, &a); err != nil {
		t.Fatal(err)
	}
	if err := ParseRequest([]byte(escaped), true, &b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Text, b.Text) {
		t.Errorf("one image URL, written with and without JSON's \\/ escapes, gives two prompts:\n%.60q\n%.60q", a.Text, b.Text)
	}
}
