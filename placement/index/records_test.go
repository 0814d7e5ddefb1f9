package index_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"unsafe"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/placement/index"
)

// TestLoadRecordsShares: records whose traits are one slice, in any
// order, make the index providers would; the index keeps one sorted copy
// of each set of traits, shared by its hosts and GPUs (a GPU's types are
// part of its traits), leaves the records' slices as they were, and an
// append to a GPU's traits does not reach the others.
func TestLoadRecordsShares(t *testing.T) {
	hostTraits := []string{"HW_CPU_X86_AVX2", "COMPUTE_NODE", "CUSTOM_ZONE_A"}
	gpuTraits := []string{"CUSTOM_NVLINK", "CUSTOM_NVIDIA_232", "CUSTOM_FAST"}
	inv := engine.Inventory{Total: 4, MinUnit: 1, MaxUnit: 4, StepSize: 1, AllocationRatio: 1}
	var rs []index.Record
	var ps []engine.Provider
	for h := range 20 {
		root := fmt.Sprintf("root-%02d", h)
		rs = append(rs, index.Record{UUID: root, Name: fmt.Sprintf("node-%02d", h), RootUUID: root, Traits: hostTraits})
		ps = append(ps, engine.Provider{UUID: root, Name: fmt.Sprintf("node-%02d", h), RootUUID: root, Traits: slices.Clone(hostTraits),
			Inventory: map[string]engine.Inventory{"VCPU": {Total: 8}}})
		for g := range 4 {
			u, n := fmt.Sprintf("gpu-%02d-%d", h, g), fmt.Sprintf("node-%02d_pci_0000_%02x_00_0", h, g)
			rs = append(rs, index.Record{UUID: u, Name: n, RootUUID: root, Generation: g, Traits: gpuTraits, Class: "VGPU", Inventory: inv, Used: g})
			ps = append(ps, engine.Provider{UUID: u, Name: n, RootUUID: root, ParentUUID: root, Generation: g, Traits: slices.Clone(gpuTraits),
				Inventory: map[string]engine.Inventory{"VGPU": inv}, Usages: map[string]int{"VGPU": g}})
		}
	}
	x, y := index.New(index.Config{}), index.New(index.Config{})
	x.LoadRecords(rs)
	y.Load(ps)
	gpus := x.GPUs()
	if want := y.GPUs(); !reflect.DeepEqual(gpus, want) {
		t.Fatalf("records load %+v\nproviders load %+v", gpus, want)
	}
	if !slices.Equal(hostTraits, []string{"HW_CPU_X86_AVX2", "COMPUTE_NODE", "CUSTOM_ZONE_A"}) || gpuTraits[0] != "CUSTOM_NVLINK" {
		t.Errorf("the records' traits were written: %v %v", hostTraits, gpuTraits)
	}
	first := gpus[0]
	if !slices.Equal(first.Traits, []string{"CUSTOM_FAST", "CUSTOM_NVIDIA_232", "CUSTOM_NVLINK"}) || !slices.Equal(first.Types, []string{"CUSTOM_NVIDIA_232"}) {
		t.Fatalf("GPU traits %v, types %v", first.Traits, first.Types)
	}
	if unsafe.SliceData(first.Types) != &first.Traits[1] {
		t.Error("a GPU's types are a copy of its traits")
	}
	for _, g := range gpus {
		if unsafe.SliceData(g.Traits) != unsafe.SliceData(first.Traits) || unsafe.SliceData(g.Host.Traits) != unsafe.SliceData(first.Host.Traits) {
			t.Fatalf("GPU %s or its host does not share its traits with GPU %s", g.UUID, first.UUID)
		}
		if unsafe.SliceData(g.Traits) == unsafe.SliceData(gpuTraits) || unsafe.SliceData(g.Host.Traits) == unsafe.SliceData(hostTraits) {
			t.Fatalf("GPU %s keeps a record's traits", g.UUID)
		}
	}
	_ = append(first.Traits, "CUSTOM_MORE")
	_ = append(first.Types, "CUSTOM_NVIDIA_999")
	if g, _ := x.Lookup(gpus[1].UUID); !slices.Equal(g.Traits, []string{"CUSTOM_FAST", "CUSTOM_NVIDIA_232", "CUSTOM_NVLINK"}) {
		t.Errorf("an append to one GPU's traits reached another's: %v", g.Traits)
	}
}

