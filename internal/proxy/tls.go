package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSConfig is TLS on the client listener: a certificate and its key (PEM
// files), read again on every reload so that a renewed certificate takes
// effect without a restart.
type TLSConfig struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// UpstreamTLSConfig is TLS to https:// replicas: the CA that signed their
// certificates (else the system's), and an optional client certificate.
// It is read at start; changing it needs a restart.
type UpstreamTLSConfig struct {
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

func (t TLSConfig) load() (*tls.Certificate, error) {
	switch {
	case t.CertFile == "" && t.KeyFile == "":
		return nil, nil
	case t.CertFile == "" || t.KeyFile == "":
		return nil, errors.New("config: tls needs both cert_file and key_file")
	}
	c, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("config: tls: %w", err)
	}
	return &c, nil
}

// client returns the TLS config of connections to replicas (nil: Go's
// defaults).
func (t UpstreamTLSConfig) client() (*tls.Config, error) {
	if t == (UpstreamTLSConfig{}) {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("config: upstream_tls.ca_file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("config: upstream_tls.ca_file %s holds no PEM certificate", t.CAFile)
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("config: upstream_tls: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	case t.CertFile != "" || t.KeyFile != "":
		return nil, errors.New("config: upstream_tls needs both cert_file and key_file for a client certificate")
	}
	return c, nil
}

// ServesTLS reports whether the client listener is to serve TLS.
func (s *Server) ServesTLS() bool { return s.cert.Load() != nil }

// TLSConfig is the client listener's TLS config: its certificate is the
// one the last (re)load read.
func (s *Server) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		c := s.cert.Load()
		if c == nil {
			return nil, errors.New("no certificate")
		}
		return c, nil
	}}
}
