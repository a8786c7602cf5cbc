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
	var b Budget
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

// The budget's bound holds exactly: a buffer is made to the size taken
// (review, 2026-12-06: append rounded a growth up past the bound, a 7 MB
// body's buffer to 8.2 MB).
func TestBodyBudgetHoldsAtMostItsBound(t *testing.T) {
	var b Budget
	const bound = 66000
	b.SetMax(bound)
	r := httptest.NewRequest("POST", "/", strings.NewReader(strings.Repeat("x", 65536+100)))
	buf := new([]byte)
	err := ReadBody(r, buf, 8<<20, &b)
	if err == nil && b.Used() > bound || b.Used() != int64(cap(*buf)) {
		t.Errorf("read (%v) with %d bytes held, the buffer %d, the bound %d", err, b.Used(), cap(*buf), bound)
	}
}

// A lone body within max_body_bytes fits the least bound the config
// allows, max_body_bytes + 1, whether its length is given or not (review,
// 2026-12-06: a chunked body grew past it and was told to retry for ever).
func TestLoneBodyFitsTheLeastBound(t *testing.T) {
	const limit = 8 << 20
	for _, n := range []int{limit, limit - 1, 5 << 20, 7 << 20} {
		for _, cl := range []bool{true, false} {
			var b Budget
			b.SetMax(limit + 1)
			r := httptest.NewRequest("POST", "/", strings.NewReader(strings.Repeat("x", n)))
			if !cl {
				r.ContentLength = -1
			}
			buf := new([]byte)
			if err := ReadBody(r, buf, limit, &b); err != nil || len(*buf) != n {
				t.Errorf("a lone body of %d bytes (content length %v): %d read, %v", n, cl, len(*buf), err)
			}
		}
	}
	// One byte more is too large, not over the budget.
	var b Budget
	b.SetMax(limit + 1)
	r := httptest.NewRequest("POST", "/", strings.NewReader(strings.Repeat("x", limit+1)))
	r.ContentLength = -1
	if err := ReadBody(r, new([]byte), limit, &b); BodyError(err).Status != 413 {
		t.Errorf("a body past the limit: %v", err)
	}
}
