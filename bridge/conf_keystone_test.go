package bridge

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

func TestKeystoneConfig(t *testing.T) {
	clouds := filepath.Join(t.TempDir(), "clouds.yaml")
	if err := os.WriteFile(clouds, []byte(`clouds:
  svc:
    auth:
      auth_url: http://127.0.0.1:1/v3
      username: vgpu-bridge
      password: x
      project_name: service
      user_domain_name: Default
      project_domain_name: Default
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OS_CLIENT_CONFIG_FILE", clouds)
	base := []string{"database.connection=postgres://u@h/db", "DEFAULT.transport_url=rabbit://g:g@h:5672/", "api.auth_strategy=keystone"}
	load := func(extra ...string) (*conf.Values, error) {
		return LoadConfig(conf.Source{Overrides: append(append([]string{}, base...), extra...)})
	}

	tests := []struct {
		name    string
		extra   []string
		wantErr string // a substring; "" for none
	}{
		{"no cloud anywhere", nil, "[keystone] cloud"},
		{"no roles", []string{"keystone.cloud=svc", "keystone.admin_roles=", "keystone.reader_roles="}, "admin_roles and reader_roles are both empty"},
		{"keystone cloud", []string{"keystone.cloud=svc"}, ""},
		{"openstack cloud is the default", []string{"openstack.cloud=svc"}, ""},
		{"cache ttl out of range", []string{"keystone.cloud=svc", "keystone.cache_ttl=48h"}, "cache_ttl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := load(tt.extra...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ac, err := APIConfig(v)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := ac.Auth.(*keystoneauth.Authenticator); !ok {
				t.Fatalf("auth = %T, want *keystoneauth.Authenticator", ac.Auth)
			}
		})
	}

	v, err := load("keystone.cloud=svc", "keystone.admin_roles=cloud-admin", "keystone.reader_roles=observer", "keystone.cache_ttl=30s")
	if err != nil {
		t.Fatal(err)
	}
	kc, err := KeystoneAuthConfig(v, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(kc.AdminRoles, ",") != "cloud-admin" || strings.Join(kc.ReaderRoles, ",") != "observer" ||
		kc.CacheTTL != 30*time.Second || kc.InvalidCacheTTL != 10*time.Second || kc.CacheSize != 10000 {
		t.Errorf("config = %+v", kc)
	}
	// A cloud clouds.yaml does not have fails at start, naming it.
	v, err = load("keystone.cloud=absent")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := APIConfig(v); err == nil || !strings.Contains(err.Error(), `"absent"`) {
		t.Errorf("unknown cloud: err = %v", err)
	}
}
