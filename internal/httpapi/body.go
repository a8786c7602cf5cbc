package httpapi

import (
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
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

// A Budget bounds the bytes a kind of buffer holds at once, across the
// requests being served: max_body_bytes bounds one request body,
// max_in_flight how many, and their product (32 GiB by default) is no
// bound on a machine (the same for held answers). A buffer takes its
// capacity from the budget as it grows, before it grows, and gives it
// back when its request ends (Give). Its bound may change while buffers
// hold it (SetMax); not positive, there is none. A nil Budget counts
// nothing.
type Budget struct {
	max, used atomic.Int64
}

// ErrBodyBudget is ReadBody's error when the budget cannot hold the body.
var ErrBodyBudget = errors.New("the request bodies being served fill the router's budget for them")

// SetMax sets the budget's bound, in bytes (not positive: none).
func (b *Budget) SetMax(n int64) { b.max.Store(n) }

// Take takes n bytes from the budget, or reports false and takes nothing.
func (b *Budget) Take(n int64) bool {
	if b == nil {
		return true
	}
	if m := b.max.Load(); b.used.Add(n) > m && m > 0 {
		b.used.Add(-n)
		return false
	}
	return true
}

// Give gives back n bytes taken (for a body read with ReadBody, its
// buffer's capacity when ReadBody returned).
func (b *Budget) Give(n int) {
	if b != nil {
		b.used.Add(-int64(n))
	}
}

// Used is how many bytes the buffers counted hold.
func (b *Budget) Used() int64 { return b.used.Load() }

// ReadBody reads a request body into a pooled buffer, at most limit
// bytes: a larger Content-Length is refused before anything is read (an
// *http.MaxBytesError, as for a body that turns out larger). The buffer
// grows as the body comes, from at most preallocBytes: a Content-Length
// is the client's word, and a client that promises 8 MiB and sends a byte
// must not hold 8 MiB. The buffer's capacity, whatever the outcome, is
// taken from budget (nil: none), which the caller gives back
// (Budget.Give) once done with the body; a growth the budget cannot
// hold stops the read with ErrBodyBudget.
func ReadBody(r *http.Request, buf *[]byte, limit int64, budget *Budget) error {
	b := (*buf)[:0]
	defer func() { *buf = b }()
	if !budget.Take(int64(cap(b))) {
		b = nil // the pool's buffer is too large for what is left: let it go
	}
	if r.ContentLength > limit {
		return &http.MaxBytesError{Limit: limit}
	}
	if n := min(r.ContentLength+1, preallocBytes); n > 1 && int64(cap(b)) < n {
		if !budget.Take(n) {
			return ErrBodyBudget
		}
		budget.Give(cap(b))
		b = make([]byte, 0, n)
	}
	body := http.MaxBytesReader(nil, r.Body, limit)
	for {
		if len(b) == cap(b) {
			// Double what came, up to the promised length and one byte
			// past the limit (to see a longer body): a few copies for a
			// large body, never more than twice what arrived. The new
			// buffer is made to the size taken from the budget (append
			// would round it up).
			grow := int64(max(cap(b), 512))
			if n := r.ContentLength + 1; n > int64(cap(b)) {
				grow = min(n-int64(cap(b)), grow)
			}
			grow = max(min(grow, limit+1-int64(cap(b))), 1)
			if !budget.Take(grow) {
				return ErrBodyBudget
			}
			nb := make([]byte, len(b), int64(cap(b))+grow)
			copy(nb, b)
			b = nb
		}
		n, err := body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
