package netem

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCloseFlushes(t *testing.T) {
	checkGoroutines(t)
	a, b := tcpPair(t)
	link := NewLink(100*time.Millisecond, 0, 1)
	wa := link.Conn(a)
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i % 251)
	}
	got := make(chan []byte, 1)
	go func() {
		data, _ := io.ReadAll(b)
		got <- data
	}()
	start := time.Now()
	for p := want; len(p) > 0; p = p[64<<10:] {
		if _, err := wa.Write(p[:64<<10]); err != nil {
			t.Fatal(err)
		}
	}
	if err := wa.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 45*time.Millisecond {
		t.Errorf("Close returned after %v, before the bytes were due (50ms)", d)
	}
	if data := <-got; !bytes.Equal(data, want) {
		t.Fatalf("peer got %d bytes, want %d", len(data), len(want))
	}
	if _, err := wa.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close: %v", err)
	}
	if _, err := wa.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close: %v", err)
	}
	if err := wa.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}

func TestCloseWrite(t *testing.T) {
	checkGoroutines(t)
	a, b := tcpPair(t)
	link := NewLink(100*time.Millisecond, 0, 1)
	wa := link.Conn(a)
	defer wa.Close()
	cw, ok := wa.(interface{ CloseWrite() error })
	if !ok {
		t.Fatal("wrapped TCP conn has no CloseWrite")
	}
	plain := link.Conn(&plainConn{})
	if _, ok := plain.(interface{ CloseWrite() error }); ok {
		t.Error("conn without CloseWrite gained one")
	}
	plain.Close()
	start := time.Now()
	wa.Write([]byte("abc"))
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := wa.Write([]byte("x")); err == nil {
		t.Error("Write after CloseWrite succeeded")
	}
	data, err := io.ReadAll(b)
	if err != nil || string(data) != "abc" {
		t.Fatalf("peer read %q, %v", data, err)
	}
	if d := time.Since(start); d < 45*time.Millisecond {
		t.Errorf("EOF after %v, want 50ms", d)
	}
	// The other direction still works.
	b.Write([]byte("back"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(wa, buf); err != nil || string(buf) != "back" {
		t.Fatalf("read %q, %v", buf, err)
	}
}

// plainConn is a net.Conn without CloseWrite whose Read blocks until Close.
type plainConn struct {
	once   sync.Once
	closed chan struct{}
	mu     sync.Mutex
	werr   error
}

func (c *plainConn) init() { c.once.Do(func() { c.closed = make(chan struct{}) }) }
func (c *plainConn) Read([]byte) (int, error) {
	c.init()
	<-c.closed
	return 0, net.ErrClosed
}
func (c *plainConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.werr != nil {
		return 0, c.werr
	}
	return len(p), nil
}
func (c *plainConn) Close() error {
	c.init()
	select {
	case <-c.closed:
	default:
		close(c.closed)
	}
	return nil
}
func (c *plainConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *plainConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *plainConn) SetDeadline(time.Time) error      { return nil }
func (c *plainConn) SetReadDeadline(time.Time) error  { return nil }
func (c *plainConn) SetWriteDeadline(time.Time) error { return nil }

func TestWriteErrorSurfaces(t *testing.T) {
	checkGoroutines(t)
	boom := errors.New("boom")

	// The next Write returns the error.
	raw := &plainConn{werr: boom}
	c := NewLink(0, 0, 1).Conn(raw)
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	var err error
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err = c.Write([]byte("y")); err != nil {
			break
		}
	}
	if !errors.Is(err, boom) {
		t.Fatalf("Write after a failed write: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close after the error was reported: %v", err)
	}

	// Or Close does, when the failing write happens during its flush.
	c = NewLink(100*time.Millisecond, 0, 1).Conn(&plainConn{werr: boom})
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); !errors.Is(err, boom) {
		t.Fatalf("Close = %v, want %v", err, boom)
	}
}

