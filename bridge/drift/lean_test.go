package drift

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

// TestLeanReport: drift's decode keeps every field it judges a host by,
// as the full decode has them, and nothing else.
func TestLeanReport(t *testing.T) {
	util := 40.0
	full := protocol.Report{Host: "cmp-1", Node: "cmp-1.example", DriverVersion: "550.54.16", Hypervisor: "QEMU",
		GPUs: []protocol.GPU{
			{PCI: "0000:3b:00.0", UtilPercent: &util, Types: []protocol.VGPUType{{ID: "nvidia-230", Name: "GRID T4-1Q"}},
				Active: []protocol.VGPU{
					{MdevUUID: "4b20d080-1b54-4048-85b3-a6a62d165c01", TypeID: "nvidia-230", InstanceUUID: "8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e", Owner: protocol.OwnerAgent},
					{MdevUUID: "9f2c6d1e-0c1a-4f7b-8e3d-2a5b6c7d8e9f", TypeID: "nvidia-230", Owner: "nova"},
				}},
			{PCI: "0000:d8:00.0"},
			{PCI: "0000:c1:00.0", VendorVFIO: true, Active: []protocol.VGPU{{PCI: "0000:c1:00.4", TypeID: "1429", Owner: protocol.OwnerAgent}}},
		}, Errors: []string{"libvirt: connection refused"}}
	raw, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	got, err := leanReport(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := protocol.Report{Node: full.Node, Errors: full.Errors, GPUs: []protocol.GPU{
		{PCI: full.GPUs[0].PCI, Active: full.GPUs[0].Active},
		{PCI: full.GPUs[1].PCI},
		{PCI: full.GPUs[2].PCI, VendorVFIO: true, Active: full.GPUs[2].Active},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("leanReport:\n got %+v\nwant %+v", got, want)
	}
	if _, err := leanReport([]byte(`{"gpus": 3}`)); err == nil {
		t.Error("a report whose gpus is not a list decoded without error")
	}
}
