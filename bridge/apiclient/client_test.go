package apiclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
)

func TestErrorFromProblem(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/instances":
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set(RequestIDHeader, "req-1")
			w.WriteHeader(http.StatusUnprocessableEntity)
			io.WriteString(w, `{"title":"Invalid request","status":422,"detail":"2 invalid field(s)","code":"invalid_params",
				"invalid_params":[{"name":"limit","reason":"an integer from 1 to 1000"},{"name":"has_vgpu","reason":"true or false"}]}`)
		case "/v1/hosts":
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, "<html>proxy error</html>")
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c := New(Config{URL: srv.URL + "/"})
	_, err := c.Instances(context.Background(), InstanceFilter{Limit: 5000})
	e, ok := AsError(err)
	if !ok || e.Status != 422 || e.Problem.Code != "invalid_params" || e.Problem.RequestID != "req-1" {
		t.Fatalf("err = %#v", err)
	}
	want := "Invalid request: 2 invalid field(s)\n  limit: an integer from 1 to 1000\n  has_vgpu: true or false"
	if err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
	_, err = c.Hosts(context.Background())
	if StatusCode(err) != 502 || err.Error() != "Bad Gateway" {
		t.Errorf("non-JSON error: %v (status %d)", err, StatusCode(err))
	}
	_, err = c.Host(context.Background(), "a/b")
	if !IsNotFound(err) {
		t.Errorf("404: %v", err)
	}
}

func TestUnreachable(t *testing.T) {
	c := New(Config{URL: "http://127.0.0.1:1", Timeout: 2 * time.Second})
	_, err := c.Hosts(context.Background())
	if !IsUnreachable(err) || StatusCode(err) != 0 {
		t.Fatalf("err = %v", err)
	}
}

