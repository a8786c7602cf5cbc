// Package netem injects network delay in user space, so that a local server
// (the engine emulator) behaves like a replica in a far-away region without
// kernel netem.
//
// A Link is a network path with a round-trip time and a jitter that can be
// changed at runtime. Link.Listener wraps a listener so that every accepted
// connection delays the bytes it reads by one half of the round trip and the
// bytes it writes by the other half: a request/response exchange over it takes
// one RTT more than it would without it. Link.Conn wraps a single connection
// the same way. Wrap one end of a connection only (the server's listener or
// the client's dialed conn), or the delay is paid twice.
//
// # Model
//
// Each way of a connection has a one-way delay of rtt/2 + jitter/√2 ×
// N(0,1), floored at zero, drawn when a chunk of bytes enters the link
// (when Write is called for outgoing bytes, when the bytes come out of the
// underlying connection for incoming ones) and kept by the chunks that
// follow it on that way within Hold jitters of each other: a path's delay
// is its queues', which change slowly against a stream's chunks, so a
// stream keeps its spacing and a request's answer, from its headers to its
// last token, is shifted by one draw (as the simulator draws one round trip
// per request). A chunk after a longer gap, or after Set, draws anew. The
// two ways' draws are independent, so a round trip's standard deviation is
// jitter. Delivery times are monotone per direction (a chunk is never due
// earlier than the one before it), so order is preserved. With zero jitter
// the delay is exact.
//
// Write never blocks for the delay: it copies the bytes, stamps them with
// their due time and returns; a goroutine per connection writes them to the
// underlying connection when they are due. Another goroutine per connection
// reads the underlying connection as soon as bytes arrive and stamps them, and
// Read hands them out when due. Deadlines (SetDeadline, SetReadDeadline,
// SetWriteDeadline) are implemented by the wrapper and behave as on a TCP
// connection; a Read that times out keeps its not-yet-due bytes for the next
// Read. Close delivers the bytes already written, at their due times, before
// it closes the underlying connection.
//
// # Limitations
//
//   - There is no bandwidth model: a large body takes the delay once, not once
//     per window, and there is no slow start or loss.
//   - Each direction buffers at most about 4 MiB in the wrapper (queued
//     writes not yet due, or received bytes not yet read). A full write queue
//     blocks Write (until its deadline) like a full socket buffer, and a full
//     read buffer stops reading the underlying connection, whose bytes are
//     then stamped when the wrapper reads them, later than they arrived. In
//     effect throughput per connection is capped near 4 MiB per one-way delay
//     (about 100 MB/s at 40 ms), far above what an LLM stream needs.
//   - Delivery is in order, so a chunk after a gap of Hold jitters or more
//     that draws a shorter delay than the one before it waits for it; past
//     such a gap that is rare (the two draws must differ by more than the
//     gap). (Drawn afresh for every chunk, as it was before 2026-12-06, a
//     chunk waited for the slowest before it: a stream's delays crept
//     upwards, its first token waited for the headers sent before it, and
//     the live demo's streams ran longer than the simulator's.) Requests
//     that follow each other on a kept-alive connection within Hold
//     jitters share their delay, where the simulator draws each apart.
//   - Incoming bytes are stamped when the wrapper's goroutine reads them from
//     the underlying connection, which it does continuously, so the stamp is
//     their arrival time up to scheduling noise (and the buffer cap above).
//   - Close blocks until the queued bytes are delivered (up to one one-way
//     delay); it waits at most for the last written byte's due time plus
//     CloseGrace for a peer that does not read; after that it closes the
//     underlying connection anyway, drops what is left and reports
//     ErrFlushTimeout.
//   - Close closes the underlying connection right after the last queued
//     byte went out (at once if none was queued), so the FIN it sends does
//     not carry this side's delay; nor does the TCP handshake. A FIN
//     received is delayed like data: Read returns io.EOF one one-way delay
//     after it arrived.
//   - A connection must be closed to stop its goroutines, as with any
//     net.Conn.
package netem

import (
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// CloseGrace is how long Close waits, beyond the due time of the last byte
// written, for the queued bytes to be written to the underlying connection.
const CloseGrace = time.Second

// Hold is how long, in jitters, a connection's way keeps its delay across
// a gap between chunks (see the package's Model).
const Hold = 3

// Link is a network path with a round-trip time and jitter, changeable at
// runtime. It is safe for concurrent use and may be shared by any number of
// connections.
type Link struct {
	mu     sync.Mutex
	rtt    time.Duration
	jitter time.Duration
	gen    uint64 // changed by Set: the ways draw anew
	rng    *rand.Rand
}

// way is one direction of a connection: the delay its chunks keep (see
// Link.delay).
type way struct {
	delay time.Duration
	last  time.Time // when the latest chunk entered; zero: none yet
	gen   uint64    // the link's, when delay was drawn
}

// NewLink returns a link with the given round-trip time and jitter. Jitter is
// the standard deviation of the round trip: each one-way delay is
// rtt/2 + jitter/√2 × N(0,1), floored at zero, and the two ways' draws are
// independent. The draws are deterministic for a seed. Negative durations
// are taken as zero.
func NewLink(rtt, jitter time.Duration, seed uint64) *Link {
	l := &Link{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	l.Set(rtt, jitter)
	return l
}

// Set changes the round-trip time and jitter. It takes effect for bytes sent
// after the call (bytes already in flight keep their delivery times).
// Negative durations are taken as zero.
func (l *Link) Set(rtt, jitter time.Duration) {
	l.mu.Lock()
	l.rtt = max(rtt, 0)
	l.jitter = max(jitter, 0)
	l.gen++
	l.mu.Unlock()
}

// Get returns the current round-trip time and jitter.
func (l *Link) Get() (rtt, jitter time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rtt, l.jitter
}

// delay is the one-way delay of a chunk entering way w at now: w's delay
// if its latest chunk entered less than Hold jitters before (and the link
// was not Set since), else a new draw.
func (l *Link) delay(w *way, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.last.IsZero() || w.gen != l.gen || now.Sub(w.last) >= Hold*l.jitter {
		w.delay, w.gen = l.drawLocked(), l.gen
	}
	w.last = now
	return w.delay
}

// drawLocked draws a one-way delay: rtt/2 + jitter/√2 × N(0,1), floored at
// zero; exactly rtt/2 without jitter. (With jitter/2, as it was, a round
// trip of two draws had a standard deviation of jitter/√2: the live
// fleet's network was steadier than the simulator's, whose round trip is
// one draw of standard deviation jitter.) Call with l.mu.
func (l *Link) drawLocked() time.Duration {
	d := l.rtt / 2
	if l.jitter > 0 {
		d += time.Duration(float64(l.jitter) / math.Sqrt2 * l.rng.NormFloat64())
	}
	return max(d, 0)
}

// Conn wraps c so that the bytes read from it are delayed by one half of the
// link's round trip and the bytes written to it by the other half. The
// returned conn owns c: closing it closes c. If c has a CloseWrite method
// (as *net.TCPConn does), so does the returned conn, with the half-close
// delivered after the bytes written before it.
func (l *Link) Conn(c net.Conn) net.Conn {
	return newConn(l, c)
}

// Listener wraps inner so that every accepted connection delays the bytes it
// reads by one half of the RTT and the bytes it writes by the other half: a
// request/response exchange over it takes one RTT more.
func (l *Link) Listener(inner net.Listener) net.Listener {
	return &listener{Listener: inner, link: l}
}

type listener struct {
	net.Listener
	link *Link
}

func (ln *listener) Accept() (net.Conn, error) {
	c, err := ln.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return ln.link.Conn(c), nil
}
