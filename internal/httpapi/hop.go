package httpapi

import (
	"net/http"
	"strings"
)

// hopByHop are the headers a proxy must not forward (RFC 9110 7.6.1, and
// what Go's httputil.ReverseProxy removes), with Content-Length (set anew)
// and Accept-Encoding (gorgo reads answers uncompressed).
var hopByHop = map[string]bool{"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true, "Accept-Encoding": true}

// EndToEnd reports whether header k (canonical) goes on past a proxy: it
// is not hop-by-hop, nor named by connection (its headers' Connection
// values, read once by the caller).
func EndToEnd(k string, connection []string) bool {
	if hopByHop[k] {
		return false
	}
	for _, v := range connection {
		for f := range strings.SplitSeq(v, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(f)) == k {
				return false
			}
		}
	}
	return true
}
