package agentsecurity_test

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
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// pki is a CA made in the test, with a server certificate for
// "rabbit.test" (no IP address) and a client certificate for the agent.
type pki struct {
	dir                    string
	ca, server, client     *x509.Certificate
	caKey, srvKey, cliPriv *ecdsa.PrivateKey
	caFile, cliCrt, cliKey string
}

func newPKI(t *testing.T, dir string) *pki {
	t.Helper()
	p := &pki{dir: dir}
	var err error
	p.caKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p.ca = sign(t, &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vgpu test CA"},
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}, nil, &p.caKey.PublicKey, p.caKey)
	p.srvKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p.server = sign(t, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "rabbit.test"},
		DNSNames: []string{"rabbit.test"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}, p.ca, &p.srvKey.PublicKey, p.caKey)
	p.cliPriv, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p.client = sign(t, &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "vgpu-agent"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}, p.ca, &p.cliPriv.PublicKey, p.caKey)
	p.caFile, p.cliCrt, p.cliKey = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "agent.crt"), filepath.Join(dir, "agent.key")
	writePEM(t, p.caFile, "CERTIFICATE", p.ca.Raw, 0o644)
	writePEM(t, p.cliCrt, "CERTIFICATE", p.client.Raw, 0o644)
	der, err := x509.MarshalPKCS8PrivateKey(p.cliPriv)
	testsvc.Must(t, err, "client key")
	writePEM(t, p.cliKey, "PRIVATE KEY", der, 0o600)
	return p
}

func sign(t *testing.T, tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, key *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	testsvc.Must(t, err, "certificate")
	c, err := x509.ParseCertificate(der)
	testsvc.Must(t, err, "certificate")
	return c
}

func writePEM(t *testing.T, path, typ string, der []byte, mode os.FileMode) {
	t.Helper()
	testsvc.Must(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode), "write "+path)
}

// tlsFront is a TLS listener with RabbitMQ's ssl_options (verify_peer,
// fail_if_no_peer_cert) in front of the real broker: it terminates TLS
// with the test CA's server certificate and forwards to RabbitMQ.
type tlsFront struct {
	addr     string
	verified atomic.Int64 // connections with a verified client certificate
}

func newTLSFront(t *testing.T, p *pki) *tlsFront {
	t.Helper()
	u, err := url.Parse(testsvc.RabbitURL(t))
	testsvc.Must(t, err, "rabbit url")
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
		Certificates: []tls.Certificate{{Certificate: [][]byte{p.server.Raw}, PrivateKey: p.srvKey}}}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	testsvc.Must(t, err, "tls listen")
	t.Cleanup(func() { ln.Close() })
	f := &tlsFront{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				if err := tc.Handshake(); err != nil {
					return
				}
				_ = tc.SetDeadline(time.Time{})
				if len(tc.ConnectionState().VerifiedChains) > 0 {
					f.verified.Add(1)
				}
				up, err := net.Dial("tcp", u.Host)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, tc); up.Close() }()
				_, _ = io.Copy(tc, up)
			}()
		}
	}()
	return f
}

// TestTLSTransport: the agent reaches RabbitMQ over rabbit+ssl:// with the
// test CA, its client certificate and the server name, and works as over
// plain AMQP (a signed command in, a signed result out).
func TestTLSTransport(t *testing.T) {
	t.Parallel()
	host := testsvc.Name("tls")
	k := newKeys(t, host, "bridge-2025a")
	k.writeRing(nil, "bridge-2025a")
	p := newPKI(t, t.TempDir())
	front := newTLSFront(t, p)
	b := newBridge(t, host) // the test's bridge side stays on plain AMQP
	u, _ := url.Parse(testsvc.RabbitURL(t))
	pw, _ := u.User.Password()
	start(t, k, nil, "DEFAULT.transport_url=rabbit+ssl://"+u.User.Username()+":"+pw+"@"+front.addr+"/",
		"amqp.ssl_ca_file="+p.caFile, "amqp.ssl_cert_file="+p.cliCrt, "amqp.ssl_key_file="+p.cliKey,
		"amqp.ssl_server_name=rabbit.test")
	b.report(k.ring)
	c := b.sign(k.bridge["bridge-2025a"], b.verify())
	b.send(c)
	b.ran(k.ring, c.ID)
	if front.verified.Load() == 0 {
		t.Error("the agent connected without a verified client certificate")
	}
}

// TestTLSChecks: what the TLS configuration refuses — a broker whose
// certificate the CA did not sign, a certificate without the expected
// name, and (on the broker's side) a client without a certificate.
func TestTLSChecks(t *testing.T) {
	t.Parallel()
	p := newPKI(t, t.TempDir())
	other := newPKI(t, t.TempDir()) // another CA
	front := newTLSFront(t, p)
	u, _ := url.Parse(testsvc.RabbitURL(t))
	amqps := "amqps://" + u.User.String() + "@" + front.addr + "/"
	dial := func(f conf.TLSFiles) error {
		cfg, err := conf.ClientTLS(f)
		if err != nil {
			return err
		}
		conn, err := amqp.DialConfig(amqps, amqp.Config{TLSClientConfig: cfg, Dial: amqp.DefaultDial(10 * time.Second)})
		if err == nil {
			conn.Close()
		}
		return err
	}
	good := conf.TLSFiles{CAFile: p.caFile, CertFile: p.cliCrt, KeyFile: p.cliKey, ServerName: "rabbit.test"}
	if err := dial(good); err != nil {
		t.Fatalf("good configuration: %v", err)
	}
	for name, tc := range map[string]struct {
		f    conf.TLSFiles
		want string
	}{
		"untrusted CA":   {conf.TLSFiles{CAFile: other.caFile, CertFile: p.cliCrt, KeyFile: p.cliKey, ServerName: "rabbit.test"}, "certificate signed by unknown authority"},
		"wrong name":     {conf.TLSFiles{CAFile: p.caFile, CertFile: p.cliCrt, KeyFile: p.cliKey, ServerName: "rabbit.evil"}, "rabbit.evil"},
		"no server name": {conf.TLSFiles{CAFile: p.caFile, CertFile: p.cliCrt, KeyFile: p.cliKey}, "127.0.0.1"},
		"no client cert": {conf.TLSFiles{CAFile: p.caFile, ServerName: "rabbit.test"}, ""},
		"other CA's client cert": {conf.TLSFiles{CAFile: p.caFile, CertFile: other.cliCrt, KeyFile: other.cliKey,
			ServerName: "rabbit.test"}, ""},
	} {
		err := dial(tc.f)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error mentioning %q", name, err, tc.want)
		}
	}
}
