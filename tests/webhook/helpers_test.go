// Package webhook tests the webhook endpoint and the request store against
// the real HTTP server (bridge/api) and the real Postgres: every refusal of
// the endpoint in its order of checks, every acceptance path, idempotency,
// durability, callbacks, mTLS and slow clients.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Secrets and tokens of the test sources. None of them may reach a log.
var (
	secretNew   = []byte("batch-secret-NEW-0123456789abcdef")
	secretOld   = []byte("batch-secret-OLD-0123456789abcdef")
	secretOther = []byte("someone-elses-secret-0123456789ab")
	amToken     = "alertmanager-token-5f2c9a7e1b3d"
	readToken   = "reader-token-6d1e"
	adminToken  = "admin-token-9a3c"
)

const vmID = "8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e"

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type env struct {
	t     *testing.T
	url   string // http://127.0.0.1:port
	srv   *api.Server
	pool  *pgxpool.Pool
	store *requests.Store
	ep    *webhook.Endpoint
	reg   *prometheus.Registry
	logs  *syncBuffer
	tls   *tls.Config // client TLS config when the server has TLS
}

// batchSource is the HMAC source used by most tests.
func batchSource() webhook.Source {
	return webhook.Source{Name: "batch", Auth: webhook.AuthHMAC, Format: webhook.FormatNative,
		Secrets: [][]byte{secretNew, secretOld}, Rate: 1000, Burst: 1000, MaxBodyBytes: 4096,
		CallbackHosts: []string{"127.0.0.1"}}
}

func alertSource() webhook.Source {
	return webhook.Source{Name: "alerts", Auth: webhook.AuthBearer, Format: webhook.FormatAlertmanager,
		Tokens: []string{amToken}, Rate: 1000, Burst: 1000, MaxBodyBytes: 1 << 20}
}

type option func(*webhook.Config, *api.Config)

// newEnv starts an API server on loopback with the webhook endpoint and
// the request routes, over a freshly migrated database.
func newEnv(t *testing.T, sources []webhook.Source, opts ...option) *env {
	t.Helper()
	return newEnvDB(t, testsvc.MigratedPostgres(t), sources, opts...)
}

func newEnvDB(t *testing.T, dbURL string, sources []webhook.Source, opts ...option) *env {
	t.Helper()
	pool := testsvc.Pool(t, dbURL)
	dir := t.TempDir()
	tf := filepath.Join(dir, "tokens")
	os.WriteFile(tf, []byte(readToken+" reader viewer\n"+adminToken+" admin ops\n"), 0o600)
	auth, err := api.LoadTokenFile(tf)
	testsvc.Must(t, err, "token file")
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reg := prometheus.NewRegistry()
	ac := api.Config{Listen: "127.0.0.1:0", Auth: auth, Registry: reg, Logger: log}
	store := requests.NewStore(pool, "test")
	wc := webhook.Config{Sources: sources, Store: store, Pool: pool, Registerer: reg, Logger: log,
		CommitTimeout: 5 * time.Second,
		Callbacks: webhook.CallbackConfig{PollInterval: 20 * time.Millisecond, BackoffMin: 50 * time.Millisecond,
			BackoffMax: 200 * time.Millisecond, MaxAttempts: 5, Timeout: 2 * time.Second}}
	for _, o := range opts {
		o(&wc, &ac)
	}
	ep, err := webhook.New(wc)
	testsvc.Must(t, err, "webhook.New")
	srv := api.New(ac)
	ep.Register(srv)
	ep.RegisterOperator(srv) // POST /v1/requests, with ac.Auth's credentials
	requests.NewHandler(store, auth, ep, log).Register(srv)
	testsvc.Must(t, srv.Start(), "start server")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ep.Run(ctx); close(done) }()
	t.Cleanup(func() {
		srv.Shutdown()
		cancel()
		<-done
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	scheme := "http"
	if ac.TLSConfig != nil {
		scheme = "https"
	}
	return &env{t: t, url: scheme + "://" + srv.Addr(), srv: srv, pool: pool, store: store, ep: ep, reg: reg, logs: logs}
}

// hubSign computes X-Hub-Signature-256 independently of the package.
func hubSign(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// stdSign computes a Standard Webhooks signature independently of the
// package: base64(HMAC-SHA256(key, id "." ts "." body)).
func stdSign(key []byte, id, ts string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// nativeBody is a GPU_REQUEST with extra fields (count 1 unless extra
// sets it). Each call's body is new (a nonce): a body signed with
// X-Hub-Signature-256 acts once, so tests that mean the same body again
// reuse the bytes.
func nativeBody(extra string) []byte {
	b := `{"type":"GPU_REQUEST","vm_id":"` + vmID + `","workload":"training","vgpu_profile":"T4-4Q","nonce":"n` +
		strconv.FormatInt(nonces.Add(1), 10) + `"`
	if !strings.Contains(extra, `"count":`) {
		b += `,"count":1`
	}
	if extra != "" {
		b += "," + extra
	}
	return []byte(b + "}")
}

var nonces atomic.Int64

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(a.body, &m); err != nil {
		t.Fatalf("answer %d is not JSON: %v: %s", a.status, err, a.body)
	}
	return m
}

func (e *env) client() *http.Client {
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: e.tls}}
}

