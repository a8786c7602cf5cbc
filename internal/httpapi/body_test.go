package httpapi

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

// A Content-Length is the client's word: ReadBody allocates for it no more
// than preallocBytes before the bytes come (found in review: a client that
// promised 8 MiB and sent one byte held 8 MiB).
func TestReadBodyAllocatesAsTheBodyComes(t *testing.T) {
	r := httptest.NewRequest("POST", "/", io.NopCloser(strings.NewReader("{")))
	r.ContentLength = 8 << 20
	buf := new([]byte)
	if err := ReadBody(r, buf, 8<<20); err != nil {
		t.Fatal(err)
	}
	if string(*buf) != "{" || cap(*buf) > preallocBytes {
		t.Errorf("read %q into a buffer of %d bytes; want at most %d", *buf, cap(*buf), preallocBytes)
	}
	// A body that does come in full is read whole.
	long := strings.Repeat("x", 3*preallocBytes)
	r = httptest.NewRequest("POST", "/", strings.NewReader(long))
	if err := ReadBody(r, buf, 8<<20); err != nil || string(*buf) != long {
		t.Errorf("read %d bytes (%v), want %d", len(*buf), err, len(long))
	}
}
