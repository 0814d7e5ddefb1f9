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
		// Vendor VFIO VF type ids are numbers.
		{PCI: "0000:c1:00.4", Types: []protocol.VGPUType{{ID: "1429"}}},
	}}
	want := map[string]string{
		"cmp1_pci_0000_3b_00_0": "CUSTOM_NVIDIA_232",
		"cmp1_pci_0000_d8_00_0": "CUSTOM_NVIDIA_233",
		"cmp1_pci_0000_c1_00_4": "CUSTOM_1429",
	}
	if got := ReportedTypes("cmp1", r); !maps.Equal(got, want) {
		t.Errorf("ReportedTypes = %v, want %v", got, want)
	}
}
