// Package testpki makes certificate authorities and certificates in a
// test, written as PEM files the way an operator's would be: a CA, server
// certificates for names and addresses, client certificates.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

var serial atomic.Int64

// CA is a certificate authority made in the test.
type CA struct {
	t    testing.TB
	dir  string
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA certificate (PEM), mode 0644.
	File string
}

// Pair is an issued certificate and its files.
type Pair struct {
	Cert     *x509.Certificate
	TLS      tls.Certificate
	CertFile string // PEM, 0644
	KeyFile  string // PEM PKCS#8, 0600
}

// NewCA makes a CA named cn and writes its certificate under dir.
func NewCA(t testing.TB, dir, cn string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	ca := &CA{t: t, dir: dir, key: key}
	ca.Cert = ca.sign(&x509.Certificate{Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}, &key.PublicKey, true)
	ca.File = filepath.Join(dir, cn+".ca.pem")
	writePEM(t, ca.File, "CERTIFICATE", ca.Cert.Raw, 0o644)
	return ca
}

// Pool is a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

func (ca *CA) sign(tmpl *x509.Certificate, pub *ecdsa.PublicKey, self bool) *x509.Certificate {
	ca.t.Helper()
	tmpl.SerialNumber = big.NewInt(serial.Add(1) + time.Now().UnixNano()%1e9*1000)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	parent, key := tmpl, ca.key
	if !self {
		parent = ca.Cert
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	must(ca.t, err)
	c, err := x509.ParseCertificate(der)
	must(ca.t, err)
	return c
}

// Server issues a server certificate for names (DNS names or IP
// addresses), with common name names[0], written as name.crt / name.key.
func (ca *CA) Server(name string, names ...string) *Pair {
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: names[0]}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	return ca.issue(name, tmpl)
}

// Client issues a client certificate with common name cn and DNS SANs.
func (ca *CA) Client(name, cn string, dns ...string) *Pair {
	return ca.issue(name, &x509.Certificate{Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature})
}

func (ca *CA) issue(name string, tmpl *x509.Certificate) *Pair {
	t := ca.t
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	c := ca.sign(tmpl, &key.PublicKey, false)
	p := &Pair{Cert: c, TLS: tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: key, Leaf: c},
		CertFile: filepath.Join(ca.dir, name+".crt"), KeyFile: filepath.Join(ca.dir, name+".key")}
	writePEM(t, p.CertFile, "CERTIFICATE", c.Raw, 0o644)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	must(t, err)
	writePEM(t, p.KeyFile, "PRIVATE KEY", der, 0o600)
	return p
}

func writePEM(t testing.TB, path, typ string, der []byte, mode os.FileMode) {
	t.Helper()
	must(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode))
	must(t, os.Chmod(path, mode))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
