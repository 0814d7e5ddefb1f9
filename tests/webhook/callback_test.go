package webhook

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

type received struct {
	header http.Header
	body   []byte
}

// callbackTarget is an HTTP server on 127.0.0.1 that fails the first
// failures calls with 500 and records every call.
type callbackTarget struct {
	srv      *httptest.Server
	mu       sync.Mutex
	calls    []received
	failures int
}

func newTarget(t *testing.T, failures int) *callbackTarget {
	ct := &callbackTarget{failures: failures}
	ct.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ct.mu.Lock()
		ct.calls = append(ct.calls, received{r.Header.Clone(), b})
		n := len(ct.calls)
		ct.mu.Unlock()
		if n <= ct.failures {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(ct.srv.Close)
	return ct
}

func (ct *callbackTarget) got() []received {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return append([]received(nil), ct.calls...)
}

// finish drives a request to succeeded through the store's real
// Transition, as the pipeline will.
func finish(t *testing.T, e *env, id [16]byte, final requests.State) {
	t.Helper()
	ctx := context.Background()
	steps := []requests.State{requests.Decided, requests.Dispatched, final}
	for _, to := range steps {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := e.store.Transition(ctx, tx, id, to, "verifying", "test drives it", "")
			return err
		})
		testsvc.Must(t, err, "transition to "+string(to))
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	testsvc.WaitFor(t, 20*time.Second, what, cond)
}

func TestCallbackDeliveredWithRetries(t *testing.T) {
	target := newTarget(t, 2)
	e := newEnv(t, []webhook.Source{batchSource()})
	cb := target.srv.URL + "/done?job=7"
	id := e.want202(e.postHub("batch", secretNew, nativeBody(`"callback_url":"`+cb+`"`), "cb-1"))
	if len(target.got()) != 0 {
		t.Fatal("callback before the final state")
	}
	finish(t, e, id, requests.Succeeded)
	waitFor(t, "delivery", func() bool {
		return e.count(`SELECT count(*) FROM request_callbacks WHERE request_id = $1 AND state = 'delivered'`, id) == 1
	})
	calls := target.got()
	if len(calls) != 3 {
		t.Fatalf("%d calls, want 3 (two 500s, then success)", len(calls))
	}
	// Every attempt is recorded.
	if n := e.count(`SELECT count(*) FROM request_callback_attempts a JOIN request_callbacks c ON c.id = a.callback_id
		WHERE c.request_id = $1`, id); n != 3 {
		t.Errorf("%d attempts recorded, want 3", n)
	}
	if n := e.count(`SELECT count(*) FROM request_callback_attempts a JOIN request_callbacks c ON c.id = a.callback_id
		WHERE c.request_id = $1 AND a.status_code = 500`, id); n != 2 {
		t.Errorf("%d failed attempts recorded, want 2", n)
	}
	for i, c := range calls {
		// Signed like the source signs; verified independently.
		if c.header.Get("X-Hub-Signature-256") != hubSign(secretNew, c.body) {
			t.Errorf("call %d: X-Hub-Signature-256 does not verify", i)
		}
		wid, ts := c.header.Get("webhook-id"), c.header.Get("webhook-timestamp")
		sigs := strings.Fields(c.header.Get("webhook-signature"))
		if len(sigs) != 2 || sigs[0] != stdSign(secretNew, wid, ts, c.body) || sigs[1] != stdSign(secretOld, wid, ts, c.body) {
			t.Errorf("call %d: webhook-signature %q does not verify under both secrets", i, sigs)
		}
		if wid != calls[0].header.Get("webhook-id") {
			t.Errorf("webhook-id changes between attempts: %s, %s", calls[0].header.Get("webhook-id"), wid)
		}
		var got requests.Callback
		if err := json.Unmarshal(c.body, &got); err != nil || got.State != requests.Succeeded || got.Phase != "verifying" ||
			got.RequestID != id || got.FinishedAt == nil {
			t.Errorf("call %d body %s (%v)", i, c.body, err)
		}
	}
}

