// SPDX-License-Identifier: Apache-2.0

package fleetupgrade

import (
	"strings"
	"testing"
)

// TestGateFindings: the diagnose gate fails on error and critical
// findings only, and says what each one found (its evidence).
func TestGateFindings(t *testing.T) {
	for _, tc := range []struct {
		name, details string
		want          []string // "" when the gate passes
	}{
		{"no finding", `{"diagnostics":{"host":"h","worst":"ok","findings":[]}}`, nil},
		{"warnings pass", `{"diagnostics":{"findings":[{"check":"capacity","severity":"warning","subject":"0000:3b:00.0",
			"title":"full","evidence":["no instance left"]},{"check":"orphan_mdevs","severity":"info","title":"none"}]}}`, nil},
		{"an error with its evidence", `{"diagnostics":{"findings":[{"check":"nvml_available","severity":"ok","title":"fine"},
			{"check":"hot_add_prerequisites","severity":"error","subject":"host","title":"VFIO modules missing",
			"evidence":["not loaded: nvidia_vgpu_vfio"]}]}}`,
			[]string{"error hot_add_prerequisites host: VFIO modules missing (not loaded: nvidia_vgpu_vfio)"}},
		{"a critical without evidence and an error", `{"diagnostics":{"findings":[{"check":"libvirt_available","severity":"critical",
			"subject":"host","title":"libvirt does not answer"},{"check":"license","severity":"error","subject":"v1","title":"unlicensed",
			"evidence":["a","b"]}]}}`,
			[]string{"critical libvirt_available host: libvirt does not answer; error license v1: unlicensed (a; b)"}},
		{"unreadable", `{"diagnostics":`, []string{"unreadable diagnostics: "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := gateFindings([]byte(tc.details))
			if len(tc.want) == 0 {
				if got != "" {
					t.Errorf("gate failed: %q, want it passed", got)
				}
				return
			}
			for _, w := range tc.want {
				if !strings.HasPrefix(got, w) {
					t.Errorf("gate %q, want %q", got, w)
				}
			}
		})
	}
}
