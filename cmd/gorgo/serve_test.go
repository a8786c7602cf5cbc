package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admin"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/serve"
)

// A graceful shutdown lets a stream in flight finish, and refuses new
// connections meanwhile.
func TestGracefulShutdownLetsStreamsFinish(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			return // /health, /metrics
		}
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":" one"}}]}`+"\n\n")
		w.(http.Flusher).Flush()
		<-release // the rest of the answer comes after the shutdown began
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":" two"}}]}`+"\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	cfg := serve.Config{Admin: admin.Config{Listen: admin.Off}}
	cfg.Replicas = []fleet.ReplicaConfig{{ID: "a", URL: up.URL}}
	srv, err := serve.New(cfg, serve.Options{Proxy: true})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv.Fleet.ProbeOnce(ctx)
	done := make(chan error, 1)
	go func() {
		done <- serveAll(ctx, srv.Run, served{h: srv.Proxy.Handler(), ln: ln, grace: 20 * time.Second})
	}()
	url := "http://" + ln.Addr().String()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 16)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	cancel() // SIGTERM
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			break // new connections are refused
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("new connections still accepted after the shutdown began")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	rest, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !strings.Contains(string(rest), "[DONE]") {
		t.Errorf("the stream in flight was cut: %q, %v", rest, err)
	}
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
}

// Idle keep-alive connections are closed after idle_timeout, and a client
// that dawdles over its headers after read_header_timeout (slowloris).
func TestIdleAndSlowClientsAreCut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	go func() {
		done <- serveAll(ctx, func(ctx context.Context) error { <-ctx.Done(); return nil },
			served{h: h, ln: ln, idle: 100 * time.Millisecond, readHeader: 100 * time.Millisecond})
	}()
	defer func() { cancel(); <-done }()
	for _, c := range []struct{ name, send string }{
		{"idle after a request", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"slow headers", "GET / HTTP/1.1\r\nHost: x\r\n"}, // never finished
	} {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, c.send)
		conn.SetReadDeadline(time.Now().Add(20 * time.Second)) // the failure would be a connection left open
		_, err = io.ReadAll(conn)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("%s: the connection is still open", c.name)
		}
		conn.Close()
	}
}

// A SIGHUP that comes while serve probes its replicas at start (a config
// reloader signalling as soon as the process is up) does not end the
// process: it is caught from before the first probes. The command runs in
// a child process (this test binary, run again), which the test signals.
func TestHangupDuringTheFirstProbes(t *testing.T) {
	if args := os.Getenv("GORGO_TEST_CHILD_ARGS"); args != "" {
		os.Exit(run(strings.Fields(args), os.Stdout, os.Stderr))
	}
	probed, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			select {
			case probed <- struct{}{}:
			default:
			}
			<-release // the first probes wait for the signal to land
		}
	}))
	defer up.Close()
	defer once.Do(func() { close(release) })
	cmd := exec.Command(os.Args[0], "-test.run=^TestHangupDuringTheFirstProbes$")
	cmd.Env = append(os.Environ(), "GORGO_TEST_CHILD_ARGS=serve --replica a="+up.URL+
		" --listen 127.0.0.1:0 --admin-listen off --tune=false")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() {
		io.Copy(io.Discard, stdout) // drained before Wait, as Wait requires
		exited <- cmd.Wait()
	}()
	select {
	case <-probed:
	case err := <-exited:
		t.Fatalf("serve ended before probing: %v; stderr:\n%s", err, stderr.String())
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("serve did not probe its replica within a minute")
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		t.Fatalf("a SIGHUP during the first probes ended serve: %v; stderr:\n%s", err, stderr.String())
	case <-time.After(500 * time.Millisecond): // the signal's delivery, had it killed
	}
	once.Do(func() { close(release) })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("serve, stopped by SIGTERM: %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("serve did not stop within a minute of SIGTERM")
	}
}
