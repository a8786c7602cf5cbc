package netem

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// ErrFlushTimeout is returned by Close when the peer did not take the queued
// bytes within their due time plus CloseGrace; they were dropped.
var ErrFlushTimeout = errors.New("netem: close: queued bytes not delivered in time, dropped")

const (
	// maxQueued bounds the bytes written but not yet handed to the
	// underlying connection; beyond it Write blocks (a full send buffer).
	maxQueued = 4 << 20
	// maxBatch bounds the chunks handed to the underlying conn in one write.
	maxBatch = 128
)

// wchunk is a run of written bytes (or a half-close) and its due time.
type wchunk struct {
	b   []byte
	due time.Time
	fin bool // CloseWrite marker
}

// conn is a net.Conn with delayed reads and writes. Lock order: wmu or rmu,
// then Link.mu; wmu and rmu are never held together.
type conn struct {
	raw  net.Conn
	link *Link

	wlock sync.Mutex // serializes Write calls
	rlock sync.Mutex // serializes Read calls

	wmu          sync.Mutex
	wclosed      bool         // Close called
	shut         bool         // CloseWrite called
	wq           fifo[wchunk] // written, not yet handed to raw
	wbytes       int          // bytes in wq
	wlast        time.Time    // due time of the last chunk queued
	wway         way          // the outgoing way's delay
	wdl          time.Time    // write deadline
	werr         error        // sticky error from raw writes
	werrReported bool

	rmu     sync.Mutex
	rclosed bool         // Close called
	rq      fifo[rchunk] // received, not yet returned by Read
	rbytes  int          // bytes in rq
	rlast   time.Time    // due time of the last chunk received
	rway    way          // the incoming way's delay (readLoop's alone)
	rdl     time.Time    // read deadline
	rtimer  *time.Timer  // used by Read under rlock

	// Wake-ups, each with capacity 1; waiters recheck the state under the
	// lock, so a token never gets lost and a stale one costs a loop.
	wkick  chan struct{} // writeLoop: data queued or closed
	wspace chan struct{} // Write: room in wq, deadline changed or closed
	rkick  chan struct{} // Read: data received, deadline changed or closed
	rspace chan struct{} // readLoop: room in rq or closed

	abort chan struct{} // closed by Close when the flush times out
	wdone chan struct{} // closed when writeLoop returns
	rdone chan struct{} // closed when readLoop returns
}

// halfCloser is a conn whose underlying connection supports CloseWrite.
type halfCloser struct{ *conn }

type closeWriter interface{ CloseWrite() error }

func newConn(l *Link, raw net.Conn) net.Conn {
	c := &conn{
		raw:    raw,
		link:   l,
		wkick:  make(chan struct{}, 1),
		wspace: make(chan struct{}, 1),
		rkick:  make(chan struct{}, 1),
		rspace: make(chan struct{}, 1),
		abort:  make(chan struct{}),
		wdone:  make(chan struct{}),
		rdone:  make(chan struct{}),
	}
	go c.writeLoop()
	go c.readLoop()
	if _, ok := raw.(closeWriter); ok {
		return halfCloser{c}
	}
	return c
}

func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (c *conn) opErr(op string, err error) error {
	e := &net.OpError{Op: op, Source: c.raw.LocalAddr(), Addr: c.raw.RemoteAddr(), Err: err}
	if e.Source != nil {
		e.Net = e.Source.Network()
	}
	return e
}

// Write queues a copy of p, due one one-way delay from now (and not before
// the previous chunk), and returns without waiting for the delay. It blocks
// only when about 4 MiB are already queued, until room, the write deadline or
// Close. An error of an earlier write to the underlying connection is
// returned here.
func (c *conn) Write(p []byte) (int, error) {
	c.wlock.Lock()
	defer c.wlock.Unlock()
	var b []byte
	if len(p) > 0 {
		b = make([]byte, len(p))
		copy(b, p)
	}
	var timer *time.Timer
	c.wmu.Lock()
	for {
		if err := c.writeErrLocked(); err != nil {
			c.wmu.Unlock()
			return 0, err
		}
		if c.wbytes == 0 || c.wbytes+len(b) <= maxQueued {
			break
		}
		dl := c.wdl
		c.wmu.Unlock()
		if dl.IsZero() {
			<-c.wspace
		} else {
			if timer == nil {
				timer = time.NewTimer(time.Until(dl))
				defer timer.Stop()
			} else {
				timer.Reset(time.Until(dl))
			}
			select {
			case <-c.wspace:
			case <-timer.C:
			}
		}
		c.wmu.Lock()
	}
	if len(b) == 0 {
		c.wmu.Unlock()
		return 0, nil
	}
	now := time.Now()
	due := now.Add(c.link.delay(&c.wway, now))
	if due.Before(c.wlast) {
		due = c.wlast
	}
	c.wlast = due
	c.wq.push(wchunk{b: b, due: due})
	c.wbytes += len(b)
	c.wmu.Unlock()
	kick(c.wkick)
	return len(p), nil
}

