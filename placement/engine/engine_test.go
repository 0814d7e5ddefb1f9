package engine_test

import (
	"errors"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/placement/index"
)

const (
	t4q4 = "CUSTOM_NVIDIA_232" // T4-4Q
	t4q2 = "CUSTOM_NVIDIA_231" // T4-2Q
	a16  = "CUSTOM_NVIDIA_700"
)

func gpu(uuid, name, root, trait string, total, reserved, used int) engine.Provider {
	return engine.Provider{
		UUID: uuid, Name: name, RootUUID: root, ParentUUID: root, Traits: []string{trait},
		Inventory: map[string]engine.Inventory{"VGPU": {Total: total, Reserved: reserved, MinUnit: 1, MaxUnit: total, StepSize: 1, AllocationRatio: 1}},
		Usages:    map[string]int{"VGPU": used},
	}
}

func fleet() *index.Index {
	x := index.New(index.Config{})
	x.Load([]engine.Provider{
		{UUID: "r1", Name: "cn1", RootUUID: "r1"},
		{UUID: "r2", Name: "cn2", RootUUID: "r2", Traits: []string{"COMPUTE_STATUS_DISABLED"}},
		{UUID: "r3", Name: "cn3", RootUUID: "r3"},
		gpu("g1a", "cn1_pci_0000_84_00_0", "r1", t4q4, 4, 0, 3), // 1 free
		gpu("g1b", "cn1_pci_0000_85_00_0", "r1", t4q4, 4, 0, 0), // 4 free
		gpu("g2a", "cn2_pci_0000_84_00_0", "r2", t4q4, 4, 0, 0), // disabled host
		gpu("g3a", "cn3_pci_0000_84_00_0", "r3", t4q4, 4, 1, 1), // 2 free
		gpu("g3b", "cn3_pci_0000_85_00_0", "r3", t4q2, 8, 0, 0), // empty, other type
		gpu("g3c", "cn3_pci_0000_86_00_0", "r3", a16, 4, 0, 0),  // empty, other model
	})
	return x
}

func retype(from, to string, count int) (int, bool) {
	if from == a16 || to == a16 {
		return 0, false
	}
	return 4, count <= 4
}

func TestDecide(t *testing.T) {
	x := fleet()
	e := &engine.Engine{Retype: retype}
	tests := []struct {
		name string
		req  engine.Request
		want []string // provider uuids; "~" prefix marks needs_retype
	}{
		{"pack fills the fullest", engine.Request{Required: []string{t4q4}, Limit: 10}, []string{"g1a", "g3a", "g1b", "g2a"}},
		{"spread takes the emptiest", engine.Request{Required: []string{t4q4}, Strategy: engine.Spread, Limit: 10}, []string{"g1b", "g2a", "g3a", "g1a"}},
		{"count 2 skips GPUs without room", engine.Request{Required: []string{t4q4}, Count: 2, Limit: 10}, []string{"g3a", "g1b", "g2a"}},
		{"forbidden host trait", engine.Request{Required: []string{t4q4}, Forbidden: []string{"COMPUTE_STATUS_DISABLED"}, Limit: 10}, []string{"g1a", "g3a", "g1b"}},
		{"host restriction", engine.Request{Required: []string{t4q4}, Hosts: []string{"cn3"}}, []string{"g3a"}},
		{"excluded GPU and host", engine.Request{Required: []string{t4q4}, ExcludeGPUs: []string{"g1a"}, ExcludeHosts: []string{"cn2"}, Limit: 10}, []string{"g3a", "g1b"}},
		{"limit", engine.Request{Required: []string{t4q4}, Limit: 1}, []string{"g1a"}},
		{"retype after direct ones", engine.Request{Required: []string{t4q4}, Count: 3, AllowRetype: true, Limit: 10}, []string{"g1b", "g2a", "~g3b"}},
		{"no retype unless allowed", engine.Request{Required: []string{t4q4}, Count: 4, Hosts: []string{"cn3"}}, nil},
		{"retype only to the same model", engine.Request{Required: []string{a16}, Count: 1, AllowRetype: true, Limit: 10}, []string{"g3c"}},
		{"untyped request sees all GPUs", engine.Request{Count: 8, Limit: 10}, []string{"g3b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := x.Decide(e, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, c := range got {
				id := c.GPU.UUID
				if c.NeedsRetype {
					id = "~" + id
				}
				ids = append(ids, id)
			}
			if len(ids) != len(tt.want) {
				t.Fatalf("got %v, want %v", ids, tt.want)
			}
			for i := range ids {
				if ids[i] != tt.want[i] {
					t.Fatalf("got %v, want %v", ids, tt.want)
				}
			}
		})
	}
}

