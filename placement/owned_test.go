package placement

import (
	"reflect"
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
		{in: "compute-7/0000:c1:00.0=Mixed", want: OwnedDecl{Host: "compute-7", PCI: "0000:c1:00.0", TypeID: MixedType}},
		{in: "compute-7/0000:c1:00.0=mix", wantErr: true},
		{in: "compute-7/0000:c1:00.0", wantErr: true},                                                                            // no type
		{in: "0000:c1:00.0=1430", wantErr: true},                                                                                 // no host
		{in: "compute-7/=1430", wantErr: true},                                                                                   // no PF
		{in: "compute-7/c1:00=1430", wantErr: true},                                                                              // not a PCI address
		{in: "compute-7/0000:d8:00.0=nvidia-232", want: OwnedDecl{Host: "compute-7", PCI: "0000:d8:00.0", TypeID: "nvidia-232"}}, // an mdev GPU
		{in: "compute-7/0000:d8:00.0=nvidia 232", wantErr: true},                                                                 // not a type id
		{in: "compute-7/0000:d8:00.0=-232", wantErr: true},
		{in: "compute-7/0000:d8:00.0=T4-2Q", wantErr: true},     // a profile name
		{in: "compute-7/0000:c1:00.0=H200X-35C", wantErr: true}, // a profile name
		{in: "compute-7/0000:00:02.0=i915-GVTg_V5_4", want: OwnedDecl{Host: "compute-7", PCI: "0000:00:02.0", TypeID: "i915-GVTg_V5_4"}},
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
	if !reflect.DeepEqual(got, want) {
		t.Errorf("OwnedFromReport = %+v, want %+v", got, want)
	}
	if got := OwnedFromReport(decls, "h3", r); len(got) != 0 {
		t.Errorf("another host's declarations: %+v", got)
	}
}

// TestOwnedFromReportMdev: an mdev GPU declared with an mdev type offers
// the mdevs of the type it can still create and the bridge's mdevs of it
// (the agent's journal holds them), not Nova's; a declaration whose type
// is of the other kind than the GPU's (an mdev type on a VF GPU, a
// numeric type on an mdev GPU) offers nothing.
func TestOwnedFromReportMdev(t *testing.T) {
	r := protocol.Report{Host: "h1", GPUs: []protocol.GPU{
		{PCI: "0000:3b:00.0", Types: []protocol.VGPUType{{ID: "nvidia-231", AvailableInstances: 5}, {ID: "nvidia-232", AvailableInstances: 0}},
			Active: []protocol.VGPU{
				{MdevUUID: "m1", TypeID: "nvidia-231", Owner: protocol.OwnerAgent}, // the bridge's: counted
				{MdevUUID: "m2", TypeID: "nvidia-231", Owner: protocol.OwnerAgent},
				{MdevUUID: "m3", TypeID: "nvidia-231", Owner: protocol.OwnerNova}, // Nova's: not counted
			}},
		{PCI: "0000:c1:00.0", VendorVFIO: true, Types: []protocol.VGPUType{{ID: "1429", AvailableInstances: 2}}},
	}}
	for _, tc := range []struct {
		name string
		decl OwnedDecl
		want []OwnedGPU
	}{
		{"mdev GPU", OwnedDecl{Host: "h1", PCI: "0000:3b:00.0", TypeID: "nvidia-231"},
			[]OwnedGPU{{Node: "h1", PCI: "0000:3b:00.0", Trait: "CUSTOM_NVIDIA_231", Total: 7}}},
		{"mdev GPU, type not creatable", OwnedDecl{Host: "h1", PCI: "0000:3b:00.0", TypeID: "nvidia-232"},
			[]OwnedGPU{{Node: "h1", PCI: "0000:3b:00.0", Trait: "CUSTOM_NVIDIA_232", Total: 0}}},
		{"numeric type on an mdev GPU", OwnedDecl{Host: "h1", PCI: "0000:3b:00.0", TypeID: "1429"}, nil},
		{"mdev type on a VF GPU", OwnedDecl{Host: "h1", PCI: "0000:c1:00.0", TypeID: "nvidia-231"}, nil},
		{"mixed on an mdev GPU", OwnedDecl{Host: "h1", PCI: "0000:3b:00.0", TypeID: MixedType}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := OwnedFromReport([]OwnedDecl{tc.decl}, "h1", r); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("OwnedFromReport(%v) = %+v, want %+v", tc.decl, got, tc.want)
			}
			if got, want := tc.decl.Mdev(), IsMdevType(tc.decl.TypeID) && tc.decl.TypeID != MixedType; got != want {
				t.Errorf("%v.Mdev() = %v", tc.decl, got)
			}
		})
	}
}

