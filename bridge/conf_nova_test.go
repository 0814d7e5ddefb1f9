package bridge

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

func TestNovaConfig(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("admin:admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"database.connection=postgres://u@h/db", "DEFAULT.transport_url=rabbit://g:g@h:5672/", "api.auth_strategy=noauth"}
	v, err := LoadConfig(conf.Source{Overrides: append(base,
		"nova.endpoint_override=http://127.0.0.1:8774/v2.1", "nova.token_file="+tok, "nova.microversion=2.93",
		"nova.resize_timeout=30m", "nova.verify_timeout=1m", "nova.confirm_timeout=2m", "nova.timeout=10s")})
	if err != nil {
		t.Fatal(err)
	}
	c, ok, err := NovaConfig(v)
	if err != nil || !ok {
		t.Fatalf("NovaConfig: %v, %v", ok, err)
	}
	if c.Endpoint != "http://127.0.0.1:8774/v2.1" || c.Token != "admin:admin" || c.Microversion != "2.93" || c.Timeout != 10*time.Second || c.WrapTransport == nil {
		t.Errorf("config %+v", c)
	}
	pc := NovaPathConfig(v)
	if pc.ResizeTimeout != 30*time.Minute || pc.VerifyTimeout != time.Minute || pc.ConfirmTimeout != 2*time.Minute || pc.CallLease != 20*time.Second {
		t.Errorf("path config %+v", pc)
	}

	// Not configured: the path is off, and that is no error.
	v, err = LoadConfig(conf.Source{Overrides: base})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := NovaConfig(v); ok || err != nil {
		t.Errorf("unconfigured Nova: ok %v, err %v", ok, err)
	}
	// A cloud of clouds.yaml turns it on.
	v, err = LoadConfig(conf.Source{Overrides: append(base, "openstack.cloud=prod")})
	if err != nil {
		t.Fatal(err)
	}
	if c, ok, err := NovaConfig(v); !ok || err != nil || c.Cloud != "prod" {
		t.Errorf("cloud: ok %v, err %v, %+v", ok, err, c)
	}
}

func TestNovaConfigErrors(t *testing.T) {
	base := []string{"database.connection=postgres://u@h/db", "DEFAULT.transport_url=rabbit://g:g@h:5672/", "api.auth_strategy=noauth"}
	for _, o := range [][]string{
		{"nova.microversion=2.60"},
		{"nova.microversion=v2.1"},
		{"nova.endpoint_override=http://127.0.0.1:8774/v2.1"}, // no token_file, no cloud
	} {
		if _, err := LoadConfig(conf.Source{Overrides: append(base, o...)}); err == nil {
			t.Errorf("%v accepted", o)
		}
	}
	v, err := LoadConfig(conf.Source{Overrides: append(base, "nova.endpoint_override=http://127.0.0.1:8774/v2.1", "nova.token_file=/nonexistent/token")})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := NovaConfig(v); err == nil {
		t.Error("a missing token file accepted")
	}
}
