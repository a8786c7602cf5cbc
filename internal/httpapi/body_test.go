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
	if err := ReadBody(r, buf, 8<<20, nil); err != nil {
		t.Fatal(err)
	}
	if string(*buf) != "{" || cap(*buf) > preallocBytes {
		t.Errorf("read %q into a buffer of %d bytes; want at most %d", *buf, cap(*buf), preallocBytes)
	}
	// A body that does come in full is read whole.
	long := strings.Repeat("x", 3*preallocBytes)
	r = httptest.NewRequest("POST", "/", strings.NewReader(long))
	if err := ReadBody(r, buf, 8<<20, nil); err != nil || string(*buf) != long {
		t.Errorf("read %d bytes (%v), want %d", len(*buf), err, len(long))
	}
}

// A body budget holds each body's buffer as it grows and refuses the
// growth it cannot hold; what is given back frees it (the router's bodies
// were bounded only by max_body_bytes × max_in_flight, 32 GiB).
func TestBodyBudget(t *testing.T) {
	var b BodyBudget
	b.SetMax(1 << 20)
	read := func(n int, contentLength bool) (*[]byte, error) {
		r := httptest.NewRequest("POST", "/", strings.NewReader(strings.Repeat("x", n)))
		if !contentLength {
			r.ContentLength = -1
		}
		buf := new([]byte)
		return buf, ReadBody(r, buf, 8<<20, &b)
	}
	first, err := read(700<<10, true)
	if err != nil || len(*first) != 700<<10 {
		t.Fatalf("first body: %d bytes, %v", len(*first), err)
	}
	if b.Used() != int64(cap(*first)) {
		t.Errorf("the budget holds %d bytes, the body's buffer %d", b.Used(), cap(*first))
	}
	for _, cl := range []bool{true, false} {
		second, err := read(700<<10, cl)
		if err != ErrBodyBudget {
			t.Errorf("content length %v: a second body past the budget: %v, want ErrBodyBudget", cl, err)
		}
		if e := BodyError(err); e.Status != 503 || e.RetryAfter == "" {
			t.Errorf("its error: %d, Retry-After %q; want 503 with Retry-After", e.Status, e.RetryAfter)
		}
		if b.Used() != int64(cap(*first)+cap(*second)) {
			t.Errorf("the budget holds %d bytes, the buffers %d", b.Used(), cap(*first)+cap(*second))
		}
		b.Give(cap(*second))
	}
	b.Give(cap(*first))
	if b.Used() != 0 {
		t.Errorf("all given back, the budget holds %d", b.Used())
	}
	if second, err := read(700<<10, false); err != nil {
		t.Errorf("with the first body given back, the second: %v", err)
	} else {
		b.Give(cap(*second))
	}
	// No bound: every body is read, and still counted.
	b.SetMax(-1)
	x, errX := read(700<<10, true)
	y, errY := read(700<<10, true)
	if errX != nil || errY != nil || b.Used() != int64(cap(*x)+cap(*y)) {
		t.Errorf("no bound: %v, %v, %d held", errX, errY, b.Used())
	}
}
