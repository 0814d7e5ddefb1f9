package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealthExitCodes(t *testing.T) {
	ready := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("X-Auth-Token") != "tok" {
			t.Errorf("token not sent: %q", r.Header.Get("X-Auth-Token"))
		}
		if ready {
			json.NewEncoder(w).Encode(map[string]any{"status": "ready", "checks": map[string]string{"database": "ok", "broker": "ok"}})
			return
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(503)
		json.NewEncoder(w).Encode(map[string]any{"status": 503, "title": "Not ready", "invalid_params": []map[string]string{{"name": "database", "reason": "connection refused"}}})
	}))
	defer srv.Close()
	t.Setenv("VGPUCTL_TOKEN", "tok")

	tests := []struct {
		name     string
		ready    bool
		args     []string
		wantCode int
		wantOut  string
	}{
		{"ready table", true, nil, exitOK, "database  ok"},
		{"ready json", true, []string{"-o", "json"}, exitOK, `"status": "ready"`},
		{"not ready", false, nil, exitNotReady, "database  connection refused"},
		{"bad format", true, []string{"-o", "xml"}, exitUsage, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ready = tt.ready
			var out, errb bytes.Buffer
			code := run(append([]string{"health", "--url", srv.URL}, tt.args...), &out, &errb)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d (stderr %s)", code, tt.wantCode, errb.String())
			}
			if !strings.Contains(out.String(), tt.wantOut) {
				t.Errorf("output lacks %q:\n%s", tt.wantOut, out.String())
			}
		})
	}
}

func TestUnreachableExits4(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"health", "--url", "http://127.0.0.1:1"}, &out, &errb); code != exitNoAPI {
		t.Fatalf("exit %d, want %d", code, exitNoAPI)
	}
}

func TestVersionAndUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "vgpuctl ") {
		t.Fatalf("version: %d %q", code, out.String())
	}
	if code := run([]string{"health", "--bogus"}, &out, &errb); code != exitUsage {
		t.Fatalf("bad flag exit %d", code)
	}
}