// writeErrLocked returns the error a Write gets now, if any.
func (c *conn) writeErrLocked() error {
	switch {
	case c.wclosed:
		return c.opErr("write", net.ErrClosed)
	case c.werr != nil:
		c.werrReported = true
		return c.werr
	case c.shut:
		return c.opErr("write", os.NewSyscallError("write", syscall.EPIPE))
	case !c.wdl.IsZero() && !time.Now().Before(c.wdl):
		return c.opErr("write", os.ErrDeadlineExceeded)
	}
	return nil
}

// writeLoop hands queued chunks to the underlying connection when they are
// due. It returns when the queue is drained after Close, on a write error, or
// when Close gives up on the flush.
func (c *conn) writeLoop() {
	defer close(c.wdone)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var bufs net.Buffers
	for {
		c.wmu.Lock()
		for c.wq.len() == 0 {
			if c.wclosed {
				c.wmu.Unlock()
				return
			}
			c.wmu.Unlock()
			select {
			case <-c.wkick:
			case <-c.abort:
				return
			}
			c.wmu.Lock()
		}
		due := c.wq.at(0).due
		c.wmu.Unlock()

		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-c.abort:
				timer.Stop()
				return
			}
		}

		// Take every chunk that is due, up to a half-close marker.
		c.wmu.Lock()
		now := time.Now()
		fin := false
		k, n := 0, 0
		bufs = bufs[:0]
		for k < c.wq.len() && k < maxBatch {
			ch := c.wq.at(k)
			if ch.due.After(now) {
				break
			}
			if ch.fin {
				fin = k == 0
				break
			}
			bufs = append(bufs, ch.b)
			n += len(ch.b)
			k++
		}
		c.wmu.Unlock()

		var err error
		if fin {
			err = c.raw.(closeWriter).CloseWrite()
			k = 1
		} else {
			wb := bufs // WriteTo consumes its receiver
			_, err = wb.WriteTo(c.raw)
		}
		clear(bufs)

		c.wmu.Lock()
		c.wq.pop(k)
		c.wbytes -= n
		if err != nil {
			select {
			case <-c.abort: // Close closed raw under us; not the peer's fault
			default:
				c.werr = err
			}
			c.wq.pop(c.wq.len())
			c.wbytes = 0
		}
		c.wmu.Unlock()
		kick(c.wspace)
		if err != nil {
			return
		}
	}
}

// CloseWrite half-closes the connection once the bytes written before it
// have been delivered. Later writes fail.
func (h halfCloser) CloseWrite() error {
	c := h.conn
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wclosed {
		return c.opErr("close", net.ErrClosed)
	}
	if c.werr != nil {
		c.werrReported = true
		return c.werr
	}
	if c.shut {
		return nil
	}
	c.shut = true
	now := time.Now()
	due := now.Add(c.link.delay(&c.wway, now))
	if due.Before(c.wlast) {
		due = c.wlast
	}
	c.wlast = due
	c.wq.push(wchunk{fin: true, due: due})
	kick(c.wkick)
	return nil
}

// Close delivers the bytes already written, at their due times, then closes
// the underlying connection. If the peer does not take them within the last
// one's due time plus CloseGrace, they are dropped and Close returns
// ErrFlushTimeout. A write error not yet returned by Write is returned here.
// Close waits for the connection's goroutines to end.
func (c *conn) Close() error {
	c.wmu.Lock()
	if c.wclosed {
		c.wmu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.wclosed = true
	last := c.wlast
	c.wmu.Unlock()
	c.rmu.Lock()
	c.rclosed = true
	c.rmu.Unlock()
	kick(c.wkick)
	kick(c.wspace)
	kick(c.rkick)
	kick(c.rspace)

	var err error
	t := time.NewTimer(max(time.Until(last), 0) + CloseGrace)
	select {
	case <-c.wdone:
	case <-t.C:
		close(c.abort)
		err = c.opErr("close", ErrFlushTimeout)
	}
	t.Stop()
	if cerr := c.raw.Close(); err == nil {
		err = cerr
	}
	<-c.wdone
	<-c.rdone

	c.wmu.Lock()
	if c.werr != nil && !c.werrReported {
		c.werrReported = true
		err = c.werr
	}
	c.wmu.Unlock()
	return err
}

func (c *conn) LocalAddr() net.Addr  { return c.raw.LocalAddr() }
func (c *conn) RemoteAddr() net.Addr { return c.raw.RemoteAddr() }

// SetDeadline sets the read and write deadlines.
func (c *conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline for Read calls, pending ones included.
// It is kept by the wrapper, not passed to the underlying connection.
func (c *conn) SetReadDeadline(t time.Time) error {
	c.rmu.Lock()
	closed := c.rclosed
	c.rdl = t
	c.rmu.Unlock()
	if closed {
		return c.opErr("set", net.ErrClosed)
	}
	kick(c.rkick)
	return nil
}

// SetWriteDeadline sets the deadline for Write calls, pending ones included.
// Since Write only queues, it matters once the queue is full (the peer is not
// reading) or the deadline has passed. Bytes already queued are delivered
// regardless, as a kernel does with its send buffer.
func (c *conn) SetWriteDeadline(t time.Time) error {
	c.wmu.Lock()
	closed := c.wclosed
	c.wdl = t
	c.wmu.Unlock()
	if closed {
		return c.opErr("set", net.ErrClosed)
	}
	kick(c.wspace)
	return nil
}
