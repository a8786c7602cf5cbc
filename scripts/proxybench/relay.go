package main

import (
	"bytes"
	"flag"
	"io"
	"net/http"
	"time"
)

// The relay is the least a Go reverse proxy built on net/http can do per
// request: read the body, forward it with the standard Transport, copy the
// answer back as it comes (flushing each read, so streams stay streams).
// No parsing, no routing. Its throughput is the floor that net/http sets
// on the same core: what gorgo serve can at best approach while it keeps
// Go's HTTP stack.
func runRelay(args []string) error {
	fs := flag.NewFlagSet("relay", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:18600", "address to serve on")
	upstream := fs.String("upstream", "", "upstream base URL")
	fs.Parse(args)
	tr := &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, DisableCompression: true,
		WriteBufferSize: 64 << 10, ReadBufferSize: 64 << 10}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		req, err := http.NewRequestWithContext(r.Context(), r.Method, *upstream+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
			if err != nil {
				return
			}
		}
	})
	return http.ListenAndServe(*listen, h)
}
