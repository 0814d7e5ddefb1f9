package conf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSFiles are the files and names of a TLS client configuration for
// amqps:// (rabbit+ssl://) brokers.
type TLSFiles struct {
	// CAFile holds the PEM certificates of the CAs that sign the brokers'
	// certificates; they replace the system's roots. Empty: system roots.
	CAFile string
	// CertFile and KeyFile are the client certificate and key
	// (PEM), for brokers that require one (ssl_options.verify =
	// verify_peer, fail_if_no_peer_cert = true). Both or neither.
	CertFile, KeyFile string
	// ServerName is the name the brokers' certificates must carry. Empty:
	// the host of each broker's URL.
	ServerName string
}

// ClientTLS builds a client configuration from f, reading the files now:
// TLS 1.2 at least, the brokers' certificates always verified (there is
// no way to turn that off), the client certificate sent when asked.
func ClientTLS(f TLSFiles) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", f.CAFile)
		}
		c.RootCAs = pool
	}
	switch {
	case f.CertFile != "" && f.KeyFile != "":
		if st, err := os.Stat(f.KeyFile); err == nil && st.Mode().Perm()&0o007 != 0 {
			return nil, fmt.Errorf("key file %s has mode %v: chmod o-rwx it", f.KeyFile, st.Mode().Perm())
		}
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	case f.CertFile != "" || f.KeyFile != "":
		return nil, errors.New("client certificate and key go together")
	}
	return c, nil
}
