package proxy

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/fleet"
)

// A replica's connection is kept for the next request once a stream ends:
// an engine (uvicorn under vLLM and SGLang, with TCP_NODELAY) writes the
// stream's "data: [DONE]" chunk and the chunked body's terminator in two
// writes, and a relay that closes the body as soon as it relayed [DONE],
// before that terminator came, makes the transport drop the connection:
// every stream then pays a new TCP (and TLS) handshake to its replica,
// a round trip or more to a replica in another region, and leaves a
// socket in TIME_WAIT.
func TestStreamEndKeepsTheReplicaConnection(t *testing.T) {
	var conns atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		if r.Method == http.MethodGet {
			http.NotFound(w, r)
			return
		}
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(5 * time.Millisecond) // the terminator follows in its own write
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	_, url := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour, ScrapeInterval: time.Hour}}, fakeReplica(up.URL))
	post(t, url, chatBody("warm up", 1, true))
	time.Sleep(50 * time.Millisecond)
	before := conns.Load()
	for range 10 {
		code, body, _ := post(t, url, chatBody("hello", 1, true))
		if code != 200 || !strings.Contains(body, "[DONE]") {
			t.Fatalf("status %d: %q", code, body)
		}
	}
	// Each end waits 50 ms for the terminator the replica writes 5 ms
	// later: a loaded machine may miss a few, not all (before: 10 of 10).
	if n := conns.Load() - before; n > 3 {
		t.Errorf("10 streams, one after another, opened %d new connections to the replica; want them on a kept-alive one", n)
	}
}
