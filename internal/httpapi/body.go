package httpapi

import (
	"io"
	"net/http"
	"slices"
	"sync"
)

// preallocBytes is the most ReadBody allocates before the body comes.
const preallocBytes = 64 << 10

// buffers recycles request bodies and relay buffers.
var buffers = sync.Pool{New: func() any { return new([]byte) }}

// GetBuffer returns an empty pooled buffer.
func GetBuffer() *[]byte { return buffers.Get().(*[]byte) }

// PutBuffer recycles a buffer, unless it grew past 1 MiB: one huge request
// must not pin its memory for the life of the process.
func PutBuffer(b *[]byte) {
	if cap(*b) <= 1<<20 {
		*b = (*b)[:0]
		buffers.Put(b)
	}
}

// ReadBody reads a request body into a pooled buffer, at most limit
// bytes: a larger Content-Length is refused before anything is read (an
// *http.MaxBytesError, as for a body that turns out larger). The buffer
// grows as the body comes, from at most preallocBytes: a Content-Length
// is the client's word, and a client that promises 8 MiB and sends a byte
// must not hold 8 MiB.
func ReadBody(r *http.Request, buf *[]byte, limit int64) error {
	if r.ContentLength > limit {
		return &http.MaxBytesError{Limit: limit}
	}
	b := (*buf)[:0]
	if n := min(r.ContentLength+1, preallocBytes); n > 1 && int64(cap(b)) < n {
		b = make([]byte, 0, n)
	}
	body := http.MaxBytesReader(nil, r.Body, limit)
	for {
		if len(b) == cap(b) {
			// Double what came, up to the promised length: a few copies
			// for a large body, never more than twice what arrived.
			grow := max(cap(b), 512)
			if n := r.ContentLength + 1; n > int64(cap(b)) {
				grow = int(min(n-int64(cap(b)), int64(grow)))
			}
			b = slices.Grow(b, grow)
		}
		n, err := body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			*buf = b
			return nil
		}
		if err != nil {
			*buf = b
			return err
		}
	}
}