func TestCallbackGivesUp(t *testing.T) {
	target := newTarget(t, 1000)
	e := newEnv(t, []webhook.Source{batchSource()})
	id := e.want202(e.postHub("batch", secretNew, nativeBody(`"callback_url":"`+target.srv.URL+`/x"`), "cb-2"))
	finish(t, e, id, requests.Failed)
	waitFor(t, "giving up", func() bool {
		return e.count(`SELECT count(*) FROM request_callbacks WHERE request_id = $1 AND state = 'failed'`, id) == 1
	})
	if n := len(target.got()); n != 5 { // MaxAttempts of the test env
		t.Errorf("%d calls, want 5", n)
	}
}

// TestCallbackHostNotAllowed: a callback whose host is not on the
// allowlist is refused at intake (422) and, if one is stored anyway (the
// allowlist changed, or another writer), never contacted.
func TestCallbackHostNotAllowed(t *testing.T) {
	target := newTarget(t, 0)
	e := newEnv(t, []webhook.Source{batchSource()}) // allowlist: 127.0.0.1
	port := target.srv.URL[strings.LastIndex(target.srv.URL, ":")+1:]
	other := "http://localhost:" + port + "/cb" // same server, name not on the list
	wantProblem(t, e.postHub("batch", secretNew, nativeBody(`"callback_url":"`+other+`"`), "cb-3"), 422, "invalid_params")
	// Stored by another path: still never contacted.
	ctx := context.Background()
	id := [16]byte{1, 2, 3}
	testsvc.Must(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return e.store.Create(ctx, tx, requests.Request{ID: id, Source: "webhook:batch", Kind: "GPU_RELEASE", CallbackURL: other})
	}), "create")
	finish(t, e, id, requests.Succeeded)
	waitFor(t, "refusal", func() bool {
		return e.count(`SELECT count(*) FROM request_callbacks WHERE request_id = $1 AND state = 'refused'`, id) == 1
	})
	if n := len(target.got()); n != 0 {
		t.Errorf("a host off the allowlist was contacted %d times", n)
	}
	if n := e.count(`SELECT count(*) FROM request_callback_attempts a JOIN request_callbacks c ON c.id = a.callback_id
		WHERE c.request_id = $1 AND a.status_code IS NULL AND a.error LIKE '%allowlist%'`, id); n != 1 {
		t.Errorf("refusal not recorded as an attempt")
	}
}

func TestTransitionStateMachine(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	ctx := context.Background()
	id := e.want202(e.postHub("batch", secretNew, nativeBody(""), "sm-1"))
	try := func(to requests.State) error {
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := e.store.Transition(ctx, tx, id, to, "", "", "")
			return err
		})
	}
	if err := try(requests.Succeeded); !requests.IsIllegal(err) {
		t.Errorf("accepted → succeeded: %v, want illegal", err)
	}
	testsvc.Must(t, try(requests.Decided), "→ decided")
	testsvc.Must(t, try(requests.Decided), "decided → decided (phase change)")
	if err := try(requests.Accepted); !requests.IsIllegal(err) {
		t.Errorf("decided → accepted: %v", err)
	}
	testsvc.Must(t, try(requests.Rejected), "→ rejected")
	if err := try(requests.Failed); !requests.IsIllegal(err) {
		t.Errorf("rejected → failed: %v", err)
	}
	if err := try("exploded"); !requests.IsIllegal(err) {
		t.Errorf("unknown state: %v", err)
	}
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := e.store.Transition(ctx, tx, [16]byte{9}, requests.Decided, "", "", "")
		return err
	})
	if !requests.IsNotFound(err) {
		t.Errorf("unknown id: %v", err)
	}
	r, err := e.store.Get(ctx, id)
	testsvc.Must(t, err, "get")
	if r.State != requests.Rejected || r.DecidedAt == nil || r.FinishedAt == nil {
		t.Errorf("request = %+v", r)
	}
	if n := e.count(`SELECT count(*) FROM audit_log WHERE object_id = $1 AND action = 'transition'`, id.String()); n != 3 {
		t.Errorf("%d transition audit rows, want 3", n)
	}
	// A rolled-back transition leaves neither state nor audit behind.
	_ = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return fmt.Errorf("roll back") })
	list, err := e.store.List(ctx, requests.ListOptions{Source: "webhook:batch", State: requests.Rejected})
	testsvc.Must(t, err, "list")
	if len(list) != 1 || list[0].ID != id {
		t.Errorf("list = %+v", list)
	}
}

