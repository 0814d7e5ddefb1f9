package keystone_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestKeystoneAuthtokenSection: a bridge.conf whose [keystone_authtoken]
// is pasted from nova.conf, as kolla-ansible writes it (ids of the
// domains, memcached and service-token settings the bridge ignores),
// with no clouds.yaml at all, validates callers' tokens with that
// section's service user at the real Keystone; a wrong password in it
// fails to log in.
func TestKeystoneAuthtokenSection(t *testing.T) {
	ks := newKeystone(t)
	psvc := ks.project("vgpu-test-service")
	svc := ks.user("vgpu-bridge", psvc, "service")
	pa := ks.project("vgpu-test-a")
	alice := ks.user("alice", pa, "member")
	t.Setenv("OS_CLIENT_CONFIG_FILE", filepath.Join(t.TempDir(), "no-clouds.yaml"))

	write := func(password string) string {
		p := filepath.Join(t.TempDir(), "bridge.conf")
		body := `[DEFAULT]
transport_url = rabbit://guest:guest@127.0.0.1:5672/
[database]
connection = postgres://vgpu@127.0.0.1:5432/unused
[api]
auth_strategy = keystone
[keystone_authtoken]
www_authenticate_uri = ` + keystoneURL() + `
auth_url = ` + keystoneURL() + `
auth_type = password
project_domain_id = default
user_domain_id = default
project_name = ` + psvc.Name + `
username = ` + svc.name + `
password = ` + password + `
service_token_roles_required = True
region_name = RegionOne
memcache_security_strategy = ENCRYPT
memcache_secret_key = not-used
memcached_servers = 127.0.0.1:11211
`
		testsvc.Must(t, os.WriteFile(p, []byte(body), 0o600), "write bridge.conf")
		return p
	}
	validator := func(password string) keystoneauth.Validator {
		v, err := bridge.LoadConfig(conf.Source{File: write(password)})
		testsvc.Must(t, err, "load bridge.conf")
		kc, err := bridge.KeystoneAuthConfig(v, nil)
		testsvc.Must(t, err, "keystone config")
		if kc.ChallengeURI != keystoneURL() {
			t.Errorf("challenge URI %q, want www_authenticate_uri %q", kc.ChallengeURI, keystoneURL())
		}
		return kc.Validator
	}
	ctx := context.Background()
	info, err := validator(svc.password).Validate(ctx, ks.token(alice))
	if err != nil {
		t.Fatalf("validate alice's token: %v", err)
	}
	if info.UserName != alice.name || info.ProjectID != pa.ID {
		t.Errorf("token info %+v, want alice in %s", info, pa.ID)
	}
	if _, err := validator(svc.password).Validate(ctx, "gAAAAABnot-a-keystone-token"); !errors.Is(err, keystoneauth.ErrInvalidToken) {
		t.Errorf("bad token: %v, want ErrInvalidToken", err)
	}
	_, err = validator("wrong-"+svc.password).Validate(ctx, ks.token(alice))
	if err == nil || errors.Is(err, keystoneauth.ErrInvalidToken) || !strings.Contains(err.Error(), "keystone_authtoken") {
		t.Errorf("wrong service password: %v, want a login error naming keystone_authtoken", err)
	}
}
