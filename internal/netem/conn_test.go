package netem

import (
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"
)

// The tests run on slow shared machines: timing assertions have generous
// tolerances and check what distinguishes right from wrong (a delay is
// applied once, not accumulated; it is applied at all).

// checkGoroutines fails the test if the number of goroutines does not settle
// back to its value at the start. Call it first, so that its cleanup runs last.
func checkGoroutines(t *testing.T) {
	t.Helper()
	base := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			n := runtime.NumGoroutine()
			if n <= base {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("goroutines leaked: %d at the end, %d at the start\n%s", n, base, buf)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// tcpPair returns the two ends of a loopback TCP connection, closed at cleanup
// (closing an end that a wrapper already closed is harmless).
func tcpPair(tb testing.TB) (client, server net.Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	server = <-ch
	if server == nil {
		tb.Fatal("accept failed")
	}
	tb.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}

func TestLinkSetGet(t *testing.T) {
	l := NewLink(80*time.Millisecond, 10*time.Millisecond, 1)
	if rtt, j := l.Get(); rtt != 80*time.Millisecond || j != 10*time.Millisecond {
		t.Fatalf("Get = %v, %v", rtt, j)
	}
	l.Set(200*time.Millisecond, 0)
	if rtt, j := l.Get(); rtt != 200*time.Millisecond || j != 0 {
		t.Fatalf("Get after Set = %v, %v", rtt, j)
	}
	l.Set(-time.Second, -time.Second)
	if rtt, j := l.Get(); rtt != 0 || j != 0 {
		t.Fatalf("negative Set: Get = %v, %v", rtt, j)
	}
}

// oneWay draws a one-way delay, as a chunk after a long gap does.
func (l *Link) oneWay() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.drawLocked()
}

func TestOneWayDelayDraws(t *testing.T) {
	exact := NewLink(80*time.Millisecond, 0, 1)
	for range 100 {
		if d := exact.oneWay(); d != 40*time.Millisecond {
			t.Fatalf("no jitter: one-way delay %v, want exactly 40ms", d)
		}
	}

	a, b := NewLink(80*time.Millisecond, 20*time.Millisecond, 42), NewLink(80*time.Millisecond, 20*time.Millisecond, 42)
	c := NewLink(80*time.Millisecond, 20*time.Millisecond, 43)
	differ := false
	for range 100 {
		da, db, dc := a.oneWay(), b.oneWay(), c.oneWay()
		if da != db {
			t.Fatalf("same seed, different draws: %v vs %v", da, db)
		}
		differ = differ || da != dc
	}
	if !differ {
		t.Error("different seeds gave the same draws")
	}

	// Mean 10ms, standard deviation 28ms: about 36% of the draws are floored.
	floor := NewLink(20*time.Millisecond, 40*time.Millisecond, 7)
	var zeros, sum int
	var ds []time.Duration
	for range 2000 {
		d := floor.oneWay()
		if d < 0 {
			t.Fatalf("negative delay %v", d)
		}
		if d == 0 {
			zeros++
		}
		ds = append(ds, d)
		sum += int(d)
	}
	if zeros < 400 || zeros > 900 {
		t.Errorf("%d of 2000 draws floored at 0, want about 720", zeros)
	}
	slices.Sort(ds)
	t.Logf("rtt 20ms jitter 40ms: one-way min %v median %v max %v, %d zeros", ds[0], ds[len(ds)/2], ds[len(ds)-1], zeros)
}

// TestWayKeepsItsDelay: chunks on a way within Hold jitters of the one
// before keep its delay, however long the stream; a longer gap, or a Set,
// draws anew; two ways draw apart.
func TestWayKeepsItsDelay(t *testing.T) {
	l := NewLink(100*time.Millisecond, 20*time.Millisecond, 5)
	hold := Hold * 20 * time.Millisecond
	at := time.Unix(1000, 0)
	var w, other way
	first := l.delay(&w, at)
	if d := l.delay(&other, at); d == first {
		t.Errorf("two ways drew the same delay %v", d)
	}
	for range 50 { // a stream of 50 chunks, 10 s in all
		at = at.Add(hold - time.Millisecond)
		if d := l.delay(&w, at); d != first {
			t.Fatalf("a chunk %v after the one before got %v, want the stream's %v", hold-time.Millisecond, d, first)
		}
	}
	redrawn := 0
	prev := first
	for range 50 {
		at = at.Add(hold)
		if d := l.delay(&w, at); d != prev {
			redrawn++
			prev = d
		}
	}
	if redrawn < 45 {
		t.Errorf("after gaps of Hold jitters, %d of 50 chunks drew anew", redrawn)
	}
	l.Set(100*time.Millisecond, 20*time.Millisecond)
	if d := l.delay(&w, at.Add(time.Millisecond)); d == prev {
		t.Error("a chunk right after Set kept the old delay")
	}
	exact := NewLink(80*time.Millisecond, 0, 1)
	var e way
	for i := range 5 {
		if d := exact.delay(&e, at.Add(time.Duration(i)*time.Second)); d != 40*time.Millisecond {
			t.Fatalf("no jitter: %v, want exactly 40ms", d)
		}
	}
}

// TestRoundTripJitter: a round trip, one draw each way, has the link's
// jitter as its standard deviation, as the simulator's round trips do (the
// way's standard deviation was jitter/2, which gave the round trip
// jitter/√2).
func TestRoundTripJitter(t *testing.T) {
	l := NewLink(time.Second, 100*time.Millisecond, 3)
	const n = 20000
	var sum, sq float64
	for range n {
		rt := float64(l.oneWay()+l.oneWay()) / float64(time.Millisecond)
		sum += rt
		sq += rt * rt
	}
	mean := sum / n
	sd := math.Sqrt(sq/n - mean*mean)
	if math.Abs(mean-1000) > 5 || math.Abs(sd-100) > 5 {
		t.Errorf("round trip mean %.1f ms, sd %.1f ms; want 1000 and 100", mean, sd)
	}
}

func TestDelayBothDirections(t *testing.T) {
	checkGoroutines(t)
	a, b := tcpPair(t)
	link := NewLink(200*time.Millisecond, 0, 1)
	wa := link.Conn(a)
	defer wa.Close()

	// Outgoing: Write returns at once, the peer gets the bytes 100ms later.
	start := time.Now()
	if _, err := wa.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("Write blocked for %v", d)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(b, buf); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 95*time.Millisecond || d > 400*time.Millisecond {
		t.Errorf("outgoing bytes arrived after %v, want about 100ms", d)
	}

	// Incoming: bytes the peer sends are returned 100ms after they arrive.
	start = time.Now()
	if _, err := b.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(wa, buf); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 95*time.Millisecond || d > 400*time.Millisecond {
		t.Errorf("incoming bytes returned after %v, want about 100ms", d)
	}
	if string(buf) != "pong" {
		t.Errorf("read %q", buf)
	}
}

// TestJitterStream sends numbered, timestamped messages through a jittery
// link, in bursts of 2 ms apart with gaps longer than the Hold between
// them, wrapping the writing end or the reading end: they arrive in order,
// each burst keeps one delay (TestWayKeepsItsDelay), and the bursts' delays
// vary.
func TestJitterStream(t *testing.T) {
	for _, side := range []string{"write", "read"} {
		t.Run(side, func(t *testing.T) {
			checkGoroutines(t)
			a, b := tcpPair(t)
			const jitter = 40 * time.Millisecond
			link := NewLink(40*time.Millisecond, jitter, 3)
			var w io.Writer = a
			var r io.Reader = b
			if side == "write" {
				wa := link.Conn(a)
				defer wa.Close()
				w = wa
			} else {
				wb := link.Conn(b)
				defer wb.Close()
				r = wb
			}
			const bursts, each = 12, 5
			const n = bursts * each
			base := time.Now()
			errc := make(chan error, 1)
			go func() {
				var msg [16]byte
				for i := range n {
					if i > 0 && i%each == 0 {
						time.Sleep(Hold*jitter + 30*time.Millisecond)
					}
					binary.BigEndian.PutUint64(msg[:8], uint64(i))
					binary.BigEndian.PutUint64(msg[8:], uint64(time.Since(base)))
					if _, err := w.Write(msg[:]); err != nil {
						errc <- err
						return
					}
					time.Sleep(2 * time.Millisecond)
				}
				errc <- nil
			}()
			var delays []time.Duration
			var msg [16]byte
			for i := range n {
				if _, err := io.ReadFull(r, msg[:]); err != nil {
					t.Fatal(err)
				}
				arrived := time.Since(base)
				if seq := binary.BigEndian.Uint64(msg[:8]); seq != uint64(i) {
					t.Fatalf("message %d arrived in place %d", seq, i)
				}
				sent := time.Duration(binary.BigEndian.Uint64(msg[8:]))
				delays = append(delays, arrived-sent)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			for _, d := range delays {
				if d < 0 {
					t.Errorf("negative delay %v", d)
				}
			}
			var firsts []time.Duration // each burst's first message's
			held := 0                  // bursts whose messages kept one delay
			for i := 0; i < n; i += each {
				firsts = append(firsts, delays[i])
				if burst := delays[i : i+each]; slices.Max(burst)-slices.Min(burst) < 10*time.Millisecond {
					held++
				}
			}
			lo, hi := slices.Min(firsts), slices.Max(firsts)
			t.Logf("bursts' one-way delays: %v; %d of %d bursts kept one", firsts, held, bursts)
			if hi-lo < 10*time.Millisecond {
				t.Errorf("the bursts' delays do not vary: min %v max %v", lo, hi)
			}
			// Within 10 ms of each other (the machine's scheduling noise,
			// generously), in half the bursts at least: drawn per message,
			// 2 ms apart with a way's standard deviation of 28 ms, they
			// spread wider in nearly all.
			if held < bursts/2 {
				t.Errorf("%d of %d bursts kept one delay, want most", held, bursts)
			}
		})
	}
}

func TestReadDeadline(t *testing.T) {
	checkGoroutines(t)
	a, b := tcpPair(t)
	link := NewLink(400*time.Millisecond, 0, 1)
	wb := link.Conn(b)
	defer wb.Close()

	// A deadline set in the past wakes a blocked Read (http.Server does this
	// to stop its background read).
	errc := make(chan error, 1)
	go func() {
		_, err := wb.Read(make([]byte, 8))
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	wb.SetReadDeadline(time.Unix(1, 0))
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read after deadline in the past: %v", err)
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("error %v is not a net.Error timeout", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Read not woken by a deadline in the past")
	}
	t.Logf("blocked Read woken %v after SetReadDeadline(past)", time.Since(start))

	// A deadline that passes while the data is in flight times out; the
	// data is kept for the next Read.
	wb.SetReadDeadline(time.Time{})
	start = time.Now()
	if _, err := a.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	wb.SetReadDeadline(start.Add(50 * time.Millisecond))
	buf := make([]byte, 16)
	n, err := wb.Read(buf)
	if n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read = %d, %v; want a timeout", n, err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > 190*time.Millisecond {
		t.Errorf("timed out after %v, want 50ms", d)
	}
	wb.SetReadDeadline(time.Time{})
	n, err = wb.Read(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}
	if d := time.Since(start); d < 190*time.Millisecond {
		t.Errorf("data returned after %v, want 200ms", d)
	}
}
