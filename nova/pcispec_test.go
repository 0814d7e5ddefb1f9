package nova

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestVFPassthrough: the device_spec entries match exactly the VFs (one
// per slot they span, functions as a character class), carry the class
// and the type trait; the alias and the flavor extra spec name the alias.
func TestVFPassthrough(t *testing.T) {
	v := VFPassthrough{PF: "0000:c1:00.0", VendorID: "10de", ProductID: "2335", ResourceClass: VFResourceClass("1430"),
		TypeTrait: "CUSTOM_1430", Alias: "h200-35c",
		VFs: []string{"0000:c1:00.4", "0000:c1:00.5", "0000:c1:00.6", "0000:c1:00.7", "0000:C1:01.0", "0000:c1:01.1"}}
	specs, err := v.DeviceSpecs()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"address":{"bus":"c1","domain":"0000","function":"[4567]","slot":"00"},"product_id":"2335","resource_class":"CUSTOM_VGPU_VF_1430","traits":"CUSTOM_1430","vendor_id":"10de"}`,
		`{"address":{"bus":"c1","domain":"0000","function":"[01]","slot":"01"},"product_id":"2335","resource_class":"CUSTOM_VGPU_VF_1430","traits":"CUSTOM_1430","vendor_id":"10de"}`,
	}
	if !slices.Equal(specs, want) {
		t.Errorf("device_spec\n%v\nwant\n%v", specs, want)
	}
	var alias map[string]string
	if err := json.Unmarshal([]byte(v.AliasSpec()), &alias); err != nil || alias["name"] != "h200-35c" || alias["device_type"] != "type-VF" || alias["product_id"] != "2335" {
		t.Errorf("alias %s (%v)", v.AliasSpec(), err)
	}
	if es := v.ExtraSpecs(); es["pci_passthrough:alias"] != "h200-35c:1" || len(es) != 1 {
		t.Errorf("extra specs %v", es)
	}
	if got := PCIProviderName("cmp1", "0000:c1:00.0"); got != "cmp1_0000:C1:00.0" {
		t.Errorf("provider name %s", got)
	}
	for _, bad := range [][]string{nil, {"0000:c1:00"}, {"0000:c1:00.8"}, {"zz00:c1:00.1"}} {
		if _, err := (VFPassthrough{PF: "0000:c1:00.0", VFs: bad}).DeviceSpecs(); err == nil {
			t.Errorf("VFs %v: no error", bad)
		}
	}
}
