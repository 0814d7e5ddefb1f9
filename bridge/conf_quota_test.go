package bridge

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

func TestQuotaConfig(t *testing.T) {
	base := []string{"database.connection=postgres://u@h/db", "DEFAULT.transport_url=rabbit://g:g@h:5672/", "api.auth_strategy=noauth"}
	for _, tc := range []struct {
		name      string
		overrides []string
		problem   string // "" when valid
		unified   bool
	}{
		{"default: the policy file's quotas", nil, "", false},
		{"unified without an endpoint", []string{"quota.driver=unified_limits", "openstack.cloud=prod"}, "[quota] endpoint_id", false},
		{"unified without Keystone credentials", []string{"quota.driver=unified_limits", "quota.endpoint_id=ep"}, "unified_limits reads Keystone", false},
		{"unified", []string{"quota.driver=unified_limits", "quota.endpoint_id=ep", "openstack.cloud=prod"}, "", true},
		{"unknown driver", []string{"quota.driver=nova.quota.UnifiedLimitsDriver"}, "[quota] driver", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := LoadConfig(conf.Source{Overrides: append(append([]string(nil), base...), tc.overrides...)})
			if tc.problem != "" {
				if err == nil || !strings.Contains(err.Error(), tc.problem) {
					t.Fatalf("err %v, want one naming %q", err, tc.problem)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := optQuotaDriver.Get(v) == QuotaDriverUnifiedLimits; got != tc.unified {
				t.Errorf("unified %v, want %v", got, tc.unified)
			}
		})
	}
}

// TestQuotaConfigOsloLimit: nova.conf's [oslo_limit], pasted, sets the
// endpoint and the credentials the limits are read with.
func TestQuotaConfigOsloLimit(t *testing.T) {
	f := filepath.Join(t.TempDir(), "bridge.conf")
	ini := "[DEFAULT]\ntransport_url = rabbit://g:g@h:5672/\n[database]\nconnection = postgres://u@h/db\n[api]\nauth_strategy = noauth\n" +
		"[quota]\ndriver = unified_limits\n" +
		"[oslo_limit]\nendpoint_id = 6b9ed2c8e8a84a5d8b0d3c4f2a9e6f10\nauth_type = password\nauth_url = http://keystone:5000/v3\nusername = vgpu-bridge\n" +
		"password = secret\nuser_domain_name = Default\nsystem_scope = all\nvalid_interfaces = internal\n"
	if err := os.WriteFile(f, []byte(ini), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := LoadConfig(conf.Source{File: f})
	if err != nil {
		t.Fatal(err)
	}
	if optQuotaEndpointID.Get(v) != "6b9ed2c8e8a84a5d8b0d3c4f2a9e6f10" || optQuotaAuthURL.Get(v) != "http://keystone:5000/v3" ||
		optQuotaUsername.Get(v) != "vgpu-bridge" || optQuotaPassword.Get(v) != "secret" || optQuotaSystemScope.Get(v) != "all" {
		t.Errorf("[oslo_limit] not read: endpoint %q, auth_url %q, user %q", optQuotaEndpointID.Get(v), optQuotaAuthURL.Get(v), optQuotaUsername.Get(v))
	}
	if _, err := quotaKeystone(v); err != nil {
		t.Errorf("quotaKeystone: %v", err)
	}
	// nova.conf's other [oslo_limit] options are read and ignored, named
	// in a warning.
	if w := strings.Join(v.Warnings, "\n"); !strings.Contains(w, "oslo_limit") || !strings.Contains(w, "auth_type") ||
		!strings.Contains(w, "valid_interfaces") {
		t.Errorf("warnings %q; want one naming [oslo_limit]'s auth_type and valid_interfaces", v.Warnings)
	}
}
