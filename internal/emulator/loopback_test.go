package emulator

import (
	"net"
	"net/http"
	"testing"
)

// newLoopback serves srv on a loopback port and returns its base URL.
func newLoopback(tb testing.TB, srv *http.Server) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String()
}
