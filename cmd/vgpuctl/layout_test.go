// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestHostLayout: vgpuctl host layout prints, offline, the device_spec
// entries of the VFs (not the PF), the alias, the flavor extra spec, the
// bridge's option and the provider Nova makes; bad flags are usage errors.
func TestHostLayout(t *testing.T) {
	args := []string{"host", "layout", "--pf", "0000:C1:00.0", "--vf", "0000:c1:00.6,0000:c1:00.7", "--vf", "0000:c1:01.0",
		"--product", "0x2335", "--type", "1430", "--alias", "h200x-35c", "--node", "compute-7"}
	code, out, errs := vgpuctl(append(args, "-o", "json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var l hostLayout
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	wantSpecs := []string{
		`{"address":{"bus":"c1","domain":"0000","function":"[67]","slot":"00"},"product_id":"2335","resource_class":"CUSTOM_VGPU_VF_1430","traits":"CUSTOM_1430","vendor_id":"10de"}`,
		`{"address":{"bus":"c1","domain":"0000","function":"[0]","slot":"01"},"product_id":"2335","resource_class":"CUSTOM_VGPU_VF_1430","traits":"CUSTOM_1430","vendor_id":"10de"}`,
	}
	if !slices.Equal(l.DeviceSpec, wantSpecs) {
		t.Errorf("device_spec %v, want %v", l.DeviceSpec, wantSpecs)
	}
	if l.Alias != `{"device_type":"type-VF","name":"h200x-35c","product_id":"2335","vendor_id":"10de"}` ||
		l.ExtraSpecs["pci_passthrough:alias"] != "h200x-35c:1" || l.BridgeOption != "CUSTOM_VGPU_VF_1430=1430" ||
		l.BridgeAliasOption != "h200x-35c=CUSTOM_VGPU_VF_1430" ||
		l.Provider != "compute-7_0000:C1:00.0" || l.Trait != "CUSTOM_1430" || !l.ReportInPlacement {
		t.Errorf("layout %+v", l)
	}
	code, out, _ = vgpuctl(args...)
	for _, want := range []string{"report_in_placement", wantSpecs[0], "pci_passthrough:alias", "nova_vf_resource_classes", "nova_vf_aliases", "compute-7_0000:C1:00.0"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("table (exit %d) lacks %q:\n%s", code, want, out)
		}
	}

	for _, tc := range []struct {
		name string
		drop string // flag left out
		set  []string
	}{
		{name: "no alias", drop: "--alias"},
		{name: "no VFs", drop: "--vf"},
		{name: "type not numeric", set: []string{"--type", "T4-4Q"}},
		{name: "bad product", set: []string{"--product", "23"}},
		{name: "bad VF", set: []string{"--vf", "0000:c1:00"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a []string
			for i := 0; i < len(args); i++ {
				if args[i] == tc.drop {
					i++
					continue
				}
				a = append(a, args[i])
			}
			if code, _, errs := vgpuctl(append(a, tc.set...)...); code != 2 || errs == "" {
				t.Errorf("exit %d (%s), want 2 with a message", code, errs)
			}
		})
	}
}
