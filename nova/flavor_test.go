package nova_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

func TestParseExtraSpecs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		specs  map[string]string
		want   nova.Demand
		vgpus  int
		custom map[string]int
	}{
		{"none", nil, nova.Demand{}, 0, nil},
		{"unrelated", map[string]string{"hw:watchdog_action": "reset", "hw_video:ram_max_mb": "64"}, nova.Demand{}, 0, nil},
		{"one vgpu", map[string]string{"resources:VGPU": "1"},
			nova.Demand{Groups: []nova.RequestGroup{{Resources: map[string]int{"VGPU": 1}}}}, 1, nil},
		{"typed vgpu", map[string]string{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "required", "trait:CUSTOM_NVIDIA_11": "forbidden"},
			nova.Demand{Groups: []nova.RequestGroup{{Resources: map[string]int{"VGPU": 1}, Required: []string{"CUSTOM_NVIDIA_232"}, Forbidden: []string{"CUSTOM_NVIDIA_11"}}}}, 1, nil},
		{"granular", map[string]string{
			"resources1:VGPU": "1", "trait1:CUSTOM_NVIDIA_232": "required",
			"resources2:VGPU": "2", "trait2:CUSTOM_NVIDIA_233": "required",
			"resources10:VGPU": "1", "group_policy": "isolate", "resources:VCPU": "4"},
			nova.Demand{GroupPolicy: "isolate", Groups: []nova.RequestGroup{
				{Resources: map[string]int{"VCPU": 4}},
				{Suffix: "1", Resources: map[string]int{"VGPU": 1}, Required: []string{"CUSTOM_NVIDIA_232"}},
				{Suffix: "2", Resources: map[string]int{"VGPU": 2}, Required: []string{"CUSTOM_NVIDIA_233"}},
				{Suffix: "10", Resources: map[string]int{"VGPU": 1}},
			}}, 4, nil},
		{"string suffix", map[string]string{"resources_gpu:VGPU": "1", "group_policy": "none"},
			nova.Demand{GroupPolicy: "none", Groups: []nova.RequestGroup{{Suffix: "_gpu", Resources: map[string]int{"VGPU": 1}}}}, 1, nil},
		{"custom class", map[string]string{"resources:CUSTOM_NVIDIA_T4_4Q": "1"},
			nova.Demand{Groups: []nova.RequestGroup{{Resources: map[string]int{"CUSTOM_NVIDIA_T4_4Q": 1}}}}, 0, map[string]int{"CUSTOM_NVIDIA_T4_4Q": 1}},
		{"zero drops", map[string]string{"resources:VGPU": "0"}, nova.Demand{}, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := nova.ParseExtraSpecs(tc.specs)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				g, _ := json.Marshal(got)
				w, _ := json.Marshal(tc.want)
				t.Errorf("got  %s\nwant %s", g, w)
			}
			if got.VGPUs() != tc.vgpus {
				t.Errorf("VGPUs() = %d, want %d", got.VGPUs(), tc.vgpus)
			}
			if !reflect.DeepEqual(got.CustomResources(), tc.custom) {
				t.Errorf("CustomResources() = %v, want %v", got.CustomResources(), tc.custom)
			}
			if got.HasVGPU() != (tc.vgpus > 0 || tc.custom != nil) {
				t.Errorf("HasVGPU() = %v", got.HasVGPU())
			}
		})
	}
}

// TestParseExtraSpecsBoundsVGPUs: a flavor asking for more vGPUs than
// one VM can have, in one group or over several, is refused naming the
// bound; as many as that bound is accepted.
func TestParseExtraSpecsBoundsVGPUs(t *testing.T) {
	_, err := nova.ParseExtraSpecs(map[string]string{"resources1:VGPU": "9", "resources2:CUSTOM_NVIDIA_232": "8"})
	var se *nova.SpecError
	if !errors.As(err, &se) || se.Key != "resources2:CUSTOM_NVIDIA_232" || !strings.Contains(se.Reason, "at most 16") {
		t.Errorf("17 vGPUs over two groups: %v, want a SpecError naming the bound", err)
	}
	_, err = nova.ParseExtraSpecs(map[string]string{"resources:VGPU": "1000000"})
	if !errors.As(err, &se) || !strings.Contains(se.Reason, "at most 16 vGPUs per instance") {
		t.Errorf("resources:VGPU=1000000: %v, want a SpecError naming the bound", err)
	}
	d, err := nova.ParseExtraSpecs(map[string]string{"resources1:VGPU": "8", "resources2:VGPU": "8", "resources:VCPU": "1000000"})
	if err != nil || d.VGPUs() != 16 {
		t.Errorf("16 vGPUs and many VCPUs: %+v %v, want accepted", d, err)
	}
}

func TestParseExtraSpecsErrors(t *testing.T) {
	for _, tc := range []struct {
		key, value string
	}{
		{"resources:VGPU", "-1"},
		{"resources:VGPU", "one"},
		{"resources:VGPU", ""},
		{"resources:VGPU", "1.5"},
		{"resources:VGPU", "99999999999999999999"},
		{"resources:vgpu", "1"},
		{"resources:", "1"},
		{"resources:CUSTOM_", "1"},
		{"resources1!:VGPU", "1"},
		{"trait:CUSTOM_NVIDIA_232", "yes"},
		{"trait:CUSTOM_NVIDIA_232", "Required"},
		{"trait1:custom_x", "required"},
		{"group_policy", "strict"},
		{"resources:VGPU", "1000000"},
		{"resources:VGPU", "17"},
		{"resources3:CUSTOM_NVIDIA_232", "1000000"},
	} {
		_, err := nova.ParseExtraSpecs(map[string]string{tc.key: tc.value, "hw:cpu_policy": "dedicated"})
		var se *nova.SpecError
		if !errors.As(err, &se) {
			t.Errorf("%s=%s: err %v, want *SpecError", tc.key, tc.value, err)
			continue
		}
		if se.Key != tc.key || se.Value != tc.value || se.Reason == "" {
			t.Errorf("%s=%s: got %+v", tc.key, tc.value, se)
		}
	}
}

func FuzzParseExtraSpecs(f *testing.F) {
	f.Add("resources:VGPU", "1", "trait:CUSTOM_NVIDIA_232", "required")
	f.Add("resources1:VGPU", "2", "group_policy", "isolate")
	f.Add("resources:CUSTOM_NVIDIA_T4_4Q", "1", "trait2:HW_GPU_API_VULKAN", "forbidden")
	f.Add("hw:watchdog_action", "reset", "resources:VGPU", "-3")
	f.Add("resources:VGPU", "1000000", "resources1:VGPU", "1")
	f.Add("resources1:VGPU", "9", "resources2:CUSTOM_NVIDIA_232", "9")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		d, err := nova.ParseExtraSpecs(map[string]string{k1: v1, k2: v2})
		if err != nil {
			var se *nova.SpecError
			if !errors.As(err, &se) || (se.Key != k1 && se.Key != k2) {
				t.Fatalf("error %v does not name a key", err)
			}
			return
		}
		if d.VGPUs() < 0 {
			t.Fatalf("negative VGPUs: %+v", d)
		}
		n := d.VGPUs()
		for _, c := range d.CustomResources() {
			n += c
		}
		if n > nova.MaxVGPUsPerInstance {
			t.Fatalf("accepted %d vGPUs, more than %d: %+v", n, nova.MaxVGPUsPerInstance, d)
		}
		for _, g := range d.Groups {
			for rc, n := range g.Resources {
				if n <= 0 || rc == "" {
					t.Fatalf("bad resource %q=%d", rc, n)
				}
			}
		}
	})
}
