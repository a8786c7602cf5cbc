package admin

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
)

// With the default admin config (loopback, no token) a web page the
// operator visits can change the fleet: a cross-site "simple" POST
// (Content-Type text/plain, no preflight) adds a replica at the attacker's
// URL, drains replicas, pauses the tuner; and a DNS-rebound page (Host:
// attacker's name) can read and write everything.
// A page on another site the operator opens cannot drive the admin API
// through the browser (a "simple" POST needs no preflight), nor can one
// whose name an attacker rebinds to 127.0.0.1 read it; requests without a
// browser's headers (curl, scripts) and at a loopback name still work.
func TestAdminRefusesCrossSiteRequests(t *testing.T) {
	s := startAdmin(t, testConfig{}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	post := func(path, body string, hdr map[string]string) int {
		req, _ := http.NewRequest("POST", s.adminURL+path, strings.NewReader(body))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// What a browser sends for <form method=post enctype=text/plain> or
	// fetch(url, {method:"POST", mode:"no-cors", body}) from evil.example.
	xsite := map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}
	if code := post("/admin/replicas", `{"id":"evil","url":"http://203.0.113.7:8000"}`, xsite); code < 400 {
		t.Errorf("cross-site POST /admin/replicas: %d; the attacker's replica joined the fleet: %v", code, s.Router().Has("evil"))
	}
	if code := post("/admin/replicas/a/drain", "", xsite); code < 400 {
		t.Errorf("cross-site POST /admin/replicas/a/drain: %d", code)
	}
	// DNS rebinding: same-origin to the browser, but the Host is the
	// attacker's name.
	req, _ := http.NewRequest("GET", s.adminURL+"/admin/replicas", nil)
	req.Host = "rebind.evil.example:9091"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode < 400 {
		t.Errorf("GET /admin/replicas with Host %s: %d", req.Host, resp.StatusCode)
	}
	for _, host := range []string{"localhost:9091", "LOCALHOST", "localhost.:9091", "[::1]:9091", "127.0.0.1"} {
		req, _ := http.NewRequest("GET", s.adminURL+"/admin/replicas", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET /admin/replicas with Host %s: %d", host, resp.StatusCode)
		}
	}
	if code := post("/admin/replicas/a/drain", "", map[string]string{"Sec-Fetch-Site": "same-origin"}); code != 200 {
		t.Errorf("the live view's own POST (same-origin): %d", code)
	}
	if code := post("/admin/replicas/a/undrain", "", nil); code != 200 {
		t.Errorf("a script's POST: %d", code)
	}
	// An HTTP/1.0 health checker sends no Host at all.
	c, err := net.Dial("tcp", strings.TrimPrefix(s.adminURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET /metrics HTTP/1.0\r\n\r\n")
	status, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.Contains(status, " 200 ") {
		t.Errorf("GET /metrics over HTTP/1.0 without a Host: %q, %v", status, err)
	}
}
