package proxy

import (
	"crypto/tls"
	"errors"
	"fmt"
)

// TLSConfig is TLS on the client listener: a certificate and its key (PEM
// files), read again on every reload so that a renewed certificate takes
// effect without a restart.
type TLSConfig struct {
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
