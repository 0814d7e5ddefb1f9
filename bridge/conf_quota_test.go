package bridge

import (
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
