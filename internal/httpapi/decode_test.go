package httpapi

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// DecodeJSON: a body past the limit that came without a Content-Length
// (chunked) is a 413, as one that announced its length is; and a body
// with anything after its JSON value is refused, not half read.
func TestDecodeJSONStatus(t *testing.T) {
	big := `{"aliases":{"x":"` + strings.Repeat("y", 2<<20) + `"}}`
	r := httptest.NewRequest("PUT", "/admin/models", io.NopCloser(strings.NewReader(big)))
	r.ContentLength = -1 // chunked
	w := httptest.NewRecorder()
	var v map[string]any
	if DecodeJSON(w, r, &v, 1<<20) || w.Code != 413 {
		t.Errorf("chunked body of %d bytes over a 1 MiB limit: %d %s, want 413", len(big), w.Code, w.Body)
	}
	r = httptest.NewRequest("PUT", "/admin/weights", strings.NewReader(`{"rtt":1}{"rtt":-1}`))
	w = httptest.NewRecorder()
	if DecodeJSON(w, r, &v, 1<<20) || w.Code != 400 {
		t.Errorf("two JSON values accepted as %v (%d)", v, w.Code)
	}
	r = httptest.NewRequest("PUT", "/admin/weights", strings.NewReader("{\"rtt\":1}\n"))
	w = httptest.NewRecorder()
	if !DecodeJSON(w, r, &v, 1<<20) {
		t.Errorf("a value and a newline refused: %d %s", w.Code, w.Body)
	}
}

// A value encoding/json refuses (a number that is not finite) is a 500
// saying so, in OpenAI's shape, not an empty answer of the status asked.
func TestWriteJSONThatCannotBeWritten(t *testing.T) {
	w := httptest.NewRecorder()
	WriteJSON(w, http.StatusOK, map[string]float64{"x": math.Inf(1)})
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), `"error"`) || !strings.Contains(w.Body.String(), "cannot be written as JSON") {
		t.Errorf("%d %s", w.Code, w.Body.String())
	}
	w = httptest.NewRecorder()
	WriteJSON(w, http.StatusCreated, map[string]any{"a": 1})
	if w.Code != http.StatusCreated || w.Body.String() != "{\n  \"a\": 1\n}\n" || w.Header().Get("Content-Type") != "application/json" {
		t.Errorf("%d %q", w.Code, w.Body.String())
	}
}
