package placement

import (
	"slices"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

func TestParseOwnedDecl(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    OwnedDecl
		wantErr bool
	}{
		{in: "compute-7/0000:c1:00.0=1430", want: OwnedDecl{Host: "compute-7", PCI: "0000:c1:00.0", TypeID: "1430"}},
		{in: " cn.example.org/0000:C1:00.0=1429 ", want: OwnedDecl{Host: "cn.example.org", PCI: "0000:c1:00.0", TypeID: "1429"}},
		{in: "compute-7/0000:c1:00.0", wantErr: true},            // no type
		{in: "0000:c1:00.0=1430", wantErr: true},                 // no host
		{in: "compute-7/=1430", wantErr: true},                   // no PF
		{in: "compute-7/c1:00=1430", wantErr: true},              // not a PCI address
		{in: "compute-7/0000:c1:00.0=nvidia-232", wantErr: true}, // an mdev type
		{in: "compute-7/0000:c1:00.0=", wantErr: true},
	} {
		got, err := ParseOwnedDecl(tc.in)
		if (err != nil) != tc.wantErr || (err == nil && got != tc.want) {
			t.Errorf("ParseOwnedDecl(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestOwnedFromReport(t *testing.T) {
	decls := []OwnedDecl{{Host: "h1", PCI: "0000:c1:00.0", TypeID: "1429"}, {Host: "h1", PCI: "0000:c2:00.0", TypeID: "1430"},
		{Host: "h2", PCI: "0000:c1:00.0", TypeID: "1429"}}
	r := protocol.Report{Host: "h1", Node: "h1.nodes", GPUs: []protocol.GPU{
		{PCI: "0000:3b:00.0", Types: []protocol.VGPUType{{ID: "nvidia-232", AvailableInstances: 4}}}, // an mdev GPU: not declared
		{PCI: "0000:c1:00.0", VendorVFIO: true,
			Types: []protocol.VGPUType{{ID: "1428", AvailableInstances: 0}, {ID: "1429", AvailableInstances: 1}},
			Active: []protocol.VGPU{
				{PCI: "0000:c1:00.4", TypeID: "1429", Owner: protocol.OwnerNova},  // Nova's: not counted
				{PCI: "0000:c1:00.5", TypeID: "1429", Owner: protocol.OwnerAgent}, // the bridge's: counted
			}},
		{PCI: "0000:c2:00.0", VendorVFIO: true, Types: []protocol.VGPUType{{ID: "1429", AvailableInstances: 2}}}, // 1430 not creatable
	}}
	got := OwnedFromReport(decls, "h1", r)
	want := []OwnedGPU{
		{Node: "h1.nodes", PCI: "0000:c1:00.0", Trait: "CUSTOM_1429", Total: 2},
		{Node: "h1.nodes", PCI: "0000:c2:00.0", Trait: "CUSTOM_1430", Total: 0},
	}
	if !slices.Equal(got, want) {
		t.Errorf("OwnedFromReport = %+v, want %+v", got, want)
	}
	if got := OwnedFromReport(decls, "h3", r); len(got) != 0 {
		t.Errorf("another host's declarations: %+v", got)
	}
}
