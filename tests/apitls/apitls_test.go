// Package apitls runs the bridge's operator API and its separate webhook
// listener on TLS, with certificates from a CA made in the test, and
// shows what they accept: HTTPS with TLS 1.2 (forward-secret AEAD suites
// only) or 1.3; not plain HTTP, not TLS 1.0 or 1.1, not CBC suites; and,
// on the webhook listener, client certificates for auth = mtls sources
// , and on the API with [api] tls_client_ca_file.
package apitls

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testpki"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

var hmacSecret = []byte("apitls-hmac-secret-0123456789abcdef")

// env is a running bridge with TLS on both listeners.
type env struct {
	api, hooks string // https://host:port
	ca         *testpki.CA
	client     *testpki.Pair // signed by the webhook client CA, CN batch-scheduler
	stranger   *testpki.Pair // same CA, CN not allowed
	foreign    *testpki.Pair // another CA
}

func start(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "apitls-server-ca")
	srv := ca.Server("bridge", "localhost", "127.0.0.1")
	clientCA := testpki.NewCA(t, dir, "apitls-client-ca")
	e := &env{ca: ca, client: clientCA.Client("batch", "batch-scheduler"), stranger: clientCA.Client("stranger", "someone-else"),
		foreign: testpki.NewCA(t, dir, "apitls-foreign-ca").Client("foreign", "batch-scheduler")}
	secret := filepath.Join(dir, "batch.secret")
	testsvc.Must(t, os.WriteFile(secret, hmacSecret, 0o600), "secret")
	ini := filepath.Join(dir, "bridge.conf")
	testsvc.Must(t, os.WriteFile(ini, []byte(fmt.Sprintf(`[webhook_source:batch]
auth = hmac
secret_files = %s

[webhook_source:scheduler]
auth = mtls
mtls_subjects = batch-scheduler
`, secret)), 0o600), "config")
	whAddr := fmt.Sprintf("127.0.0.1:%d", testsvc.FreePort(t))
	v, err := bridge.LoadConfig(conf.Source{File: ini, Overrides: testbridge.Overrides(t, testsvc.Postgres(t),
		"api.tls_cert_file="+srv.CertFile, "api.tls_key_file="+srv.KeyFile,
		"webhooks.listen="+whAddr, "webhooks.tls_cert_file="+srv.CertFile, "webhooks.tls_key_file="+srv.KeyFile,
		"webhooks.client_ca_file="+clientCA.File,
		// A stopping bridge waits 2/3 of this for webhooks still draining.
		"webhooks.write_timeout=3s")})
	testsvc.Must(t, err, "bridge config")

	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan *bridge.Daemon, 1)
	done := make(chan error, 1)
	go func() { done <- bridge.Run(ctx, v, nil, func(d *bridge.Daemon) { started <- d }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("bridge.Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("bridge did not stop within 30s")
		}
	})
	select {
	case d := <-started:
		e.api = "https://" + d.API.Addr()
	case err := <-done:
		t.Fatalf("bridge stopped at start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("bridge did not start within 60s")
	}
	e.hooks = "https://" + whAddr
	// The webhook listener starts as a component: wait for it.
	c := e.httpClient(nil)
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := c.Get(e.hooks + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("webhook listener: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return e
}

// tlsConfig trusts the test CA only and presents cert when non-nil,
// whatever CAs the server names as acceptable (Go's client would
// otherwise send no certificate rather than one of another CA).
func (e *env) tlsConfig(cert *testpki.Pair) *tls.Config {
	c := &tls.Config{RootCAs: e.ca.Pool()}
	if cert != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert.TLS, nil }
	}
	return c
}

func (e *env) httpClient(cert *testpki.Pair) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: e.tlsConfig(cert)}}
}

// handshake dials addr (host:port) with c and returns the negotiated
// version or the handshake error.
func handshake(addr string, c *tls.Config) (uint16, error) {
	conn, err := tls.Dial("tcp", addr, c)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	return conn.ConnectionState().Version, nil
}

func hostPort(u string) string { return strings.TrimPrefix(u, "https://") }

