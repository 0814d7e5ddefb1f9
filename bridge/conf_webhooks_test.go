// SPDX-License-Identifier: Apache-2.0

package bridge

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// TestWebhookJWTConfig: a [webhook_source:NAME] with auth = jwt needs
// jwt_issuer and exactly one of jwks_url (https, or http to loopback) and
// jwks_file, an audience no other source of its issuer has, and maps to
// webhook.Source.
func TestWebhookJWTConfig(t *testing.T) {
	dir := t.TempDir()
	load := func(section string) (*conf.Values, error) {
		t.Helper()
		f := filepath.Join(dir, "bridge.conf")
		text := "[DEFAULT]\ntransport_url = rabbit://u:p@127.0.0.1:5672/\n[database]\nconnection = postgres://u@127.0.0.1/db\n" +
			"[api]\ntoken_file = " + filepath.Join(dir, "tokens") + "\n" +
			"[webhook_source:idp]\n" + section
		if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return LoadConfig(conf.Source{File: f})
	}
	const good = "auth = jwt\njwt_issuer = https://idp.example.org/realms/hpc\njwt_audience = vgpu-bridge\n"
	for _, tc := range []struct {
		name    string
		section string
		wantErr string // a substring; "" for none
	}{
		{"url", good + "jwks_url = https://idp.example.org/certs\n", ""},
		{"file", good + "jwks_file = /etc/vgpu-bridge/jwks.json\n", ""},
		{"loopback http", good + "jwks_url = http://127.0.0.1:8080/certs\n", ""},
		{"alertmanager", good + "format = alertmanager\njwks_url = https://idp.example.org/certs\n", ""},
		{"no issuer", "auth = jwt\njwt_audience = a\njwks_url = https://idp.example.org/certs\n", "jwt_issuer"},
		{"no audience: one of its own", "auth = jwt\njwt_issuer = i\njwks_url = https://idp.example.org/certs\n", ""},
		{"two sources of one issuer, one audience", good + "jwks_url = https://idp.example.org/certs\n[webhook_source:idp2]\n" +
			good + "jwks_url = https://idp.example.org/certs\n", "[webhook_source:idp]'s too"},
		{"two sources of one issuer, default audiences", "auth = jwt\njwt_issuer = i\njwks_url = https://idp.example.org/certs\n" +
			"[webhook_source:idp2]\nauth = jwt\njwt_issuer = i\njwks_url = https://idp.example.org/certs\n", ""},
		{"the default audience of another, taken", "auth = jwt\njwt_issuer = i\njwks_url = https://idp.example.org/certs\n" +
			"[webhook_source:idp2]\nauth = jwt\njwt_issuer = i\njwt_audience = vgpu-bridge:webhook:idp\njwks_url = https://idp.example.org/certs\n", "jwt_audience"},
		{"lifetime too long", good + "jwks_url = https://idp.example.org/certs\njwt_max_lifetime = 48h\n", "jwt_max_lifetime"},
		{"no keys", good, "auth = jwt needs jwks_url or jwks_file"},
		{"both", good + "jwks_url = https://idp.example.org/certs\njwks_file = /etc/jwks.json\n", "not both"},
		{"http elsewhere", good + "jwks_url = http://idp.example.org/certs\n", "only to a loopback host"},
		{"leeway too large", good + "jwks_url = https://idp.example.org/certs\njwt_leeway = 10m\n", "jwt_leeway"},
		{"refresh too short", good + "jwks_url = https://idp.example.org/certs\njwks_refresh_interval = 1s\n", "jwks_refresh_interval"},
		{"unknown auth", "auth = oauth\n", "hmac, bearer, mtls, jwt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(tc.section)
			if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}

	v, err := load(good + "jwks_url = https://idp.example.org/certs\njwt_projects_claim = projects\nallowed_projects = p1,p2\njwt_leeway = 30s\n")
	if err != nil {
		t.Fatal(err)
	}
	srcs, err := WebhookSources(v)
	if err != nil {
		t.Fatal(err)
	}
	s := srcs[0]
	if s.Auth != webhook.AuthJWT || s.JWTIssuer != "https://idp.example.org/realms/hpc" || s.JWTAudience != "vgpu-bridge" ||
		s.JWKSURL != "https://idp.example.org/certs" || s.JWKSFile != "" || s.JWTLeeway != 30*time.Second ||
		s.JWKSRefresh != 5*time.Minute || s.JWTProjectsClaim != "projects" || len(s.AllowedProjects) != 2 {
		t.Errorf("source = %+v", s)
	}
	v, err = load(good + "jwks_url = https://idp.example.org/certs\n")
	if err != nil {
		t.Fatal(err)
	}
	if srcs, _ = WebhookSources(v); srcs[0].JWTLeeway != time.Minute || srcs[0].JWTMaxLifetime != time.Hour {
		t.Errorf("default leeway %s and max lifetime %s, want 1m and 1h", srcs[0].JWTLeeway, srcs[0].JWTMaxLifetime)
	}
}