// TestLoadDuplicateUUIDs: providers listed twice make one GPU, as
// upserts in the load's order (host, name, uuid) would leave it: in the
// place of the first, as the last says.
func TestLoadDuplicateUUIDs(t *testing.T) {
	inv := map[string]engine.Inventory{"VGPU": {Total: 8, MinUnit: 1, MaxUnit: 8, StepSize: 1, AllocationRatio: 1}}
	root := func(u, n string) engine.Provider { return engine.Provider{UUID: u, Name: n, RootUUID: u} }
	gpu := func(u, n, r string, used int) engine.Provider {
		return engine.Provider{UUID: u, Name: n, RootUUID: r, ParentUUID: r, Inventory: inv, Usages: map[string]int{"VGPU": used},
			Traits: []string{"CUSTOM_NVIDIA_232"}}
	}
	ps := []engine.Provider{root("r2", "node-b"), root("r1", "node-a"),
		gpu("g1", "node-b_pci_0000_3b_00_0", "r2", 1), gpu("g2", "node-a_pci_0000_3b_00_0", "r1", 2),
		gpu("g1", "node-a_pci_0000_3c_00_0", "r1", 3), gpu("g3", "node-a_pci_0000_3a_00_0", "r1", 4)}
	x := index.New(index.Config{})
	x.Load(ps)
	// The reference: roots, then each GPU applied in the load's order.
	ref := index.New(index.Config{})
	ref.Apply(ps[0])
	ref.Apply(ps[1])
	for _, i := range []int{5, 3, 4, 2} { // node-a: 3a, 3b, 3c; node-b: 3b
		ref.Apply(ps[i])
	}
	got := x.GPUs()
	if want := ref.GPUs(); !reflect.DeepEqual(got, want) {
		t.Errorf("load %+v\nupserts %+v", got, want)
	}
	want := []string{"g3", "g2", "g1"}
	var ids []string
	for _, g := range got {
		ids = append(ids, g.UUID)
	}
	if !slices.Equal(ids, want) || x.Len() != 3 {
		t.Fatalf("GPUs %v (%d), want %v", ids, x.Len(), want)
	}
	if g, _ := x.Lookup("g1"); g.Used != 1 || g.Host.Name != "node-b" || g.ID != 2 {
		t.Errorf("g1 = %+v on %s, want the last record's (node-b, used 1) in the first's place", g, g.Host.Name)
	}
	if !slices.Equal(x.HostGPUs("node-a"), []int32{0, 1}) || !slices.Equal(x.HostGPUs("node-b"), []int32{2}) {
		t.Errorf("hosts' GPUs %v %v", x.HostGPUs("node-a"), x.HostGPUs("node-b"))
	}
	if x.Size("CUSTOM_NVIDIA_232") != 3 {
		t.Errorf("%d GPUs of the type, want 3", x.Size("CUSTOM_NVIDIA_232"))
	}
}

