package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
)

func newTestServer(t *testing.T, auth Authenticator) *Server {
	t.Helper()
	s := New(Config{Auth: auth, MaxBodyBytes: 64})
	s.Handle(http.MethodGet, "/v1/things/:id", Project, func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]string{"id": c.Param("id"), "who": PrincipalFrom(c).Name})
	})
	s.Handle(http.MethodGet, "/v1/fleet", Fleet, func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]string{"who": PrincipalFrom(c).Name})
	})
	s.Handle(http.MethodPost, "/v1/things", Admin, func(c echo.Context) error {
		var body struct {
			Name string `json:"name"`
		}
		if err := DecodeJSON(c, &body); err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, body)
	})
	s.Describe([]byte(`{"paths": {"/v1/things/{id}": {"get": {"summary": "x", "responses": {"200": {"description": "ok"}}}},
		"/v1/things": {"post": {"summary": "y", "responses": {"201": {"description": "ok"}}}},
		"/v1/fleet": {"get": {"summary": "z", "responses": {"200": {"description": "ok"}}}}}}`))
	return s
}

func tokens(t *testing.T) *StaticTokens {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(p, []byte("# comment\nreadtok reader alice\nadmintok admin bob\n\nprojtok reader carol proj-1\nmemtok member dave proj-1\n"), 0o600)
	st, err := LoadTokenFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func do(s *Server, method, path, token, body string) *httptest.ResponseRecorder {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, r)
	if token != "" {
		req.Header.Set("X-Auth-Token", token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	s.Echo().ServeHTTP(rec, req)
	return rec
}

func TestAuthAndProblems(t *testing.T) {
	s := newTestServer(t, tokens(t))
	tests := []struct {
		name, method, path, token, body string
		wantStatus                      int
		wantCode                        string
	}{
		{"no token", "GET", "/v1/things/1", "", "", 401, "no_token"},
		{"bad token", "GET", "/v1/things/1", "nope", "", 401, "bad_token"},
		{"reader reads", "GET", "/v1/things/1", "readtok", "", 200, ""},
		{"reader cannot write", "POST", "/v1/things", "readtok", `{"name":"a"}`, 403, "forbidden"},
		{"project reader reads its project's", "GET", "/v1/things/1", "projtok", "", 200, ""},
		{"project reader cannot see the fleet", "GET", "/v1/fleet", "projtok", "", 403, "forbidden"},
		{"reader without a project sees the fleet", "GET", "/v1/fleet", "readtok", "", 200, ""},
		{"admin sees the fleet", "GET", "/v1/fleet", "admintok", "", 200, ""},
		{"member reads its project's", "GET", "/v1/things/1", "memtok", "", 200, ""},
		{"member cannot see the fleet", "GET", "/v1/fleet", "memtok", "", 403, "forbidden"},
		{"admin writes", "POST", "/v1/things", "admintok", `{"name":"a"}`, 201, ""},
		{"unknown field", "POST", "/v1/things", "admintok", `{"nom":"a"}`, 422, "invalid_params"},
		{"wrong type", "POST", "/v1/things", "admintok", `{"name":1}`, 422, "invalid_params"},
		{"not json", "POST", "/v1/things", "admintok", `{"name":`, 400, ""},
		{"too big", "POST", "/v1/things", "admintok", `{"name":"` + strings.Repeat("x", 100) + `"}`, 413, ""},
		{"no route", "GET", "/v1/nothing", "admintok", "", 404, ""},
		{"health is public", "GET", "/healthz", "", "", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := do(s, tt.method, tt.path, tt.token, tt.body)
			if rec.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.wantStatus, rec.Body)
			}
			if rec.Header().Get("X-OpenStack-Request-ID") == "" {
				t.Error("no request id header")
			}
			if tt.wantStatus >= 400 {
				if ct := rec.Header().Get("Content-Type"); ct != ProblemContentType {
					t.Errorf("content type %q", ct)
				}
				var p ProblemDetails
				if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
					t.Fatal(err)
				}
				if p.Status != tt.wantStatus || p.Title == "" || p.RequestID == "" {
					t.Errorf("problem = %+v", p)
				}
				if tt.wantCode != "" && p.Code != tt.wantCode {
					t.Errorf("code = %q, want %q", p.Code, tt.wantCode)
				}
			}
		})
	}
}

func TestRequestIDPropagated(t *testing.T) {
	s := newTestServer(t, NoAuth{})
	req := httptest.NewRequest("GET", "/healthz", nil)
	const id = "req-3f0b6a3e-9d63-4a5e-9d2b-1f0c2b7c2d55"
	req.Header.Set("X-OpenStack-Request-ID", id)
	rec := httptest.NewRecorder()
	s.Echo().ServeHTTP(rec, req)
	if got := rec.Header().Get("X-OpenStack-Request-ID"); got != id {
		t.Errorf("request id = %q, want %q", got, id)
	}
}

func TestReadyzNamesFailingPart(t *testing.T) {
	s := newTestServer(t, NoAuth{})
	s.AddCheck("database", func(context.Context) error { return errors.New("connection refused") })
	s.AddCheck("broker", func(context.Context) error { return nil })
	rec := do(s, "GET", "/readyz", "", "")
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "unreachable: database") || strings.Contains(rec.Body.String(), "broker,") {
		t.Fatalf("readyz = %d %s", rec.Code, rec.Body)
	}
}

func TestTokenFileErrors(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"role": "tok superuser\n", "short": "tok\n", "empty": "# nothing\n",
		"member without a project": "tok member carol\n"} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o600)
		_, err := LoadTokenFile(p)
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if strings.Contains(err.Error(), "tok ") {
			t.Errorf("%s: error quotes the token: %v", name, err)
		}
	}
}

