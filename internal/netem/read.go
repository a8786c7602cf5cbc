package netem

import (
	"net"
	"os"
	"time"
)

const (
	// maxBuffered bounds the bytes received but not yet returned by Read;
	// beyond it readLoop stops reading the underlying connection.
	maxBuffered = 4 << 20
	// readBufSize is the size of the buffers readLoop reads into; it moves
	// to a new one when fewer than minReadBuf bytes are left.
	readBufSize = 64 << 10
	minReadBuf  = 4 << 10
)

// rchunk is a run of received bytes, or the error that ended the stream,
// with its due time.
type rchunk struct {
	b   []byte
	err error // set on the last chunk only, with b empty
	due time.Time
}

// readLoop reads the underlying connection as bytes arrive and queues them,
// due one one-way delay after their arrival (the incoming way's: Link.delay;
// and not before the previous chunk). The error that ends the stream (io.EOF included) is queued the same
// way. It returns on that error, or once the conn is closed.
func (c *conn) readLoop() {
	defer close(c.rdone)
	var buf []byte
	for {
		c.rmu.Lock()
		for c.rbytes >= maxBuffered && !c.rclosed {
			c.rmu.Unlock()
			<-c.rspace
			c.rmu.Lock()
		}
		closed := c.rclosed
		c.rmu.Unlock()
		if closed {
			return
		}

		if len(buf) < minReadBuf {
			buf = make([]byte, readBufSize)
		}
		n, err := c.raw.Read(buf)
		now := time.Now()
		d := c.link.delay(&c.rway, now)

		c.rmu.Lock()
		due := now.Add(d)
		if due.Before(c.rlast) {
			due = c.rlast
		}
		c.rlast = due
		if n > 0 {
			c.rq.push(rchunk{b: buf[:n:n], due: due})
			c.rbytes += n
			buf = buf[n:]
		}
		if err != nil {
			c.rq.push(rchunk{err: err, due: due})
		}
		c.rmu.Unlock()
		kick(c.rkick)
		if err != nil {
			return
		}
	}
}

// Read returns received bytes once they are due. It waits for them until the
// read deadline, which it checks first, as a TCP connection does; bytes not
// yet due when the deadline passes stay for the next Read. The error that
// ended the stream (io.EOF at the peer's close) is returned, when due, after
// all the bytes, and by every later Read.
func (c *conn) Read(p []byte) (int, error) {
	c.rlock.Lock()
	defer c.rlock.Unlock()
	for {
		c.rmu.Lock()
		if c.rclosed {
			c.rmu.Unlock()
			return 0, c.opErr("read", net.ErrClosed)
		}
		now := time.Now()
		dl := c.rdl
		if !dl.IsZero() && !now.Before(dl) {
			c.rmu.Unlock()
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		}
		if len(p) == 0 {
			c.rmu.Unlock()
			return 0, nil
		}
		wait := time.Duration(-1) // forever
		if c.rq.len() > 0 {
			head := c.rq.at(0)
			if !head.due.After(now) {
				if len(head.b) == 0 {
					err := head.err // sticky: the chunk stays
					c.rmu.Unlock()
					return 0, err
				}
				n := c.takeLocked(p, now)
				wasFull := c.rbytes >= maxBuffered
				c.rbytes -= n
				full := c.rbytes >= maxBuffered
				c.rmu.Unlock()
				if wasFull && !full {
					kick(c.rspace)
				}
				return n, nil
			}
			wait = head.due.Sub(now)
		}
		if !dl.IsZero() {
			if until := dl.Sub(now); wait < 0 || until < wait {
				wait = until
			}
		}
		c.rmu.Unlock()

		if wait < 0 {
			<-c.rkick
			continue
		}
		if c.rtimer == nil {
			c.rtimer = time.NewTimer(wait)
		} else {
			c.rtimer.Reset(wait)
		}
		select {
		case <-c.rkick:
		case <-c.rtimer.C:
		}
		c.rtimer.Stop()
	}
}

// takeLocked copies into p the bytes of the chunks due at now, up to the
// end of p or the end-of-stream chunk, and drops what it consumed.
func (c *conn) takeLocked(p []byte, now time.Time) int {
	n, k := 0, 0
	for k < c.rq.len() && n < len(p) {
		ch := c.rq.at(k)
		if len(ch.b) == 0 || ch.due.After(now) {
			break
		}
		m := copy(p[n:], ch.b)
		n += m
		ch.b = ch.b[m:]
		if len(ch.b) > 0 {
			break
		}
		k++
	}
	c.rq.pop(k)
	return n
}

// fifo is a queue on a slice that reuses its storage and compacts it.
type fifo[T any] struct {
	buf  []T
	head int
}

func (f *fifo[T]) len() int    { return len(f.buf) - f.head }
func (f *fifo[T]) at(i int) *T { return &f.buf[f.head+i] }
func (f *fifo[T]) push(v T)    { f.buf = append(f.buf, v) }

// pop drops the first n elements.
func (f *fifo[T]) pop(n int) {
	if n <= 0 {
		return
	}
	clear(f.buf[f.head : f.head+n])
	f.head += n
	switch {
	case f.head == len(f.buf):
		f.buf, f.head = f.buf[:0], 0
	case f.head >= 64 && 2*f.head >= len(f.buf):
		m := copy(f.buf, f.buf[f.head:])
		clear(f.buf[m:])
		f.buf, f.head = f.buf[:m], 0
	}
}