// TestCloseBounded: a peer that stops reading fills the queue; Write then
// blocks until its deadline, and Close gives up after CloseGrace.
func TestCloseBounded(t *testing.T) {
	checkGoroutines(t)
	a, b := tcpPair(t)
	a.(*net.TCPConn).SetWriteBuffer(16 << 10)
	b.(*net.TCPConn).SetReadBuffer(16 << 10)
	wa := NewLink(20*time.Millisecond, 0, 1).Conn(a)
	start := time.Now()
	wa.SetWriteDeadline(start.Add(time.Second))
	chunk := make([]byte, 64<<10)
	written := 0
	var err error
	for time.Since(start) < 30*time.Second {
		var n int
		if n, err = wa.Write(chunk); err != nil {
			break
		}
		written += n
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write to a stalled peer: %v after %d bytes", err, written)
	}
	t.Logf("stalled peer: Write timed out after %v and %d MiB", time.Since(start).Round(time.Millisecond), written>>20)
	if written < maxQueued {
		t.Errorf("Write blocked after %d bytes, before the queue (%d) was full", written, maxQueued)
	}
	start = time.Now()
	err = wa.Close()
	d := time.Since(start)
	t.Logf("Close took %v: %v", d.Round(time.Millisecond), err)
	if !errors.Is(err, ErrFlushTimeout) {
		t.Errorf("Close = %v, want ErrFlushTimeout", err)
	}
	if d > CloseGrace+2*time.Second {
		t.Errorf("Close took %v", d)
	}
}

// TestConcurrentUse exercises Read, Write, deadlines and Close from several
// goroutines at once, for the race detector.
func TestConcurrentUse(t *testing.T) {
	checkGoroutines(t)
	a, b := tcpPair(t)
	link := NewLink(4*time.Millisecond, 4*time.Millisecond, 9)
	wa, wb := link.Conn(a), link.Conn(b)
	defer wb.Close()

	const total = 256 << 10
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { // echo on b
		defer wg.Done()
		io.CopyN(wb, wb, total)
	}()
	go func() { // write on a
		defer wg.Done()
		msg := []byte(strings.Repeat("0123456789abcdef", 64))
		for sent := 0; sent < total; sent += len(msg) {
			wa.Write(msg)
		}
	}()
	got := make(chan int64, 1)
	go func() { // read on a
		defer wg.Done()
		n, _ := io.CopyN(io.Discard, wa, total)
		got <- n
	}()
	stop := make(chan struct{})
	go func() { // fiddle with deadlines
		for {
			select {
			case <-stop:
				return
			default:
			}
			wa.SetDeadline(time.Now().Add(time.Minute))
			wb.SetReadDeadline(time.Time{})
			runtime.Gosched()
		}
	}()
	wg.Wait()
	close(stop)
	if n := <-got; n != total {
		t.Fatalf("echoed %d bytes, want %d", n, total)
	}

	// Close while a Read blocks and a Write loops.
	readErr := make(chan error, 1)
	go func() {
		_, err := wa.Read(make([]byte, 1))
		readErr <- err
	}()
	writeErr := make(chan error, 1)
	go func() {
		for {
			if _, err := wa.Write([]byte("x")); err != nil {
				writeErr <- err
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	time.Sleep(20 * time.Millisecond)
	if err := wa.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-readErr; !errors.Is(err, net.ErrClosed) {
		t.Errorf("blocked Read at Close: %v", err)
	}
	if err := <-writeErr; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close: %v", err)
	}
}

// benchmarkThroughput writes 32 KiB chunks through a, read from b.
func benchmarkThroughput(bm *testing.B, wrap func(net.Conn) net.Conn) {
	a, b := tcpPair(bm)
	wa, wb := wrap(a), wrap(b)
	done := make(chan int64)
	go func() {
		n, _ := io.Copy(io.Discard, wb)
		done <- n
	}()
	buf := make([]byte, 32<<10)
	bm.SetBytes(int64(len(buf)))
	bm.ReportAllocs()
	for bm.Loop() {
		if _, err := wa.Write(buf); err != nil {
			bm.Fatal(err)
		}
	}
	wa.Close() // flushes
	n := <-done
	bm.StopTimer()
	wb.Close()
	if want := int64(bm.N) * int64(len(buf)); n != want {
		bm.Fatalf("read %d bytes, want %d", n, want)
	}
}

// BenchmarkThroughput measures a loopback TCP connection wrapped at both ends
// by a zero-delay link.
func BenchmarkThroughput(b *testing.B) {
	link := NewLink(0, 0, 1)
	benchmarkThroughput(b, link.Conn)
}

// BenchmarkThroughputRaw is the same without the wrapper, for comparison.
func BenchmarkThroughputRaw(b *testing.B) {
	benchmarkThroughput(b, func(c net.Conn) net.Conn { return c })
}