func TestEveryRouteDescribed(t *testing.T) {
	s := newTestServer(t, NoAuth{})
	s.Handle(http.MethodDelete, "/v1/things/:id", Admin, func(c echo.Context) error { return nil })
	got := s.Undescribed()
	if len(got) != 1 || got[0] != "DELETE /v1/things/{id}" {
		t.Errorf("Undescribed = %v, want the DELETE only", got)
	}
	var doc map[string]any
	rec := do(s, "GET", "/v1/openapi.json", "", "")
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || doc["openapi"] != "3.0.3" {
		t.Fatalf("openapi.json: %v %v", err, doc["openapi"])
	}
	// Every operation states the class its registration enforces.
	paths := doc["paths"].(map[string]any)
	for path, want := range map[string]string{"get /v1/things/{id}": "project", "post /v1/things": "admin",
		"get /v1/fleet": "fleet", "get /healthz": "public"} {
		m, p, _ := strings.Cut(path, " ")
		op, _ := paths[p].(map[string]any)[m].(map[string]any)
		if op["x-vgpu-access"] != want {
			t.Errorf("%s: x-vgpu-access = %v, want %s", path, op["x-vgpu-access"], want)
		}
	}
}

// TestVersionDocument: / answers without a token, as OpenStack services'
// roots do, naming v1 at the address the client used and the build.
func TestVersionDocument(t *testing.T) {
	s := New(Config{Auth: tokens(t), Version: "0.1.0"})
	for _, c := range []struct{ peer, host, proto, want string }{
		{"192.0.2.1:40000", "vgpu.example.org:9797", "", "http://vgpu.example.org:9797/v1/"},
		// A TLS-terminating proxy on the host or a private network is
		// believed; anyone else's X-Forwarded-Proto is not.
		{"127.0.0.1:40000", "vgpu.example.org", "https", "https://vgpu.example.org/v1/"},
		{"192.0.2.1:40000", "vgpu.example.org", "https", "http://vgpu.example.org/v1/"},
	} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Host, req.RemoteAddr = c.host, c.peer
		if c.proto != "" {
			req.Header.Set("X-Forwarded-Proto", c.proto)
		}
		rec := httptest.NewRecorder()
		s.Echo().ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("GET / = %d %s", rec.Code, rec.Body)
		}
		var doc struct {
			Versions []struct {
				ID, Status string
				Links      []struct{ Rel, Href string }
			}
			Build map[string]string
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
		if len(doc.Versions) != 1 || doc.Versions[0].ID != "v1" || doc.Versions[0].Status != "CURRENT" ||
			len(doc.Versions[0].Links) != 2 || doc.Versions[0].Links[0].Rel != "self" || doc.Versions[0].Links[0].Href != c.want {
			t.Errorf("versions = %+v, want v1 CURRENT at %s", doc.Versions, c.want)
		}
		if doc.Build["name"] != "vgpu-bridge" || doc.Build["version"] != "0.1.0" || doc.Build["commit"] == "" {
			t.Errorf("build = %v", doc.Build)
		}

		// The self link answers, with the same version.
		self, err := url.Parse(c.want)
		if err != nil {
			t.Fatal(err)
		}
		req = httptest.NewRequest(http.MethodGet, self.Path, nil)
		req.Host, req.RemoteAddr = c.host, c.peer
		if c.proto != "" {
			req.Header.Set("X-Forwarded-Proto", c.proto)
		}
		rec = httptest.NewRecorder()
		s.Echo().ServeHTTP(rec, req)
		var one struct {
			Version struct {
				ID    string
				Links []struct{ Rel, Href string }
			}
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &one); rec.Code != http.StatusOK || err != nil || one.Version.ID != "v1" ||
			len(one.Version.Links) == 0 || one.Version.Links[0].Href != c.want {
			t.Errorf("GET %s = %d %s, want the v1 document linking itself", req.URL.Path, rec.Code, rec.Body)
		}
	}
}

// TestHealthcheck: /healthcheck answers as oslo.middleware's healthcheck
// with its disable_by_file backend, whatever the dependencies do.
func TestHealthcheck(t *testing.T) {
	disable := filepath.Join(t.TempDir(), "healthcheck_disable")
	s := New(Config{Auth: tokens(t), DisableByFile: disable})
	s.AddCheck("database", func(context.Context) error { return errors.New("down") }) // not /healthcheck's concern
	check := func(method, accept string, wantCode int, wantBody string) {
		t.Helper()
		req := httptest.NewRequest(method, "/healthcheck", nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		rec := httptest.NewRecorder()
		s.Echo().ServeHTTP(rec, req)
		if rec.Code != wantCode || strings.TrimSpace(rec.Body.String()) != wantBody {
			t.Errorf("%s /healthcheck (Accept %q) = %d %q, want %d %q", method, accept, rec.Code, rec.Body, wantCode, wantBody)
		}
	}
	check(http.MethodGet, "", 200, "OK")
	check(http.MethodGet, "application/json", 200, `{"detailed":false,"reasons":["OK"]}`)
	check(http.MethodHead, "", 204, "")
	if err := os.WriteFile(disable, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	check(http.MethodGet, "", 503, "DISABLED BY FILE")
	check(http.MethodGet, "application/json", 503, `{"detailed":false,"reasons":["DISABLED BY FILE"]}`)
	check(http.MethodHead, "", 503, "")
	if err := os.Remove(disable); err != nil {
		t.Fatal(err)
	}
	check(http.MethodGet, "", 200, "OK")
}
