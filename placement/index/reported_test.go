package index_test

import (
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/placement/index"
)

// TestReportedTypes: a GPU whose provider has no type trait takes the type
// its agent reports, only while no trait says otherwise, and loses it when
// the report stops saying it; placements follow.
func TestReportedTypes(t *testing.T) {
	const t4q = "CUSTOM_NVIDIA_232"
	inv := map[string]engine.Inventory{"VGPU": {Total: 4, MaxUnit: 4, MinUnit: 1, StepSize: 1, AllocationRatio: 1}}
	ps := []engine.Provider{
		{UUID: "r1", Name: "cmp1", RootUUID: "r1"},
		{UUID: "g1", Name: "cmp1_pci_0000_3b_00_0", RootUUID: "r1", ParentUUID: "r1", Inventory: inv},
		{UUID: "g2", Name: "cmp1_pci_0000_d8_00_0", RootUUID: "r1", ParentUUID: "r1", Inventory: inv, Traits: []string{"CUSTOM_NVIDIA_233"}},
	}
	x := index.New(index.Config{})
	x.Load(ps)
	e := &engine.Engine{}
	place := func() []string {
		t.Helper()
		cs, err := x.Decide(e, engine.Request{Required: []string{t4q}})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range cs {
			if !c.NeedsRetype {
				out = append(out, c.GPU.UUID)
			}
		}
		return out
	}
	if got := place(); len(got) != 0 {
		t.Fatalf("untyped GPU placed on before any report: %v", got)
	}

	x.SetReportedTypes(map[string]string{"cmp1_pci_0000_3b_00_0": t4q, "cmp1_pci_0000_d8_00_0": t4q})
	if got := place(); len(got) != 1 || got[0] != "g1" {
		t.Errorf("with the reports: placed on %v, want g1 only (g2's own trait wins over its report)", got)
	}
	g1, _ := x.Lookup("g1")
	if !g1.TypeFromReport || len(g1.Types) != 1 || g1.Types[0] != t4q {
		t.Errorf("g1 = %+v, want typed %s from the report", g1, t4q)
	}
	if g2, _ := x.Lookup("g2"); g2.TypeFromReport || len(g2.Types) != 1 || g2.Types[0] != "CUSTOM_NVIDIA_233" {
		t.Errorf("g2 = %+v, want its own trait only", g2)
	}

	// An update of the provider keeps the learned type.
	p := ps[1]
	p.Generation = 2
	x.Apply(p)
	if got := place(); len(got) != 1 || got[0] != "g1" {
		t.Errorf("after an update: placed on %v, want g1", got)
	}

	// The trait arrives in Placement: it is the GPU's own type now.
	p.Traits = []string{t4q}
	x.Apply(p)
	if g1, _ := x.Lookup("g1"); g1.TypeFromReport || len(g1.Traits) != 1 {
		t.Errorf("g1 with its own trait = %+v", g1)
	}

	// Without the trait and the report, the GPU is untyped again.
	p.Traits = nil
	x.Apply(p)
	x.SetReportedTypes(map[string]string{})
	if got := place(); len(got) != 0 {
		t.Errorf("after the report went: placed on %v", got)
	}
	if x.Size(t4q) != 0 {
		t.Errorf("bucket of %s holds %d GPUs, want 0", t4q, x.Size(t4q))
	}
}
