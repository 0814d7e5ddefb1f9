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
		{name: "typed wins over untyped", current: small, want: Want{Profile: "T4-4Q", Trait: "CUSTOM_NVIDIA_232", Count: 1, Untyped: true}, got: "2"},
		{name: "untyped when allowed", current: small, want: Want{Profile: "T4-16Q", Trait: "CUSTOM_NVIDIA_234", Count: 1, Untyped: true}, got: "13"},
		{name: "untyped not by default", current: small, want: Want{Profile: "T4-16Q", Trait: "CUSTOM_NVIDIA_234", Count: 1},
			errHas: []string{"trait:CUSTOM_NVIDIA_234=required"}},
		{name: "two granular groups", current: Flavor{Name: "g2", VCPUs: 6, RAM: 12288, Disk: 60},
			want: Want{Profile: "T4-4Q", Trait: "CUSTOM_NVIDIA_232", Count: 2, Untyped: true}, got: "14"},
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
		{map[string]string{"resources1:VGPU": "1", "trait1:CUSTOM_NVIDIA_232": "required", "resources2:VGPU": "1"}, false},
		{map[string]string{"resources:VGPU": "1", "resources:CUSTOM_NVIDIA_232": "1", "trait:CUSTOM_NVIDIA_232": "required"}, false},
		{nil, false},
	}
	for _, tc := range tests {
		if got := CarriesVGPU(Flavor{ExtraSpecs: tc.specs}, w); got != tc.want {
			t.Errorf("CarriesVGPU(%v) = %v, want %v", tc.specs, got, tc.want)
		}
	}
	two := Want{Trait: "CUSTOM_NVIDIA_232", Count: 2}
	split := map[string]string{"resources1:VGPU": "1", "trait1:CUSTOM_NVIDIA_232": "required", "resources2:VGPU": "1",
		"trait2:CUSTOM_NVIDIA_232": "required", "group_policy": "isolate"}
	if !CarriesVGPU(Flavor{ExtraSpecs: split}, two) {
		t.Errorf("two granular groups of the type do not carry %+v", two)
	}
	untyped := map[string]string{"resources:VGPU": "1"}
	if CarriesVGPU(Flavor{ExtraSpecs: untyped}, w) {
		t.Error("a flavor without trait carries the type though Untyped is false")
	}
	if u := (Want{Trait: w.Trait, Count: 1, Untyped: true}); !CarriesVGPU(Flavor{ExtraSpecs: untyped}, u) {
		t.Errorf("a flavor without trait does not carry %+v", u)
	}
	other := map[string]string{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_233": "required"}
	if u := (Want{Trait: w.Trait, Count: 1, Untyped: true}); CarriesVGPU(Flavor{ExtraSpecs: other}, u) {
		t.Error("a flavor of another type carries the wanted one when untyped flavors are allowed")
	}
}

func TestChooseReleaseFlavor(t *testing.T) {
	all := loadFlavors(t)
	byID := map[string]Flavor{}
	for _, f := range all {
		byID[f.ID] = f
	}
	named := func(id, spec string) Flavor {
		f := byID[id]
		f.ExtraSpecs = map[string]string{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "required", ReleaseFlavorSpec: spec}
		return f
	}
	tests := []struct {
		name    string
		current Flavor
		got     string
		errHas  []string
	}{
		{name: "same sizes, public, no vGPU", current: byID["2"], got: "1"},
		{name: "same other specs win over public", current: byID["11"], got: "16"},
		{name: "named by name", current: byID["20"], got: "18"},
		{name: "named by id", current: named("2", "17"), got: "17"},
		{name: "named but missing", current: named("2", "gone"), errHas: []string{"release_flavor=gone", "does not exist", "openstack flavor set"}},
		{name: "named but disabled", current: named("2", "m1.small.off"), errHas: []string{"is disabled"}},
		{name: "named but with a vGPU", current: named("2", "3"), errHas: []string{"asks for a vGPU too"}},
		{name: "none of the sizes", current: byID["5"], errHas: []string{"vcpus=8, ram=16384 MB, disk=80 GB",
			"openstack flavor create --vcpus 8 --ram 16384 --disk 80 m1.large.t4-4q.novgpu", "openstack flavor set --property vgpu_bridge:release_flavor=<flavor> m1.large.t4-4q"}},
		{name: "suggestion keeps other specs", current: Flavor{Name: "c3.vgpu-t4-4q", VCPUs: 3, RAM: 3072, Disk: 30, Ephemeral: 10,
			ExtraSpecs: map[string]string{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "required", "hw:cpu_policy": "dedicated"}}, errHas: []string{"--disk 30 --ephemeral 10 --property hw:cpu_policy=dedicated c3;"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ChooseReleaseFlavor(tc.current, all)
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