func TestTokenSourceCalledOnceAndNotForWebhooks(t *testing.T) {
	var calls atomic.Int32
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.URL.Path+"="+r.Header.Get("X-Auth-Token"))
		if strings.HasPrefix(r.URL.Path, "/v1/webhooks/") {
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, `{"request_id":"r","status_url":"/v1/requests/r","skipped":[]}`)
			return
		}
		io.WriteString(w, `{"hosts":[]}`)
	}))
	defer srv.Close()
	c := New(Config{URL: srv.URL, TokenSource: func(context.Context) (string, error) {
		calls.Add(1)
		return "ks-token", nil
	}})
	ctx := context.Background()
	for range 3 {
		if _, err := c.Hosts(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SendWebhook(ctx, "lab", []byte(`{}`), WebhookAuth{Key: []byte("0123456789abcdef0123")}); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 {
		t.Errorf("token source called %d times", calls.Load())
	}
	want := "/v1/hosts=ks-token /v1/hosts=ks-token /v1/hosts=ks-token /v1/webhooks/lab="
	if got := strings.Join(seen, " "); got != want {
		t.Errorf("calls %q, want %q", got, want)
	}

	failing := New(Config{URL: srv.URL, TokenSource: func(context.Context) (string, error) { return "", errors.New("keystone down") }})
	if _, err := failing.Hosts(ctx); !errors.Is(err, ErrToken) {
		t.Errorf("token failure: %v", err)
	}
}

// The signatures must be the ones the bridge's webhook endpoint checks.
func TestSignaturesMatchTheBridge(t *testing.T) {
	body := []byte(`{"type":"GPU_REQUEST","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","workload":"training"}`)
	for _, secret := range []string{"lab-secret-0123456789abcdef", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "  padded-secret-0123456789 \n"} {
		got, err := WebhookKey(secret)
		want, werr := webhook.SecretKey(secret)
		if err != nil || werr != nil || string(got) != string(want) {
			t.Fatalf("key of %q: %x %v, bridge %x %v", secret, got, err, want, werr)
		}
		if HubSignature(got, body) != webhook.HubSignature(want, body) {
			t.Errorf("hub signature differs for %q", secret)
		}
		if s, w := StandardSignature(got, "msg_1", "1714567890", body), webhook.StandardSignature("msg_1", "1714567890", body, want); s != w {
			t.Errorf("standard signature %s, bridge %s", s, w)
		}
	}
	for _, bad := range []string{"short", "whsec_!!", "whsec_c2hvcnQ="} {
		_, err := WebhookKey(bad)
		_, werr := webhook.SecretKey(bad)
		if (err == nil) != (werr == nil) {
			t.Errorf("%q: client %v, bridge %v", bad, err, werr)
		}
	}
	// A known vector (RFC-style check independent of both packages).
	if got := HubSignature([]byte("It's a Secret to Everybody"), []byte("Hello, World!")); got != "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17" {
		t.Errorf("GitHub's documented vector: %s", got)
	}
}

func TestSignWebhookHeaders(t *testing.T) {
	key := []byte("lab-secret-0123456789abcdef")
	now := func() time.Time { return time.Unix(1714567890, 0) }
	h := http.Header{}
	k, err := SignWebhook(h, WebhookAuth{Scheme: SchemeStandard, Key: key, IdempotencyKey: "job-7", Now: now}, []byte("{}"))
	if err != nil || k != "job-7" || h.Get("Webhook-Id") != "job-7" || h.Get("Webhook-Timestamp") != "1714567890" ||
		h.Get("Webhook-Signature") != StandardSignature(key, "job-7", "1714567890", []byte("{}")) || h.Get("X-Hub-Signature-256") != "" {
		t.Errorf("standard: %v %v %v", k, err, h)
	}
	h = http.Header{}
	k, err = SignWebhook(h, WebhookAuth{Scheme: SchemeHub, Key: key}, []byte("{}"))
	if err != nil || !strings.HasPrefix(k, "vgpuctl-") || h.Get("Idempotency-Key") != k || !strings.HasPrefix(h.Get("X-Hub-Signature-256"), "sha256=") {
		t.Errorf("hub: %v %v %v", k, err, h)
	}
	if _, err := SignWebhook(http.Header{}, WebhookAuth{Scheme: "md5"}, nil); err == nil {
		t.Error("unknown scheme accepted")
	}
}

func TestWatchRequest(t *testing.T) {
	states := []string{"accepted", "accepted", "decided", "502", "dispatched", "succeeded"}
	// (a 502 after the first answer is retried)
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(n.Add(1)) - 1
		if i >= len(states) {
			i = len(states) - 1
		}
		if states[i] == "502" {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"id": "r1", "state": states[i], "kind": "GPU_REQUEST", "source": "webhook:lab"})
	}))
	defer srv.Close()
	c := New(Config{URL: srv.URL})
	var seen []string
	r, err := c.WatchRequest(context.Background(), "r1", time.Millisecond, func(r Request) { seen = append(seen, r.State) })
	if err != nil || r.State != "succeeded" {
		t.Fatalf("watch: %+v %v", r, err)
	}
	if got := strings.Join(seen, ","); got != "accepted,decided,dispatched,succeeded" {
		t.Errorf("seen %s", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	states = []string{"accepted"}
	n.Store(0)
	if _, err := c.WatchRequest(ctx, "r1", 5*time.Millisecond, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("watch past deadline: %v", err)
	}
}

// keystoneStub answers POST /v3/auth/tokens like Keystone does.
func keystoneStub(t *testing.T) *httptest.Server {
	t.Helper()
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v3/auth/tokens" {
			http.NotFound(w, r)
			return
		}
		var body struct {
			Auth struct {
				Identity struct {
					Password struct {
						User struct {
							Name     string `json:"name"`
							Password string `json:"password"`
							Domain   struct {
								Name string `json:"name"`
							} `json:"domain"`
						} `json:"user"`
					} `json:"password"`
				} `json:"identity"`
				Scope struct {
					Project struct {
						Name string `json:"name"`
					} `json:"project"`
				} `json:"scope"`
			} `json:"auth"`
		}
		json.NewDecoder(r.Body).Decode(&body)
		u := body.Auth.Identity.Password.User
		if u.Name != "ops" || u.Password != "s3cret" || u.Domain.Name != "Default" || body.Auth.Scope.Project.Name != "admin" {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":{"code":401,"title":"Unauthorized","message":"The request you have made requires authentication."}}`)
			return
		}
		w.Header().Set("X-Subject-Token", "gAAAAAB-keystone-token")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"token":{"methods":["password"],"expires_at":"2099-01-01T00:00:00.000000Z","issued_at":"2024-01-01T00:00:00.000000Z",
			"user":{"id":"u1","name":"ops","domain":{"id":"default","name":"Default"}},
			"project":{"id":"p1","name":"admin","domain":{"id":"default","name":"Default"}},
			"roles":[{"id":"r1","name":"admin"}],"catalog":[]}}`)
	}))
}

func TestCloudTokenSource(t *testing.T) {
	ks := keystoneStub(t)
	defer ks.Close()
	dir := t.TempDir()
	yaml := `clouds:
  lab:
    auth:
      auth_url: ` + ks.URL + `/v3
      username: ops
      password: s3cret
      project_name: admin
      user_domain_name: Default
      project_domain_name: Default
    region_name: RegionOne
  wrong:
    auth:
      auth_url: ` + ks.URL + `/v3
      username: ops
      password: nope
      project_name: admin
      user_domain_name: Default
      project_domain_name: Default
