package proxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/prometheus/client_golang/prometheus"
)

// selfSigned writes a certificate for 127.0.0.1 (and its key) to dir and
// returns the files and the certificate.
func selfSigned(t *testing.T, dir, name string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	return certFile, keyFile, cert
}

// TLS both ways: clients reach the proxy over TLS (a reload renews the
// certificate), and the proxy reaches an https replica whose CA it is
// given.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"completion_tokens":1}}`)
	}))
	defer up.Close()
	ca := filepath.Join(dir, "upstream-ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw}), 0o600)
	certFile, keyFile, first := selfSigned(t, dir, "one")
	cfg := testConfig{Fleet: fleet.Config{UpstreamTLS: fleet.UpstreamTLSConfig{CAFile: ca}, Replicas: []fleet.ReplicaConfig{{ID: "a", URL: up.URL}}}, Proxy: Config{TLS: TLSConfig{CertFile: certFile, KeyFile: keyFile}}}
	reg := prometheus.NewRegistry()
	f, err := fleet.New(cfg.Fleet, fleet.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(f, cfg.Proxy, reg, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.ProbeOnce(t.Context())
	if st, _ := f.Router().Replica("a"); !st.Available() {
		t.Fatal("the https replica was not reached (its CA is configured)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s.Handler()}
	go hs.Serve(tls.NewListener(ln, s.TLSConfig()))
	defer hs.Close()
	url := "https://" + ln.Addr().String()
	client := func(trust *x509.Certificate) *http.Client {
		pool := x509.NewCertPool()
		pool.AddCert(trust)
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	resp, err := client(first).Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hi", 1, false)))
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil {
		t.Fatalf("over TLS: %d", resp.StatusCode)
	}
	// A renewed certificate, applied by a reload.
	_, _, second := selfSigned(t, dir, "one") // overwrites the files
	apply, _, err := s.Prepare(cfg.Proxy)
	if err != nil {
		t.Fatal(err)
	}
	apply()
	if _, err := client(second).Get(url + "/health"); err != nil {
		t.Errorf("the renewed certificate is not served: %v", err)
	}
	// A reload cannot turn TLS off.
	off := cfg.Proxy
	off.TLS = TLSConfig{}
	if _, _, err := s.Prepare(off); err == nil {
		t.Error("a reload turned TLS off")
	}
}

// Past max_connections, a TLS listener's refusal is a 503 over TLS (found
// in review: it was written in plaintext before the handshake, and the
// client read "server gave HTTP response to HTTPS client").
func TestConnectionRefusalOverTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, cert := selfSigned(t, dir, "gorgo")
	tr, _ := startProxy(t, testConfig{Fleet: fleet.Config{ProbeInterval: time.Hour}, Proxy: Config{TLS: TLSConfig{CertFile: certFile, KeyFile: keyFile}}}, fakeUpstream(t, func(http.ResponseWriter, *http.Request) {}))
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := tls.NewListener(tr.proxy.LimitListener(raw, 1), tr.proxy.TLSConfig()) // as gorgo serve stacks them
	hs := &http.Server{Handler: tr.proxy.Handler()}
	go hs.Serve(ln)
	defer hs.Close()
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	conf := &tls.Config{RootCAs: pool}
	first, err := tls.Dial("tcp", raw.Addr().String(), conf) // holds the one connection
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if err := first.Handshake(); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 20 * time.Second}
	resp, err := client.Get("https://" + raw.Addr().String() + "/health")
	if err != nil {
		t.Fatalf("the connection over the cap: %v, want a 503 over TLS", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("status %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}
