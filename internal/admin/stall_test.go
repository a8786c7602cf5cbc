package admin

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// A live view's client that stops reading is dropped once a snapshot
// waits on it for viewWriteTimeout, rather than holding its goroutine,
// its connection and a snapshot for as long as the connection stays open.
func TestStalledLiveViewIsDropped(t *testing.T) {
	saved := viewWriteTimeout
	viewWriteTimeout = 300 * time.Millisecond // before the server starts
	t.Cleanup(func() { viewWriteTimeout = saved })
	s := startAdmin(t, testConfig{}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	fb := make([]router.Candidate, 2000) // snapshots of megabytes: the socket's buffers fill
	for i := range fb {
		fb[i].ID = fmt.Sprintf("replica-%d", i)
	}
	for range 50 {
		s.admin.view.Decided(time.Now(), &policy.Request{Model: "m"}, &router.Ticket{ID: "a"}, fb)
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.adminURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(conn, "GET /admin/ui/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") // and never read
	watchers := func() int {
		s.admin.view.mu.Lock()
		defer s.admin.view.mu.Unlock()
		return len(s.admin.view.watchers)
	}
	deadline := time.Now().Add(30 * time.Second)
	for watchers() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if watchers() == 0 {
		t.Fatal("the stream never started")
	}
	for watchers() != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := watchers(); n != 0 {
		t.Errorf("a live view that read nothing for 30 s is still served (%d watcher)", n)
	}
}
