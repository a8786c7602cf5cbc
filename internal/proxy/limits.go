package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gorgo-llm/gorgo/internal/httpapi"
)

// LimitListener caps the client connections open at once: past max, a new
// connection is answered with a 503 (Retry-After: 1, in OpenAI's error
// shape) once its request's head is in (within a second), and closed; in a
// flood, past maxRefusing such answers at once, it is closed unanswered; instead of waiting in the accept queue or
// exhausting the process's file descriptors. max ≤ 0 means no cap. ln is
// the raw listener, under the TLS one when the server serves TLS: the
// refusal is then sent over TLS (a client over the cap gets a 503, not
// bytes it cannot read).
func (s *Server) LimitListener(ln net.Listener, max int) net.Listener {
	if max <= 0 {
		return ln
	}
	l := &limitListener{Listener: ln, max: int64(max), s: s}
	if s.ServesTLS() {
		l.tls = s.TLSConfig()
	}
	return l
}

type limitListener struct {
	net.Listener
	max  int64
	open atomic.Int64
	s    *Server
	tls  *tls.Config // nil: plaintext
	// refusing counts the connections past the cap being answered.
	refusing atomic.Int64
}

// refusal is what a connection over the cap reads.
var refusal = func() []byte {
	body := `{"error":{"message":"too many connections: try again shortly","type":"ServiceUnavailableError","param":null,"code":503}}` + "\n"
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}()

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			return &countedConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		l.s.m.refused.WithLabelValues("max_connections").Inc()
		if l.refusing.Add(1) > maxRefusing {
			// A flood: no answer, so that refusing costs no more than
			// the cap saves.
			l.refusing.Add(-1)
			_ = c.Close()
			continue
		}
		go func() { // do not hold up Accept for a slow client
			defer l.refusing.Add(-1)
			l.refuse(c)
		}()
	}
}

// maxRefusing bounds the connections past the cap being answered at once
// (each for at most a few seconds); past it they are closed unanswered.
const maxRefusing = 256

// refuse answers a connection over the cap with a 503 over TLS when the
// server serves it: after the request's head (an answer that comes before
// the request is one a client's connection pool discards), then closing
// its side first and reading what is left of the request for a moment,
// so that the close does not reset the connection under the answer.
func (l *limitListener) refuse(c net.Conn) {
	if l.tls != nil {
		c = tls.Server(c, l.tls)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second)) // the handshake reads too
	readHead(c)
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(refusal); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 256<<10))
}

// readHead reads, and drops, what a client sends up to the blank line
// that ends its request's head, at most 16 KiB of it, until c's deadline.
func readHead(c net.Conn) {
	r := bufio.NewReaderSize(io.LimitReader(c, 16<<10), 4<<10)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil || len(bytes.TrimRight(line, "\r\n")) == 0 {
			return
		}
	}
}

type countedConn struct {
	net.Conn
	l      *limitListener
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
	}
	return c.Conn.Close()
}

// limitInFlight answers 503 (Retry-After: 1) at once to a request past
// MaxInFlight requests being served.
func (s *Server) limitInFlight(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		max := int64(s.cfg.Load().MaxInFlight)
		if n := s.inFlight.Add(1); max > 0 && n > max {
			s.inFlight.Add(-1)
			s.m.refused.WithLabelValues("max_in_flight").Inc()
			w.Header().Set("Retry-After", "1")
			httpapi.Error(w, http.StatusServiceUnavailable, "too many requests in flight: try again shortly")
			return
		}
		defer s.inFlight.Add(-1)
		h(w, r)
	}
}
