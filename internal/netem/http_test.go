package netem

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"testing"
	"time"
)

// startHTTP serves h on a loopback listener wrapped by link and returns the
// listener's address. The server is closed at cleanup.
func startHTTP(t *testing.T, link *Link, h http.Handler, configure func(*http.Server)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	if configure != nil {
		configure(srv)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(link.Listener(ln)) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

func healthMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})
	return mux
}

func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestHTTPRoundTrip: a request on an established keep-alive connection takes
// the configured RTT, and follows Link.Set.
func TestHTTPRoundTrip(t *testing.T) {
	checkGoroutines(t)
	link := NewLink(80*time.Millisecond, 0, 1)
	addr := startHTTP(t, link, healthMux(), nil)
	client := newClient(t)

	get := func() (time.Duration, bool) {
		t.Helper()
		reused := false
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, _ := http.NewRequest("GET", "http://"+addr+"/health", nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if err != nil || string(body) != "ok\n" {
			t.Fatalf("body %q, %v", body, err)
		}
		return d, reused
	}
	measure := func(n int) (time.Duration, []time.Duration) {
		var ds []time.Duration
		for range n {
			d, reused := get()
			if !reused {
				t.Error("request did not reuse the keep-alive connection")
			}
			ds = append(ds, d.Round(100*time.Microsecond))
		}
		return median(ds), ds
	}

	first, _ := get() // opens the connection
	t.Logf("first request (new connection): %v", first.Round(100*time.Microsecond))
	for _, rtt := range []time.Duration{80 * time.Millisecond, 200 * time.Millisecond, 0} {
		link.Set(rtt, 0)
		med, ds := measure(7)
		t.Logf("RTT %v: median round trip %v of %v", rtt, med, ds)
		if rtt == 0 {
			if med > 20*time.Millisecond {
				t.Errorf("RTT 0: median round trip %v", med)
			}
			continue
		}
		// Late wakes on a busy machine only add: the bound above is looser.
		if med < rtt*8/10 || med > rtt+50*time.Millisecond {
			t.Errorf("RTT %v: median round trip %v, want -20%% to +50 ms", rtt, med)
		}
	}
}

// TestHTTPServerSentEvents: chunks flushed 20ms apart arrive 20ms apart, each
// delayed by one half of the RTT after it was written, not accumulating.
func TestHTTPServerSentEvents(t *testing.T) {
	checkGoroutines(t)
	const rtt, n, gap = 80 * time.Millisecond, 10, 20 * time.Millisecond
	link := NewLink(rtt, 0, 1)
	sentc := make(chan []time.Time, 1)
	mux := healthMux()
	mux.HandleFunc("GET /stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		var sent []time.Time
		for i := range n {
			if i > 0 {
				time.Sleep(gap)
			}
			sent = append(sent, time.Now())
			fmt.Fprintf(w, "data: %d\n\n", i)
			fl.Flush()
		}
		sentc <- sent
	})
	addr := startHTTP(t, link, mux, nil)
	client := newClient(t)
	if resp, err := client.Get("http://" + addr + "/health"); err == nil { // warm up
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	start := time.Now()
	resp, err := client.Get("http://" + addr + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var arrived []time.Time
	for len(arrived) < n {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d events: %v", len(arrived), err)
		}
		if strings.HasPrefix(line, "data: ") {
			if want := fmt.Sprintf("data: %d\n", len(arrived)); line != want {
				t.Fatalf("got %q, want %q", line, want)
			}
			arrived = append(arrived, time.Now())
		}
	}
	sent := <-sentc

	first := arrived[0].Sub(start)
	var oneWay, gaps []time.Duration
	for i := range n {
		oneWay = append(oneWay, arrived[i].Sub(sent[i]).Round(100*time.Microsecond))
		if i > 0 {
			gaps = append(gaps, arrived[i].Sub(arrived[i-1]).Round(100*time.Microsecond))
		}
	}
	t.Logf("first event after %v; per-event delay %v; gaps %v", first.Round(100*time.Microsecond), oneWay, gaps)
	if first < rtt*8/10 || first > rtt+100*time.Millisecond {
		t.Errorf("first event after %v, want about %v", first, rtt)
	}
	for i, d := range oneWay {
		if d < rtt/2*8/10 || d > rtt/2+150*time.Millisecond {
			t.Errorf("event %d arrived %v after it was written, want about %v", i, d, rtt/2)
		}
	}
	if g := median(gaps); g < gap/2 || g > 2*gap {
		t.Errorf("median gap between events %v, want about %v", g, gap)
	}
}

// TestHTTPCloseFlushes: a 1 MiB body followed by the server closing the
// connection arrives whole.
func TestHTTPCloseFlushes(t *testing.T) {
	checkGoroutines(t)
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i % 253)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /big", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.Write(want)
	})
	addr := startHTTP(t, NewLink(100*time.Millisecond, 0, 1), mux, nil)
	client := newClient(t)
	start := time.Now()
	resp, err := client.Get("http://" + addr + "/big")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("after %d bytes: %v", len(body), err)
	}
	t.Logf("1 MiB with Connection: close in %v", time.Since(start).Round(time.Millisecond))
	if !resp.Close {
		t.Error("response not marked Connection: close")
	}
	if !bytes.Equal(body, want) {
		t.Fatalf("got %d bytes, want %d", len(body), len(want))
	}
}

// rawRequest sends a GET on a plain TCP connection and reads the response
// headers, leaving the body to the caller.
func rawRequest(t *testing.T, addr, path string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: netem.test\r\n\r\n", path)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, br, resp
}

// TestHTTPIdleTimeout: the server's IdleTimeout (a read deadline on the
// wrapped conn) closes an idle keep-alive connection.
func TestHTTPIdleTimeout(t *testing.T) {
	checkGoroutines(t)
	const idle = 300 * time.Millisecond
	addr := startHTTP(t, NewLink(40*time.Millisecond, 0, 1), healthMux(), func(s *http.Server) {
		s.IdleTimeout = idle
	})
	_, br, resp := rawRequest(t, addr, "/health")
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	_, err := br.ReadByte()
	d := time.Since(answered)
	t.Logf("idle connection closed by the server %v after the response (IdleTimeout %v): %v", d.Round(time.Millisecond), idle, err)
	if err != io.EOF {
		t.Fatalf("read on the idle connection: %v, want EOF", err)
	}
	if d < idle/2 || d > idle+time.Second {
		t.Errorf("closed after %v, want about %v", d, idle)
	}
}

// TestHTTPClientDisconnect: a handler's request context is cancelled about
// one one-way delay after the client hangs up.
func TestHTTPClientDisconnect(t *testing.T) {
	checkGoroutines(t)
	const rtt = 80 * time.Millisecond
	done := make(chan time.Time, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /wait", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			done <- time.Now()
		case <-time.After(10 * time.Second):
			done <- time.Time{}
		}
	})
	addr := startHTTP(t, NewLink(rtt, 0, 1), mux, nil)
	c, _, resp := rawRequest(t, addr, "/wait")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	hungUp := time.Now()
	c.Close()
	noticed := <-done
	if noticed.IsZero() {
		t.Fatal("handler never noticed the disconnect")
	}
	d := noticed.Sub(hungUp)
	t.Logf("disconnect noticed by the handler after %v (RTT %v)", d.Round(100*time.Microsecond), rtt)
	if d < rtt/2*8/10 || d > rtt+250*time.Millisecond {
		t.Errorf("disconnect noticed after %v, want about %v", d, rtt/2)
	}
}
