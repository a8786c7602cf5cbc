package httpapi

import "testing"

// What goes on past a proxy: not the hop-by-hop headers, nor those the
// Connection header names.
func TestEndToEnd(t *testing.T) {
	conn := []string{"keep-alive, X-Private"}
	for k, want := range map[string]bool{"Authorization": true, "Content-Type": true, "X-Private": false,
		"Connection": false, "Transfer-Encoding": false, "Accept-Encoding": false, "Content-Length": false} {
		if got := EndToEnd(k, conn); got != want {
			t.Errorf("%s: %v, want %v", k, got, want)
		}
	}
	if !EndToEnd("X-Private", nil) {
		t.Error("X-Private without a Connection naming it")
	}
}
