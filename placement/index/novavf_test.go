package index_test

import (
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/placement/index"
)

// TestNovaVFClassTypes: a provider Nova's PCI tracker made for a PF's VFs
// (class CUSTOM_VGPU_VF_1430, traits COMPUTE_MANAGED_PCI_DEVICE and
// CUSTOM_1430, which is not under the type prefix) is a GPU of the type
// its class maps to, never a type learned from a report (the bridge must
// not write traits to Nova's provider), and keeps it across reports; a
// request excluding its class never lands on it.
func TestNovaVFClassTypes(t *testing.T) {
	const class, trait = "CUSTOM_VGPU_VF_1430", "CUSTOM_1430"
	tests := []struct {
		name   string
		traits []string // the provider's, in Placement
	}{
		{"device_spec with the type trait", []string{"COMPUTE_MANAGED_PCI_DEVICE", trait}},
		{"device_spec without traits", []string{"COMPUTE_MANAGED_PCI_DEVICE"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv := map[string]engine.Inventory{class: {Total: 8, MaxUnit: 1, MinUnit: 1, StepSize: 1, AllocationRatio: 1}}
			ps := []engine.Provider{
				{UUID: "r1", Name: "cmp1", RootUUID: "r1"},
				{UUID: "p1", Name: "cmp1_0000:C1:00.0", RootUUID: "r1", ParentUUID: "r1", Inventory: inv, Traits: tc.traits,
					Usages: map[string]int{class: 3}},
			}
			x := index.New(index.Config{Classes: []string{"VGPU", class}, ClassTypes: map[string]string{class: trait}})
			x.Load(ps)
			check := func(when string) {
				t.Helper()
				g, ok := x.Lookup("p1")
				if !ok {
					t.Fatalf("%s: Nova's PCI provider is not a GPU", when)
				}
				if g.Class != class || g.Used != 3 || g.Capacity() != 8 || len(g.Types) != 1 || g.Types[0] != trait || g.TypeFromReport {
					t.Errorf("%s: GPU %+v, want class %s, 3 of 8 used, typed %s not from a report", when, g, class, trait)
				}
			}
			check("loaded")
			x.SetReportedTypes(map[string]string{"cmp1_pci_0000_c1_00_0": "CUSTOM_1429"})
			check("after a report")
			x.Apply(ps[1])
			check("after an update")

			e := &engine.Engine{}
			for _, ex := range [][]string{nil, {class}} {
				cs, err := x.Decide(e, engine.Request{Required: []string{trait}, ExcludeClasses: ex})
				if err != nil {
					t.Fatal(err)
				}
				if want := len(ex) == 0; (len(cs) == 1) != want {
					t.Errorf("excluding %v: candidates %d, want %v", ex, len(cs), want)
				}
			}
		})
	}
}