// TestTLS runs one bridge with TLS on both listeners.
func TestTLS(t *testing.T) {
	e := start(t)
	t.Run("versions and suites", func(t *testing.T) { listenersTLS(t, e) })
	t.Run("webhook client certificates", func(t *testing.T) { webhookClientCertificates(t, e) })
}

// listenersTLS checks both listeners' protocol versions and suites.
func listenersTLS(t *testing.T, e *env) {
	for _, l := range []struct{ name, url string }{{"api", e.api}, {"webhooks", e.hooks}} {
		t.Run(l.name, func(t *testing.T) {
			addr := hostPort(l.url)
			// HTTPS works, and negotiates TLS 1.3 with a modern client.
			resp, err := e.httpClient(nil).Get(l.url + "/healthz")
			if err != nil {
				t.Fatalf("HTTPS /healthz: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.TLS == nil || resp.TLS.Version != tls.VersionTLS13 {
				t.Errorf("HTTPS /healthz: %d, TLS %v; want 200 over TLS 1.3", resp.StatusCode, resp.TLS)
			}
			// The certificate names 127.0.0.1 and localhost, nothing else.
			c := e.tlsConfig(nil)
			c.ServerName = "bridge.example.org"
			if _, err := handshake(addr, c); err == nil {
				t.Error("a client expecting another host name accepted the certificate")
			}
			// Plain HTTP gets no answer from the application.
			pr, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/healthz")
			if err == nil {
				body, _ := io.ReadAll(pr.Body)
				pr.Body.Close()
				if pr.StatusCode != http.StatusBadRequest || bytes.Contains(body, []byte(`"ok"`)) {
					t.Errorf("plain HTTP answered %d %q; want a refusal", pr.StatusCode, body)
				}
			}
			versions := []struct {
				name   string
				min    uint16
				max    uint16
				suites []uint16
				ok     bool
			}{
				{"TLS 1.0", tls.VersionTLS10, tls.VersionTLS10, nil, false},
				{"TLS 1.1", tls.VersionTLS10, tls.VersionTLS11, nil, false},
				{"TLS 1.2 CBC only", tls.VersionTLS12, tls.VersionTLS12,
					[]uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256}, false},
				{"TLS 1.2 AES-GCM", tls.VersionTLS12, tls.VersionTLS12, []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}, true},
				{"TLS 1.2 ChaCha20", tls.VersionTLS12, tls.VersionTLS12, []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256}, true},
				{"TLS 1.3", tls.VersionTLS13, tls.VersionTLS13, nil, true},
			}
			for _, v := range versions {
				c := e.tlsConfig(nil)
				c.MinVersion, c.MaxVersion, c.CipherSuites = v.min, v.max, v.suites
				got, err := handshake(addr, c)
				switch {
				case v.ok && err != nil:
					t.Errorf("%s: refused (%v); want accepted", v.name, err)
				case v.ok && got != v.max:
					t.Errorf("%s: negotiated %s", v.name, tls.VersionName(got))
				case !v.ok && err == nil:
					t.Errorf("%s: accepted (%s); want the handshake refused", v.name, tls.VersionName(got))
				}
			}
		})
	}
	// An authenticated route of the API over HTTPS.
	req, _ := http.NewRequest(http.MethodGet, e.api+"/v1/requests/"+uuid.NewString(), nil)
	req.Header.Set("X-Auth-Token", testbridge.AdminToken)
	resp, err := e.httpClient(nil).Do(req)
	if err != nil {
		t.Fatalf("GET /v1/requests over HTTPS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /v1/requests/<unknown> over HTTPS: %d, want 404", resp.StatusCode)
	}
}