// TestLookupFollowsChanges: GPUs found by uuid (Lookup, SetUsage,
// AddUsage, Len) after random additions, updates and removals are those
// a map would hold.
func TestLookupFollowsChanges(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	inv := map[string]engine.Inventory{"VGPU": {Total: 16, MinUnit: 1, MaxUnit: 16, StepSize: 1, AllocationRatio: 1}}
	x := index.New(index.Config{})
	fleet := randomFleet(r, 10)
	x.Load(fleet)
	model := map[string]int{} // uuid → used
	for _, p := range fleet {
		if _, ok := p.Inventory["VGPU"]; ok {
			model[p.UUID] = p.Usages["VGPU"]
		}
	}
	for step := range 2000 {
		u := fmt.Sprintf("%08x-0000-0000-0000-%012d", r.IntN(300), r.IntN(3))
		switch r.IntN(5) {
		case 0, 1: // a GPU, new or not
			used := r.IntN(17)
			x.Apply(engine.Provider{UUID: u, Name: "gpu-" + u, RootUUID: "root-" + u[:8], Inventory: inv, Usages: map[string]int{"VGPU": used}})
			model[u] = used
		case 2: // no longer a GPU
			x.Apply(engine.Provider{UUID: u, Name: "nic-" + u, RootUUID: "root-" + u[:8]})
			delete(model, u)
		case 3:
			x.Remove(u)
			delete(model, u)
		case 4:
			used, _, ok := x.AddUsage(u, 1)
			if _, known := model[u]; ok != known {
				t.Fatalf("step %d: AddUsage(%s) found %v, want %v", step, u, ok, known)
			} else if ok {
				model[u]++
				if used != model[u] {
					t.Fatalf("step %d: AddUsage(%s) = %d, want %d", step, u, used, model[u])
				}
			}
		}
		if x.Len() != len(model) {
			t.Fatalf("step %d: Len %d, want %d", step, x.Len(), len(model))
		}
	}
	for u, used := range model {
		g, ok := x.Lookup(u)
		if !ok || g.UUID != u || g.Used != used {
			t.Fatalf("Lookup(%s) = %+v, %v; want used %d", u, g, ok, used)
		}
		if !x.SetUsage(u, 0, 9) {
			t.Fatalf("SetUsage(%s) did not find it", u)
		}
	}
	for range 100 {
		u := fmt.Sprintf("%08x-0000-0000-0000-%012d", r.IntN(300), r.IntN(3))
		if _, ok := model[u]; !ok {
			if _, found := x.Lookup(u); found {
				t.Fatalf("Lookup(%s) found a GPU that is gone", u)
			}
		}
	}
}

// TestReportedTypeBeforeItsGPU: a type reported for a GPU the index does
// not hold yet types it when it comes, untyped, and stays known across
// an unchanged report.
func TestReportedTypeBeforeItsGPU(t *testing.T) {
	const t4q = "CUSTOM_NVIDIA_232"
	inv := map[string]engine.Inventory{"VGPU": {Total: 4, MinUnit: 1, MaxUnit: 4, StepSize: 1, AllocationRatio: 1}}
	x := index.New(index.Config{})
	x.Load([]engine.Provider{{UUID: "r1", Name: "cmp1", RootUUID: "r1"},
		{UUID: "g1", Name: "cmp1_pci_0000_3b_00_0", RootUUID: "r1", Inventory: inv}})
	reported := map[string]string{"cmp1_pci_0000_3b_00_0": t4q, "cmp1_pci_0000_d8_00_0": t4q}
	x.SetReportedTypes(reported)
	x.Apply(engine.Provider{UUID: "g2", Name: "cmp1_pci_0000_d8_00_0", RootUUID: "r1", Inventory: inv})
	x.SetReportedTypes(copyMap(reported))
	for _, u := range []string{"g1", "g2"} {
		if g, _ := x.Lookup(u); !g.TypeFromReport || !slices.Equal(g.Types, []string{t4q}) || !slices.Equal(g.Traits, []string{t4q}) {
			t.Errorf("%s = %+v, want typed %s from its report", u, g, t4q)
		}
	}
	if x.Size(t4q) != 2 {
		t.Errorf("%d GPUs of %s, want 2", x.Size(t4q), t4q)
	}
}

func copyMap(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func TestTraitSets(t *testing.T) {
	var s index.TraitSets
	if s.Intern(nil) != nil || s.Intern([]string{}) != nil {
		t.Error("no traits are not nil")
	}
	in := []string{"B", "A", "C"}
	a := s.Intern(in)
	if !slices.Equal(a, []string{"A", "B", "C"}) || cap(a) != len(a) || !slices.Equal(in, []string{"B", "A", "C"}) {
		t.Fatalf("Intern(%v) = %v (cap %d)", in, a, cap(a))
	}
	if b := s.Intern([]string{"A", "B", "C"}); unsafe.SliceData(b) != unsafe.SliceData(a) {
		t.Error("one set, two slices")
	}
	if c := s.Intern([]string{"A", "B"}); slices.Equal(c, a) || len(c) != 2 {
		t.Errorf("Intern(A, B) = %v", c)
	}
	s.Reset()
	if b := s.Intern([]string{"A", "B", "C"}); unsafe.SliceData(b) == unsafe.SliceData(a) || !slices.Equal(b, a) {
		t.Errorf("after Reset: %v", b)
	}
}
