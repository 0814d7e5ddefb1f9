package computeapi

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

func loadFlavors(t *testing.T) []Flavor {
	t.Helper()
	b, err := os.ReadFile("testdata/flavors.json")
	if err != nil {
		t.Fatal(err)
	}
	var fs []Flavor
	if err := json.Unmarshal(b, &fs); err != nil {
		t.Fatal(err)
	}
	return fs
}

func TestChooseFlavor(t *testing.T) {
	all := loadFlavors(t)
	t4q := Want{Profile: "T4-4Q", Trait: "CUSTOM_NVIDIA_232", Count: 1}
	small := Flavor{Name: "m1.small", VCPUs: 2, RAM: 2048, Disk: 20}
	medium := Flavor{Name: "m1.medium", VCPUs: 4, RAM: 4096, Disk: 40}
	pinned := Flavor{Name: "c4.pinned", VCPUs: 4, RAM: 8192, Disk: 40, ExtraSpecs: map[string]string{"hw:cpu_policy": "dedicated"}}
	tests := []struct {
		name    string
		current Flavor
		want    Want
		got     string // chosen flavor's id; "" when none fits
		errHas  []string
	}{
		{name: "same sizes and type", current: small, want: t4q, got: "2"},
		{name: "two units", current: small, want: Want{Profile: "T4-4Q", Trait: "CUSTOM_NVIDIA_232", Count: 2}, got: "4"},
		{name: "other type", current: small, want: Want{Profile: "T4-8Q", Trait: "CUSTOM_NVIDIA_233", Count: 1}, got: "3"},
		{name: "granular group with its own trait", current: medium, want: t4q, got: "6"},
		{name: "same other specs win over public", current: pinned, want: t4q, got: "11"},
		{name: "three units: none", current: small, want: Want{Profile: "T4-4Q", Trait: "CUSTOM_NVIDIA_232", Count: 3},
			errHas: []string{"vcpus=2, ram=2048 MB, disk=20 GB", "resources:VGPU=3", "trait:CUSTOM_NVIDIA_232=required",
				"openstack flavor create --vcpus 2 --ram 2048 --disk 20 --property resources:VGPU=3 --property trait:CUSTOM_NVIDIA_232=required m1.small.vgpu-t4-4qx3"}},
		{name: "disabled and malformed never fit", current: Flavor{Name: "m1.xl", VCPUs: 16, RAM: 32768, Disk: 160}, want: t4q,
			errHas: []string{"m1.xl.vgpu-t4-4q"}},
		{name: "sizes differ", current: Flavor{Name: "m1.tiny", VCPUs: 1, RAM: 512, Disk: 1, ExtraSpecs: map[string]string{"hw:mem_page_size": "large"}}, want: t4q,
			errHas: []string{"vcpus=1, ram=512 MB, disk=1 GB", "hw:mem_page_size=large", "flavor m1.tiny"}},
		{name: "no trait", current: small, want: Want{Profile: "X"}, errHas: []string{"has no Placement trait"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ChooseFlavor(tc.current, all, tc.want)
			if tc.got != "" {
				if err != nil || f.ID != tc.got {
					t.Fatalf("got %q (%v), want flavor %s", f.ID, err, tc.got)
				}
				return
			}
			if !errors.Is(err, ErrNoFlavor) {
				t.Fatalf("got %q, %v; want ErrNoFlavor", f.ID, err)
			}
			for _, s := range tc.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q\n lacks %q", err, s)
				}
			}
		})
	}
}

func TestCarriesVGPU(t *testing.T) {
	w := Want{Trait: "CUSTOM_NVIDIA_232", Count: 1}
	tests := []struct {
		specs map[string]string
		want  bool
	}{
		{map[string]string{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "required"}, true},
		{map[string]string{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "forbidden"}, false},
		{map[string]string{"resources:VGPU": "1"}, false},
		{map[string]string{"resources1:VGPU": "1", "trait1:CUSTOM_NVIDIA_232": "required"}, true},
		{map[string]string{"resources1:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "required"}, false},
		{map[string]string{"resources:VGPU": "1", "resources1:VGPU": "1", "trait1:CUSTOM_NVIDIA_232": "required"}, false},
		{map[string]string{"resources:VGPU": "x", "trait:CUSTOM_NVIDIA_232": "required"}, false},
		{nil, false},
	}
	for _, tc := range tests {
		if got := CarriesVGPU(Flavor{ExtraSpecs: tc.specs}, w); got != tc.want {
			t.Errorf("CarriesVGPU(%v) = %v, want %v", tc.specs, got, tc.want)
		}
	}
}