// webhookClientCertificates: on the webhook listener an auth = mtls
// source takes the client certificate its subject allows, and refuses no
// certificate or another subject (401 with the reason); a certificate of
// another CA fails the handshake; an HMAC source needs no certificate.
func webhookClientCertificates(t *testing.T, e *env) {
	body := []byte(`{"type":"GPU_REQUEST","vm_id":"` + uuid.NewString() + `","workload":"training","vgpu_profile":"T4-4Q","count":1}`)
	post := func(source string, cert *testpki.Pair, hdr map[string]string) (int, string, error) {
		req, _ := http.NewRequest(http.MethodPost, e.hooks+"/v1/webhooks/"+source, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", uuid.NewString())
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := e.httpClient(cert).Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		var p struct {
			Code string `json:"code"`
		}
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &p)
		return resp.StatusCode, p.Code, nil
	}
	cases := []struct {
		name   string
		source string
		cert   *testpki.Pair
		hdr    map[string]string
		status int
		code   string
	}{
		{"allowed certificate", "scheduler", e.client, nil, http.StatusAccepted, ""},
		{"no certificate", "scheduler", nil, nil, http.StatusUnauthorized, "no_client_certificate"},
		{"subject not allowed", "scheduler", e.stranger, nil, http.StatusUnauthorized, "certificate_not_allowed"},
		{"hmac source without certificate", "batch", nil,
			map[string]string{webhook.HeaderHubSignature: webhook.HubSignature(hmacSecret, body)}, http.StatusAccepted, ""},
	}
	for _, c := range cases {
		status, code, err := post(c.source, c.cert, c.hdr)
		if err != nil || status != c.status || code != c.code {
			t.Errorf("%s: %d %q (%v); want %d %q", c.name, status, code, err, c.status, c.code)
		}
	}
	if status, _, err := post("scheduler", e.foreign, nil); err == nil {
		t.Errorf("a certificate of another CA: answered %d; want the handshake refused", status)
	}
}

// TestAPIClientCertificates: with [api] tls_client_ca_file every client
// of the API listener needs a certificate of that CA.
func TestAPIClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "apitls-server-ca")
	srvPair := ca.Server("api", "127.0.0.1")
	ops := testpki.NewCA(t, dir, "apitls-operators-ca")
	good := ops.Client("operator", "ops-1")
	foreign := testpki.NewCA(t, dir, "apitls-other-ca").Client("other", "ops-1")
	tokens := filepath.Join(dir, "tokens")
	testsvc.Must(t, os.WriteFile(tokens, []byte("apitls-token admin ops\n"), 0o600), "tokens")
	v, err := bridge.LoadConfig(conf.Source{Overrides: append(testkeys.For(t).Bridge(),
		"DEFAULT.transport_url=rabbit://guest:guest@127.0.0.1:5672/", "database.connection=postgres://postgres@127.0.0.1/x",
		"api.listen=127.0.0.1:0", "api.token_file="+tokens,
		"api.tls_cert_file="+srvPair.CertFile, "api.tls_key_file="+srvPair.KeyFile, "api.tls_client_ca_file="+ops.File)})
	testsvc.Must(t, err, "config")
	ac, err := bridge.APIConfig(v)
	testsvc.Must(t, err, "api config")
	s := api.New(ac)
	testsvc.Must(t, s.Start(), "start")
	t.Cleanup(func() { _ = s.Shutdown() })
	e := &env{ca: ca}
	for _, c := range []struct {
		name string
		cert *testpki.Pair
		ok   bool
	}{{"operator certificate", good, true}, {"no certificate", nil, false}, {"another CA's certificate", foreign, false}} {
		resp, err := e.httpClient(c.cert).Get("https://" + s.Addr() + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		if c.ok != (err == nil) {
			t.Errorf("%s: err %v; want accepted %v", c.name, err, c.ok)
		}
	}
	// The option needs TLS.
	_, err = bridge.LoadConfig(conf.Source{Overrides: append(testkeys.For(t).Bridge(),
		"DEFAULT.transport_url=rabbit://guest:guest@127.0.0.1:5672/", "database.connection=postgres://postgres@127.0.0.1/x",
		"api.token_file="+tokens, "api.tls_client_ca_file="+ops.File)})
	if es, ok := conf.AsErrors(err); !ok || !strings.Contains(es.Error(), "tls_client_ca_file") {
		t.Errorf("tls_client_ca_file without tls_cert_file: %v; want a configuration error naming it", err)
	}
}
