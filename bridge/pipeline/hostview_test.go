package pipeline

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

// TestHostSetFromReports: the host view reads of each stored report only
// what it uses (hostReport), and makes of it what HostFromReport makes of
// the whole report; the guests' drivers are found by instance UUID in any
// case; a report that does not decode is left out; strings that repeat
// across hosts are one string.
func TestHostSetFromReports(t *testing.T) {
	util := 37.5
	t4 := []protocol.VGPUType{{ID: "nvidia-231", Name: "GRID T4-2Q", FramebufferMiB: 2048, MaxInstances: 8, AvailableInstances: 6},
		{ID: "nvidia-232", Name: "GRID T4-4Q", FramebufferMiB: 4096, MaxInstances: 4, AvailableInstances: 4}}
	inst1, inst2, inst3 := uuid.NewString(), uuid.NewString(), uuid.NewString()
	reports := []struct {
		name string
		r    protocol.Report
	}{
		{"cmp1", protocol.Report{Host: "cmp1", Node: "cmp1.example.org", AgentVersion: "1.4.0", DriverVersion: "550.90.05",
			Hypervisor: "KVM (QEMU 8.2.2)", GPUs: []protocol.GPU{
				{PCI: "0000:3b:00.0", UUID: "GPU-1", Name: "Tesla T4", Types: t4, Health: protocol.HealthOK, UtilPercent: &util,
					Active: []protocol.VGPU{
						{MdevUUID: uuid.NewString(), TypeID: "nvidia-231", InstanceUUID: strings.ToUpper(inst1), Owner: protocol.OwnerNova, GuestDriver: "550.90.07"},
						{MdevUUID: uuid.NewString(), TypeID: "nvidia-231", InstanceUUID: inst2, Owner: protocol.OwnerAgent}, // no driver reported
					}},
				{PCI: "0000:3c:00.0", Types: t4},
				{PCI: "0000:3d:00.0", Types: []protocol.VGPUType{{ID: "nvidia-999", Name: "not a profile"}},
					Active: []protocol.VGPU{{TypeID: "nvidia-999", InstanceUUID: "not-a-uuid", GuestDriver: "1.0"}}},
				{PCI: "0000:3e:00.0", Types: t4, Active: []protocol.VGPU{{TypeID: "nvidia-232", InstanceUUID: inst3, GuestDriver: "550.90.07"}}},
			}}},
		{"cmp2", protocol.Report{Host: "cmp2", DriverVersion: "550.90.05", GPUs: []protocol.GPU{
			{PCI: "0000:3b:00.0", Types: t4, Active: []protocol.VGPU{{TypeID: "nvidia-230"}}}, // a type it does not offer: the catalog's
		}}},
		{"cmp3", protocol.Report{Host: "cmp3"}}, // no GPUs
	}
	cat := catalog.New()
	if _, err := cat.Observe("nvidia-230", "GRID T4-1Q", 16); err != nil {
		t.Fatal(err)
	}
	hs := &hostSet{byName: map[string]int{}, guest: map[uuid.UUID]string{}}
	hr := newHostReader(cat)
	for _, rep := range reports {
		raw, err := json.Marshal(rep.r)
		if err != nil {
			t.Fatal(err)
		}
		hs.add(hr, rep.name, raw)
	}
	hs.add(hr, "broken", []byte(`{"gpus": 1}`))
	if len(hs.hosts) != len(reports) {
		t.Fatalf("%d hosts, want %d", len(hs.hosts), len(reports))
	}
	for i, rep := range reports {
		want := HostFromReport(rep.r, cat)
		if got := hs.hosts[hs.byName[rep.name]]; !reflect.DeepEqual(got, want) {
			t.Errorf("host %d:\n got %+v\nwant %+v", i, got, want)
		}
	}
	if _, ok := hs.byName["broken"]; ok {
		t.Error("a report that does not decode is in the view")
	}
	if g := hs.hosts[0].GPUs[0]; g.Model != "T4" || g.Profile != "T4-2Q" || g.Used != 2 || g.Capacity != 8 || g.Utilization != util {
		t.Errorf("GPU %+v", g)
	}
	if g := hs.hosts[1].GPUs[0]; g.Profile != "T4-1Q" || g.Capacity != 16 {
		t.Errorf("GPU %+v: no profile from the catalog", g)
	}
	for id, want := range map[string]string{inst1: "550.90.07", inst2: "", inst3: "550.90.07"} {
		if got := hs.guest[uuid.MustParse(id)]; got != want {
			t.Errorf("guest driver of %s: %q, want %q", id, got, want)
		}
	}
	if len(hs.guest) != 2 {
		t.Errorf("guest drivers %v", hs.guest)
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	if a, b := hs.hosts[0].GPUs[0].Address, hs.hosts[1].GPUs[0].Address; a != b || !same(a, b) {
		t.Errorf("address %q of two hosts is two strings", a)
	}
	if a, b := hs.hosts[0].DriverVersion, hs.hosts[1].DriverVersion; !same(a, b) {
		t.Errorf("driver %q of two hosts is two strings", a)
	}
	if a, b := hs.hosts[0].GPUs[1].Model, hs.hosts[0].GPUs[3].Model; !same(a, b) {
		t.Errorf("model %q of two GPUs is two strings", a)
	}
}