// TestOwnedFromReportMixed: a mixed GPU offers its framebuffer (NVML's
// total, or without it the most one of its types fills) less what Nova's
// VFs hold, in MiB, and the traits of every type with a framebuffer; the
// bridge's own VFs are its allocations, not subtracted.
func TestOwnedFromReportMixed(t *testing.T) {
	total := uint64(143771)
	types := []protocol.VGPUType{{ID: "1428", FramebufferMiB: 143360, MaxInstances: 1}, {ID: "1430", FramebufferMiB: 35840, MaxInstances: 4},
		{ID: "1429", FramebufferMiB: 71680, MaxInstances: 2, AvailableInstances: 1}}
	active := []protocol.VGPU{{PCI: "0000:c1:00.4", TypeID: "1429", Owner: protocol.OwnerNova}, {PCI: "0000:c1:00.5", TypeID: "1430", Owner: protocol.OwnerAgent}}
	for _, tc := range []struct {
		name string
		gpu  protocol.GPU
		want []OwnedGPU
	}{
		{"nvml", protocol.GPU{PCI: "0000:c1:00.0", VendorVFIO: true, MemoryTotalMiB: &total, Types: types, Active: active},
			[]OwnedGPU{{Node: "n", PCI: "0000:c1:00.0", Mixed: true, Traits: []string{"CUSTOM_1428", "CUSTOM_1429", "CUSTOM_1430"}, Total: 143771 - 71680}}},
		{"no nvml", protocol.GPU{PCI: "0000:c1:00.0", VendorVFIO: true, Types: types},
			[]OwnedGPU{{Node: "n", PCI: "0000:c1:00.0", Mixed: true, Traits: []string{"CUSTOM_1428", "CUSTOM_1429", "CUSTOM_1430"}, Total: 143360}}},
		{"no framebuffer", protocol.GPU{PCI: "0000:c1:00.0", VendorVFIO: true, Types: []protocol.VGPUType{{ID: "1429"}}}, nil},
		{"not vendor VFIO", protocol.GPU{PCI: "0000:c1:00.0", Types: types}, nil},
	} {
		r := protocol.Report{Host: "h1", Node: "n", GPUs: []protocol.GPU{tc.gpu}}
		got := OwnedFromReport([]OwnedDecl{{Host: "h1", PCI: "0000:c1:00.0", TypeID: MixedType}}, "h1", r)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: OwnedFromReport = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestOwnedTypeTrait(t *testing.T) {
	for _, c := range []struct {
		traits []string
		want   string
	}{
		{[]string{"CUSTOM_1430"}, "CUSTOM_1430"},
		{[]string{"CUSTOM_VGPU_BRIDGE_GPU_FAULT", "CUSTOM_1429"}, "CUSTOM_1429"},
		{[]string{"CUSTOM_NVIDIA_232", "CUSTOM_", "HW_GPU_API_VULKAN"}, ""},
		{nil, ""},
	} {
		if got := OwnedTypeTrait(c.traits); got != c.want {
			t.Errorf("OwnedTypeTrait(%v) = %q, want %q", c.traits, got, c.want)
		}
	}
}