// do sends a request and reads the whole answer.
func (e *env) do(method, path string, body []byte, h map[string]string) answer {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, bytes.NewReader(body))
	testsvc.Must(e.t, err, "request")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range h {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := e.client().Do(req)
	testsvc.Must(e.t, err, method+" "+path)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

// postHub posts body to source, signed with X-Hub-Signature-256.
func (e *env) postHub(source string, key, body []byte, idemKey string) answer {
	e.t.Helper()
	return e.do(http.MethodPost, "/v1/webhooks/"+source, body, map[string]string{
		"X-Hub-Signature-256": hubSign(key, body), "Idempotency-Key": idemKey})
}

// postStd posts body signed with the Standard Webhooks headers.
func (e *env) postStd(source string, key, body []byte, id string, at time.Time) answer {
	e.t.Helper()
	ts := strconv.FormatInt(at.Unix(), 10)
	return e.do(http.MethodPost, "/v1/webhooks/"+source, body, map[string]string{
		"webhook-id": id, "webhook-timestamp": ts, "webhook-signature": stdSign(key, id, ts, body)})
}

// wantProblem checks a refusal: status, problem+json, code.
func wantProblem(t *testing.T, a answer, status int, code string) map[string]any {
	t.Helper()
	if a.status != status {
		t.Fatalf("status = %d, want %d; body %s", a.status, status, a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != api.ProblemContentType {
		t.Errorf("Content-Type = %q, want %s", ct, api.ProblemContentType)
	}
	p := a.json(t)
	if p["code"] != code {
		t.Errorf("code = %v, want %s (%s)", p["code"], code, a.body)
	}
	return p
}

// want202 checks an acceptance and that it is already durable.
func (e *env) want202(a answer) uuid.UUID {
	e.t.Helper()
	if a.status != http.StatusAccepted {
		e.t.Fatalf("status = %d, want 202; body %s", a.status, a.body)
	}
	m := a.json(e.t)
	id, err := uuid.Parse(m["request_id"].(string))
	testsvc.Must(e.t, err, "request_id")
	if m["status_url"] != "/v1/requests/"+id.String() {
		e.t.Errorf("status_url = %v", m["status_url"])
	}
	// Durable before the answer: a separate connection sees it at once.
	var n int
	testsvc.Must(e.t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM requests WHERE id = $1`, id).Scan(&n), "count")
	if n != 1 {
		e.t.Fatalf("request %s answered 202 but not in the database", id)
	}
	return id
}

func (e *env) count(q string, args ...any) int {
	e.t.Helper()
	var n int
	testsvc.Must(e.t, e.pool.QueryRow(context.Background(), q, args...).Scan(&n), q)
	return n
}

// metric returns the value of a counter line from /metrics, or 0.
func (e *env) metric(name, labels string) float64 {
	e.t.Helper()
	a := e.do(http.MethodGet, "/metrics", nil, nil)
	prefix := name + "{" + labels + "} "
	for _, l := range strings.Split(string(a.body), "\n") {
		if strings.HasPrefix(l, prefix) {
			f, _ := strconv.ParseFloat(strings.TrimPrefix(l, prefix), 64)
			return f
		}
	}
	return 0
}

// noSecretsLogged fails when a secret or token appears in the log.
func (e *env) noSecretsLogged() {
	e.t.Helper()
	l := e.logs.String()
	for _, s := range []string{string(secretNew), string(secretOld), string(secretOther), amToken, readToken, adminToken} {
		if strings.Contains(l, s) {
			e.t.Errorf("a secret appears in the log")
		}
	}
}