`
	path := filepath.Join(dir, "clouds.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OS_CLIENT_CONFIG_FILE", path)
	ctx := context.Background()
	tok, err := CloudTokenSource("lab")(ctx)
	if err != nil || tok != "gAAAAAB-keystone-token" {
		t.Fatalf("token %q, %v", tok, err)
	}
	if _, err := CloudTokenSource("wrong")(ctx); err == nil || !strings.Contains(err.Error(), "Keystone login") {
		t.Errorf("bad password: %v", err)
	}
	if _, err := CloudTokenSource("absent")(ctx); err == nil || !strings.Contains(err.Error(), `"absent" not found`) {
		t.Errorf("unknown cloud: %v", err)
	}
}

// TestEnvLogin: the OS_* variables of an openrc file log in as a cloud of
// clouds.yaml does; a catalog without the bridge gives no endpoint.
func TestEnvLogin(t *testing.T) {
	ks := keystoneStub(t)
	defer ks.Close()
	for _, v := range []string{"OS_REGION_NAME", "OS_INTERFACE", "OS_CACERT"} {
		t.Setenv(v, "")
	}
	env := map[string]string{"OS_AUTH_URL": ks.URL + "/v3", "OS_USERNAME": "ops", "OS_PASSWORD": "s3cret",
		"OS_PROJECT_NAME": "admin", "OS_USER_DOMAIN_NAME": "Default", "OS_PROJECT_DOMAIN_NAME": "Default"}
	ctx := context.Background()
	tok, endpoint, err := EnvLogin(func(k string) string { return env[k] })(ctx)
	if err != nil || tok != "gAAAAAB-keystone-token" || endpoint != "" {
		t.Fatalf("token %q, endpoint %q, %v", tok, endpoint, err)
	}
	env["OS_PASSWORD"] = "nope"
	if _, _, err := EnvLogin(func(k string) string { return env[k] })(ctx); err == nil ||
		!strings.Contains(err.Error(), "OS_* variables: Keystone login at "+ks.URL) {
		t.Errorf("bad password: %v", err)
	}
	delete(env, "OS_PASSWORD")
	if _, _, err := EnvLogin(func(k string) string { return env[k] })(ctx); err == nil ||
		!strings.Contains(err.Error(), "OS_* variables: OS_USERNAME is set but not OS_PASSWORD") {
		t.Errorf("no password: %v", err)
	}
}

// FuzzErrorBody: any answer body outside 2xx becomes an *Error whose
// message is never empty, whatever the server sends.
func FuzzErrorBody(f *testing.F) {
	f.Add(`{"title":"Invalid request","status":422,"invalid_params":[{"name":"limit","reason":"x"}]}`, "application/problem+json", 422)
	f.Add(`<html>bad gateway</html>`, "text/html", 502)
	f.Add(`{"title":""}`, "application/json", 404)
	f.Add(`{"invalid_params":"nope"}`, "application/problem+json", 400)
	f.Add("", "", 599)
	f.Fuzz(func(t *testing.T, body, ct string, status int) {
		if status < 100 || status > 999 {
			return
		}
		resp := &http.Response{StatusCode: status, Status: fmt.Sprint(status), Header: http.Header{"Content-Type": {ct}}}
		e := newError(Call{Method: "GET", Path: "/v1/x"}, resp, []byte(body))
		if e.Status != status || e.Error() == "" || e.Problem.Title == "" {
			t.Fatalf("error %#v from %q", e, body)
		}
	})
}
