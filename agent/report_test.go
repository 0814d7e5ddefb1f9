package agent

import (
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/inventory"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

// TestToReportFault: a faulted GPU goes to the bridge as "failed" with
// its fault; a healthy one keeps its health and no fault.
func TestToReportFault(t *testing.T) {
	inv := &inventory.Inventory{Host: "h1", GPUs: []inventory.GPU{
		{Addr: pci.MustParse("0000:3b:00.0"), Health: "failed", Mode: "mdev",
			Fault: &gpu.Fault{Source: gpu.FaultXid, Xid: 79, Reason: "Xid 79: GPU has fallen off the bus"}},
		{Addr: pci.MustParse("0000:5e:00.0"), Health: "ok", Mode: "mdev"},
	}}
	rep := ToReport(inv, nil)
	tests := []struct {
		pci, health string
		fault       *protocol.GPUFault
	}{
		{"0000:3b:00.0", protocol.HealthFailed, &protocol.GPUFault{Source: "xid", Xid: 79, Reason: "Xid 79: GPU has fallen off the bus"}},
		{"0000:5e:00.0", protocol.HealthOK, nil},
	}
	for i, tt := range tests {
		g := rep.GPUs[i]
		if g.PCI != tt.pci || g.Health != tt.health {
			t.Errorf("GPU %d: %s %s, want %s %s", i, g.PCI, g.Health, tt.pci, tt.health)
		}
		switch {
		case tt.fault == nil && g.Fault != nil:
			t.Errorf("%s: fault %+v, want none", g.PCI, *g.Fault)
		case tt.fault != nil && (g.Fault == nil || *g.Fault != *tt.fault):
			t.Errorf("%s: fault %+v, want %+v", g.PCI, g.Fault, *tt.fault)
		}
	}
}