func TestTimeSlicedOneTypePerGPU(t *testing.T) {
	x := index.New(index.Config{})
	p := gpu("g", "cn_pci_0000_01_00_0", "r", t4q4, 4, 0, 1)
	p.Traits = []string{t4q4, t4q2} // two types enabled: the active one is unknown while busy
	x.Load([]engine.Provider{{UUID: "r", Name: "cn", RootUUID: "r"}, p})
	e := &engine.Engine{}
	got, _ := x.Decide(e, engine.Request{Required: []string{t4q4}})
	if len(got) != 0 {
		t.Fatalf("busy two-typed GPU offered: %+v", got)
	}
	x.SetUsage("g", 0, 2)
	got, _ = x.Decide(e, engine.Request{Required: []string{t4q2}})
	if len(got) != 1 {
		t.Fatalf("empty two-typed GPU not offered: %+v", got)
	}
}

func TestInvalidRequests(t *testing.T) {
	e := &engine.Engine{}
	x := fleet()
	for _, r := range []engine.Request{
		{Count: -1},
		{Limit: engine.MaxLimit + 1},
		{Strategy: "random"},
		{Required: []string{"X"}, Forbidden: []string{"X"}},
		{Required: []string{t4q4, t4q2}},
	} {
		if _, err := x.Decide(e, r); !errors.Is(err, engine.ErrInvalidRequest) {
			t.Errorf("Decide(%+v) = %v, want ErrInvalidRequest", r, err)
		}
	}
}

func TestCapacityAndUnits(t *testing.T) {
	tests := []struct {
		inv  engine.Inventory
		used int
		n    int
		want bool
	}{
		{engine.Inventory{Total: 16, MaxUnit: 16, StepSize: 1, AllocationRatio: 1}, 15, 1, true},
		{engine.Inventory{Total: 16, MaxUnit: 16, StepSize: 1, AllocationRatio: 1}, 16, 1, false},
		{engine.Inventory{Total: 16, Reserved: 4, MaxUnit: 16, StepSize: 1, AllocationRatio: 1}, 12, 1, false},
		{engine.Inventory{Total: 4, MaxUnit: 4, StepSize: 1, AllocationRatio: 1.5}, 5, 1, true},
		{engine.Inventory{Total: 4, MaxUnit: 4, StepSize: 1, AllocationRatio: 1.5}, 6, 1, false},
		{engine.Inventory{Total: 8, MaxUnit: 2, StepSize: 1, AllocationRatio: 1}, 0, 3, false},
		{engine.Inventory{Total: 8, MaxUnit: 8, StepSize: 2, AllocationRatio: 1}, 0, 3, false},
		{engine.Inventory{Total: 8, MinUnit: 2, MaxUnit: 8, StepSize: 1, AllocationRatio: 1}, 0, 1, false},
		{engine.Inventory{Total: 10, MaxUnit: 10, StepSize: 1, AllocationRatio: 1.1}, 10, 1, true},
	}
	for _, tt := range tests {
		g := engine.GPU{Inventory: tt.inv, Used: tt.used}
		if got := g.Fits(tt.n); got != tt.want {
			t.Errorf("%+v used %d: Fits(%d) = %v, want %v", tt.inv, tt.used, tt.n, got, tt.want)
		}
	}
}

func TestPCIAddress(t *testing.T) {
	for name, want := range map[string]string{
		"compute1_pci_0000_84_00_0":     "0000:84:00.0",
		"host.example_pci_0000_3b_00_4": "0000:3b:00.4",
		"compute1":                      "",
		"x_pci_0000_zz_00_0":            "",
		"compute1_0000:C1:00.0":         "0000:c1:00.0", // Nova's PCI tracker's provider of a PF
		"compute1_0000:C1:00":           "",
		"compute1_0000-C1:00.0":         "",
		"compute1_0000:G1:00.0":         "",
	} {
		if got := engine.PCIAddress(name); got != want {
			t.Errorf("PCIAddress(%q) = %q, want %q", name, got, want)
		}
	}
}
