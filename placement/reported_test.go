package placement

import (
	"maps"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

func TestReportedTypes(t *testing.T) {
	r := protocol.Report{GPUs: []protocol.GPU{
		// vGPUs exist: their type.
		{PCI: "0000:3b:00.0", Active: []protocol.VGPU{{TypeID: "nvidia-232"}},
			Types: []protocol.VGPUType{{ID: "nvidia-231"}, {ID: "nvidia-232"}}},
		// None, and one type offered: that one.
		{PCI: "0000:d8:00.0", Types: []protocol.VGPUType{{ID: "nvidia-233"}}},
		// None, several offered: Nova's choice, not the bridge's.
		{PCI: "0000:af:00.0", Types: []protocol.VGPUType{{ID: "nvidia-231"}, {ID: "nvidia-232"}}},
		// None, several offered, one enabled (nova.conf's choice, copied
		// into the agent's allow-list): that one.
		{PCI: "0000:86:00.0", EnabledType: "nvidia-232", Types: []protocol.VGPUType{{ID: "nvidia-231"}, {ID: "nvidia-232"}}},
		// Vendor VFIO VF type ids are numbers.
		{PCI: "0000:c1:00.4", Types: []protocol.VGPUType{{ID: "1429"}}},
	}}
	want := map[string]string{
		"cmp1_pci_0000_3b_00_0": "CUSTOM_NVIDIA_232",
		"cmp1_pci_0000_d8_00_0": "CUSTOM_NVIDIA_233",
		"cmp1_pci_0000_c1_00_4": "CUSTOM_1429",
		"cmp1_pci_0000_86_00_0": "CUSTOM_NVIDIA_232",
	}
	if got := ReportedTypes("cmp1", r); !maps.Equal(got, want) {
		t.Errorf("ReportedTypes = %v, want %v", got, want)
	}
}

// TestReportedTypeRule: the rule of ReportedTypes for one GPU, on strings
// and on the bytes ReadReportedTypes scans.
func TestReportedTypeRule(t *testing.T) {
	tests := []struct {
		active         int
		first, enabled string
		types          int
		offered, want  string
	}{
		{1, "nvidia-232", "", 2, "nvidia-231", "nvidia-232"}, // vGPUs exist: their type
		{1, "nvidia-232", "nvidia-231", 2, "nvidia-231", "nvidia-232"},
		{3, "nvidia-232", "", 0, "", "nvidia-232"},
		{0, "", "", 1, "nvidia-233", "nvidia-233"},           // none, one type offered
		{0, "", "", 2, "nvidia-231", ""},                     // several: Nova's choice,
		{0, "", "nvidia-232", 2, "nvidia-231", "nvidia-232"}, // which the allow-list names
		{0, "", "", 0, "", ""},
		{1, "", "", 1, "nvidia-233", ""}, // a vGPU of no type says none
	}
	for _, tc := range tests {
		if got := reportedType(tc.active, tc.first, tc.enabled, tc.types, tc.offered); got != tc.want {
			t.Errorf("reportedType(%d, %q, %q, %d, %q) = %q, want %q", tc.active, tc.first, tc.enabled, tc.types, tc.offered, got, tc.want)
		}
		if got := reportedType(tc.active, []byte(tc.first), []byte(tc.enabled), tc.types, []byte(tc.offered)); string(got) != tc.want {
			t.Errorf("reportedType(%d, %q, %q, %d, %q) on bytes = %q, want %q", tc.active, tc.first, tc.enabled, tc.types, tc.offered, got, tc.want)
		}
	}
	for pci, want := range map[string]string{"0000:3b:00.0": "cmp1_pci_0000_3b_00_0", "0000:c1:00.4": "cmp1_pci_0000_c1_00_4", "": "cmp1_pci_"} {
		if got := GPUProviderName("cmp1", pci); got != want {
			t.Errorf("GPUProviderName(cmp1, %q) = %q, want %q", pci, got, want)
		}
	}
}