// TestMTLS: a source authenticated by client certificate on a TLS
// listener that asks for, but does not require, client certificates.
func TestMTLS(t *testing.T) {
	ca, caKey := newCA(t)
	serverCert := issue(t, ca, caKey, "127.0.0.1", nil, true)
	good := issue(t, ca, caKey, "batch-scheduler", []string{"batch.example.org"}, false)
	wrong := issue(t, ca, caKey, "intruder", nil, false)
	otherCA, otherKey := newCA(t)
	foreign := issue(t, otherCA, otherKey, "batch-scheduler", nil, false)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	src := webhook.Source{Name: "mtls", Auth: webhook.AuthMTLS, MTLSSubjects: []string{"batch-scheduler"}, Rate: 100, Burst: 100, MaxBodyBytes: 4096}
	bySAN := webhook.Source{Name: "mtls-san", Auth: webhook.AuthMTLS, MTLSSANs: []string{"batch.example.org"}, Rate: 100, Burst: 100, MaxBodyBytes: 4096}
	e := newEnv(t, []webhook.Source{src, bySAN, batchSource()}, func(_ *webhook.Config, ac *api.Config) {
		ac.TLSConfig = &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven}
	})
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	post := func(source string, cert *tls.Certificate) (answer, error) {
		e.tls = &tls.Config{RootCAs: roots}
		if cert != nil {
			e.tls.Certificates = []tls.Certificate{*cert}
		}
		req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/webhooks/"+source, strings.NewReader(string(nativeBody(""))))
		req.Header.Set("Content-Type", "application/json")
		resp, err := e.client().Do(req)
		if err != nil {
			return answer{}, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{resp.StatusCode, resp.Header, b}, nil
	}
	a, err := post("mtls", &good)
	testsvc.Must(t, err, "post")
	e.want202(a)
	a, err = post("mtls-san", &good)
	testsvc.Must(t, err, "post")
	e.want202(a)
	a, err = post("mtls", &wrong)
	testsvc.Must(t, err, "post")
	wantProblem(t, a, 401, "certificate_not_allowed")
	a, err = post("mtls", nil)
	testsvc.Must(t, err, "post")
	wantProblem(t, a, 401, "no_client_certificate")
	// A certificate from another CA does not even complete the handshake.
	if _, err := post("mtls", &foreign); err == nil {
		t.Error("a certificate of another CA was accepted")
	}
	// HMAC sources on the same listener need no certificate.
	e.tls = &tls.Config{RootCAs: roots}
	e.want202(e.postHub("batch", secretNew, nativeBody(""), "tls-1"))
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	testsvc.Must(t, err, "CA")
	c, _ := x509.ParseCertificate(der)
	return c, key
}

func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, dns []string, server bool) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP(cn)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	testsvc.Must(t, err, "issue")
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestSlowClients: a client that dribbles its headers is cut off by
// ReadHeaderTimeout, one that dribbles its body by ReadTimeout.
func TestSlowClients(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()}, func(_ *webhook.Config, ac *api.Config) {
		ac.ReadHeaderTimeout, ac.ReadTimeout = 300*time.Millisecond, time.Second
	})
	addr := strings.TrimPrefix(e.url, "http://")
	cutOff := func(t *testing.T, conn net.Conn, dribble string) {
		// Keep dribbling one byte at a time; the server must hang up.
		conn.SetDeadline(time.Now().Add(15 * time.Second))
		closed := make(chan struct{})
		go func() {
			io.Copy(io.Discard, bufio.NewReader(conn))
			close(closed)
		}()
		for i := 0; ; i++ {
			select {
			case <-closed:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{dribble[i%len(dribble)]}); err != nil {
				return // the server closed the connection
			}
			if i > 120 {
				t.Fatal("the server kept a dribbling client for 12 s")
			}
		}
	}
	t.Run("headers", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		testsvc.Must(t, err, "dial")
		defer conn.Close()
		fmt.Fprint(conn, "POST /v1/webhooks/batch HTTP/1.1\r\nHost: x\r\n")
		cutOff(t, conn, "X-Slow: aaaaaaaa\r\n")
	})
	t.Run("body", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		testsvc.Must(t, err, "dial")
		defer conn.Close()
		fmt.Fprint(conn, "POST /v1/webhooks/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n{")
		cutOff(t, conn, " ")
	})
	if n := e.count(`SELECT count(*) FROM requests`); n != 0 {
		t.Errorf("%d requests stored", n)
	}
}
