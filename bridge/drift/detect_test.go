package drift

import (
	"reflect"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

const (
	instA = "11111111-1111-1111-1111-111111111111"
	instB = "22222222-2222-2222-2222-222222222222"
	mdev1 = "aaaaaaaa-0000-0000-0000-000000000001"
	mdev2 = "aaaaaaaa-0000-0000-0000-000000000002"
	provA = "bbbbbbbb-0000-0000-0000-00000000000a"
	pciA  = "0000:3b:00.0"
)

func base(now time.Time) *Snapshot {
	return &Snapshot{
		Now:         now,
		Hosts:       map[string]HostView{"h1": {Name: "h1", Node: "n1", ReportAt: now, Fresh: true, Report: protocol.Report{GPUs: []protocol.GPU{{PCI: pciA}}}}},
		GPUs:        []GPUView{{Provider: provA, Host: "h1", Node: "n1", PCI: pciA, Class: "VGPU"}},
		Allocations: map[string]map[string]int{provA: {}},
		Unread:      map[string]bool{},
		Made:        map[string]bool{},
		Instances:   map[string]InstanceView{instA: {Known: true, Host: "h1"}},
	}
}

func TestDetect(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	att := AttachmentView{ID: mdev1, Instance: instA, Host: "h1", Provider: provA, PCI: pciA, Class: "VGPU", Amount: 1, State: flow.AttAttached, UpdatedAt: now.Add(-time.Minute)}
	active := func(s *Snapshot, v ...protocol.VGPU) {
		h := s.Hosts["h1"]
		h.Report.GPUs[0].Active = v
		s.Hosts["h1"] = h
	}
	type want struct {
		kind       Kind
		repairable bool
		amount     int
	}
	tests := []struct {
		name  string
		setup func(s *Snapshot)
		want  []want
	}{
		{"in agreement", func(s *Snapshot) {
			s.Attachments = []AttachmentView{att}
			s.Allocations[provA][instA] = 1
			active(s, protocol.VGPU{MdevUUID: mdev1, InstanceUUID: instA, Owner: protocol.OwnerAgent})
		}, nil},
		{"orphan mdev, free", func(s *Snapshot) {
			active(s, protocol.VGPU{MdevUUID: mdev2, Owner: protocol.OwnerAgent})
		}, []want{{OrphanMdev, true, 0}}},
		{"orphan mdev in a domain is reported only", func(s *Snapshot) {
			s.Allocations[provA][instA] = 0
			active(s, protocol.VGPU{MdevUUID: mdev2, InstanceUUID: instA, Owner: protocol.OwnerAgent})
		}, []want{{OrphanMdev, false, 0}}},
		{"nova's mdevs are not orphans", func(s *Snapshot) {
			active(s, protocol.VGPU{MdevUUID: mdev2, Owner: protocol.OwnerNova})
		}, nil},
		{"missing device", func(s *Snapshot) {
			s.Attachments = []AttachmentView{att}
			s.Allocations[provA][instA] = 1
		}, []want{{MissingDevice, false, 0}}},
		{"a bridge-owned VF GPU's vGPU is found by its VF", func(s *Snapshot) {
			a := att
			a.Class, a.PCI = placement.BridgeClass, "0000:c1:00.5"
			s.Attachments = []AttachmentView{a}
			s.GPUs[0].Class = placement.BridgeClass
			s.Allocations[provA][instA] = 1
			active(s, protocol.VGPU{PCI: "0000:c1:00.5", TypeID: "1429", InstanceUUID: instA, Owner: protocol.OwnerAgent})
		}, nil},
		{"a bridge-owned VF GPU's vGPU missing from the report", func(s *Snapshot) {
			a := att
			a.Class, a.PCI = placement.BridgeClass, "0000:c1:00.5"
			s.Attachments = []AttachmentView{a}
			s.GPUs[0].Class = placement.BridgeClass
			s.Allocations[provA][instA] = 1
			active(s, protocol.VGPU{PCI: "0000:c1:00.6", TypeID: "1429", InstanceUUID: instA, Owner: protocol.OwnerAgent})
		}, []want{{MissingDevice, false, 0}}},
		{"a mixed GPU's vGPU is found by its VF; its unmirrored claim is not compared", func(s *Snapshot) {
			a := att
			a.Class, a.PCI, a.Provider = placement.BridgeFBClass, "0000:c1:00.5", "bbbbbbbb-0000-0000-0000-00000000000f"
			s.Attachments = []AttachmentView{a}
			active(s, protocol.VGPU{PCI: "0000:c1:00.5", TypeID: "1430", InstanceUUID: instA, Owner: protocol.OwnerAgent})
		}, nil},
		{"a mixed GPU's vGPU missing from the report", func(s *Snapshot) {
			a := att
			a.Class, a.PCI, a.Provider = placement.BridgeFBClass, "0000:c1:00.5", "bbbbbbbb-0000-0000-0000-00000000000f"
			s.Attachments = []AttachmentView{a}
		}, []want{{MissingDevice, false, 0}}},
		{"report older than the attach is not judged", func(s *Snapshot) {
			a := att
			a.UpdatedAt = now.Add(time.Minute)
			s.Attachments = []AttachmentView{a}
			s.Allocations[provA][instA] = 1
		}, nil},
		{"stale host is not judged", func(s *Snapshot) {
			h := s.Hosts["h1"]
			h.Fresh = false
			s.Hosts["h1"] = h
			active(s, protocol.VGPU{MdevUUID: mdev2, Owner: protocol.OwnerAgent})
		}, nil},
		{"stale claim of a deleted instance, the bridge's", func(s *Snapshot) {
			s.Attachments = []AttachmentView{att}
			s.Allocations[provA][instA] = 1
			s.Instances[instA] = InstanceView{Known: true, Deleted: true}
			active(s, protocol.VGPU{MdevUUID: mdev1, Owner: protocol.OwnerAgent})
		}, []want{{StaleClaim, true, 1}}},
		{"claim of a deleted instance the bridge did not make", func(s *Snapshot) {
			s.Allocations[provA][instA] = 1
			s.Instances[instA] = InstanceView{Known: true, Deleted: true, VGPUs: 1}
		}, []want{{StaleClaim, false, 0}}},
		{"excess claim the bridge made", func(s *Snapshot) {
			s.Allocations[provA][instA] = 1
			s.Made[instA+"|"+provA] = true
		}, []want{{StaleClaim, true, 1}}},
		{"flavor units are Nova's", func(s *Snapshot) {
			s.Allocations[provA][instA] = 1
			s.Instances[instA] = InstanceView{Known: true, Host: "h1", VGPUs: 1}
		}, nil},
		{"unclaimed device", func(s *Snapshot) {
			s.Attachments = []AttachmentView{att}
			active(s, protocol.VGPU{MdevUUID: mdev1, InstanceUUID: instA, Owner: protocol.OwnerAgent})
		}, []want{{UnclaimedDevice, false, 0}}},
		{"unknown instance in Placement and on the host", func(s *Snapshot) {
			s.Allocations[provA][instB] = 1
			active(s, protocol.VGPU{MdevUUID: mdev2, InstanceUUID: instB, Owner: protocol.OwnerNova})
		}, []want{{UnknownInstance, false, 0}, {UnknownInstance, false, 0}}},
		{"nova's migration consumer during a move is not reported", func(s *Snapshot) {
			s.Allocations[provA][instB] = 1
			s.Transient = map[string]string{instB: TransientMigration}
		}, nil},
		{"a vGPU kept on the source of a move awaiting its confirm is not reported", func(s *Snapshot) {
			// Its mdev in the source's shut-off guest, its claim in Nova's
			// migration consumer; the instance is on another host.
			kept := att
			kept.State = flow.AttKept
			s.Attachments = []AttachmentView{kept}
			s.Instances[instA] = InstanceView{Known: true, Host: "h2"}
			s.Allocations[provA][instB] = 1
			s.Transient = map[string]string{instB: TransientMigration}
			active(s, protocol.VGPU{MdevUUID: mdev1, InstanceUUID: instA, Owner: protocol.OwnerAgent})
		}, nil},
		{"the mdev of a vGPU kept for a move of a deleted instance is an orphan", func(s *Snapshot) {
			kept := att
			kept.State = flow.AttKept
			s.Attachments = []AttachmentView{kept}
			s.Instances[instA] = InstanceView{Known: true, Deleted: true}
			active(s, protocol.VGPU{MdevUUID: mdev1, Owner: protocol.OwnerAgent})
		}, []want{{OrphanMdev, true, 0}}},
		{"the bridge's reservation for a move is not reported", func(s *Snapshot) {
			s.Allocations[provA][instB] = 1
			s.Transient = map[string]string{instB: TransientReservation}
		}, nil},
		{"a transient mark on another consumer hides nothing", func(s *Snapshot) {
			s.Allocations[provA][instB] = 1
			s.Transient = map[string]string{mdev2: TransientMigration}
		}, []want{{UnknownInstance, false, 0}}},
		{"unread provider is not judged", func(s *Snapshot) {
			delete(s.Allocations, provA)
			s.Unread[provA] = true
			s.Attachments = []AttachmentView{att}
			active(s, protocol.VGPU{MdevUUID: mdev1, InstanceUUID: instA, Owner: protocol.OwnerAgent})
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := base(now)
			tc.setup(s)
			var got []want
			for _, f := range Detect(s) {
				w := want{f.Kind, f.Repairable, 0}
				if f.Repair != nil {
					w.amount = f.Repair.Amount
				}
				if f.Detail == "" {
					t.Errorf("%s without detail", f.Kind)
				}
				got = append(got, w)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestDetectOrphanVF: on a bridge-owned VF GPU, a typed VF in no domain
// that no live vGPU of the bridge holds is an orphan naming the VF,
// repairable when the agent's journal holds it; never on a GPU of another
// class (Nova's), a VF in a domain or held by an attachment, nor while
// libvirt did not answer the agent.
func TestDetectOrphanVF(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const vf, vf2 = "0000:3b:00.4", "0000:3b:00.5"
	vfGPU := func(s *Snapshot, class string, v ...protocol.VGPU) {
		h := s.Hosts["h1"]
		h.Report.GPUs[0].VendorVFIO = true
		h.Report.GPUs[0].Active = v
		s.Hosts["h1"] = h
		s.GPUs[0].Class = class
	}
	typed := protocol.VGPU{PCI: vf, TypeID: "1429", Owner: protocol.OwnerAgent}
	tests := []struct {
		name       string
		setup      func(s *Snapshot)
		wantPCI    []string
		repairable bool
	}{
		{"agent-typed, free", func(s *Snapshot) { vfGPU(s, placement.BridgeClass, typed) }, []string{vf}, true},
		{"typed outside the agent: reported only", func(s *Snapshot) {
			v := typed
			v.Owner = protocol.OwnerNova
			vfGPU(s, placement.BridgeClass, v)
		}, []string{vf}, false},
		{"two orphans, two findings", func(s *Snapshot) {
			v := typed
			v.PCI = vf2
			vfGPU(s, placement.BridgeClass, typed, v)
		}, []string{vf, vf2}, true},
		{"Nova's VF GPU", func(s *Snapshot) { vfGPU(s, "CUSTOM_NVIDIA_H200", typed) }, nil, false},
		{"in a domain", func(s *Snapshot) {
			v := typed
			v.InstanceUUID = instA
			vfGPU(s, placement.BridgeClass, v)
		}, nil, false},
		{"held by a pending attachment", func(s *Snapshot) {
			vfGPU(s, placement.BridgeClass, typed)
			s.Attachments = []AttachmentView{{ID: mdev1, Instance: instA, Host: "h1", Provider: provA, PCI: vf, Class: placement.BridgeClass,
				Amount: 1, State: flow.AttPending, UpdatedAt: now}}
			s.Allocations[provA][instA] = 1
		}, nil, false},
		{"libvirt did not answer", func(s *Snapshot) {
			vfGPU(s, placement.BridgeClass, typed)
			h := s.Hosts["h1"]
			h.Report.Errors = []string{"libvirt: connection refused"}
			s.Hosts["h1"] = h
		}, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := base(now)
			tc.setup(s)
			var got []string
			for _, f := range Detect(s) {
				if f.Kind != OrphanMdev {
					continue
				}
				got = append(got, f.PCI)
				if f.Mdev != "" || f.Provider != provA || f.Repairable != tc.repairable || (f.Repairable && (f.Repair == nil || !f.Repair.RemoveMdev || !f.Repair.VF)) {
					t.Errorf("finding %+v (repair %+v), want VF %s on %s, repairable %v", f, f.Repair, f.PCI, provA, tc.repairable)
				}
			}
			if !reflect.DeepEqual(got, tc.wantPCI) {
				t.Errorf("orphan VFs = %v, want %v", got, tc.wantPCI)
			}
		})
	}
}

// TestDetectMixedVF: on a mixed bridge-owned GPU (Snapshot.Mixed: its
// provider is no GPU of the mirror), a VF the agent typed in no domain
// that no live vGPU of the bridge holds is a repairable orphan naming the
// VF; one an attachment of the framebuffer class holds is not; an
// attached vGPU whose VF the report no longer lists typed is a missing
// device. A VF GPU that is not declared mixed and has no mirrored
// provider is not judged.
func TestDetectMixedVF(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const pf, vf = "0000:c1:00.0", "0000:c1:00.5"
	typed := protocol.VGPU{PCI: vf, TypeID: "1430", Owner: protocol.OwnerAgent}
	att := AttachmentView{ID: mdev1, Instance: instA, Host: "h1", Provider: "bbbbbbbb-0000-0000-0000-00000000000b", PCI: vf, Class: placement.BridgeFBClass,
		Amount: 35840, State: flow.AttAttached, UpdatedAt: now.Add(-time.Minute)}
	mixed := func(s *Snapshot, declared bool, v ...protocol.VGPU) {
		h := s.Hosts["h1"]
		h.Report.GPUs = append(h.Report.GPUs, protocol.GPU{PCI: pf, VendorVFIO: true, Active: v})
		s.Hosts["h1"] = h
		if declared {
			s.Mixed = map[string]bool{"h1|" + pf: true}
		}
	}
	type want struct {
		kind       Kind
		pci        string
		repairable bool
	}
	tests := []struct {
		name  string
		setup func(s *Snapshot)
		want  []want
	}{
		{"typed, free: orphan", func(s *Snapshot) { mixed(s, true, typed) }, []want{{OrphanMdev, vf, true}}},
		{"not declared mixed: not judged", func(s *Snapshot) { mixed(s, false, typed) }, nil},
		{"held by its attachment", func(s *Snapshot) {
			v := typed
			v.InstanceUUID = instA
			mixed(s, true, v)
			s.Attachments = []AttachmentView{att}
		}, nil},
		{"held by a pending attachment, in no domain yet", func(s *Snapshot) {
			mixed(s, true, typed)
			a := att
			a.State = flow.AttPending
			s.Attachments = []AttachmentView{a}
		}, nil},
		{"attached, its VF no longer typed: missing device", func(s *Snapshot) {
			mixed(s, true)
			s.Attachments = []AttachmentView{att}
		}, []want{{MissingDevice, vf, false}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := base(now)
			tc.setup(s)
			var got []want
			for _, f := range Detect(s) {
				got = append(got, want{f.Kind, f.PCI, f.Repairable})
				if f.Kind == OrphanMdev && (f.Repair == nil || !f.Repair.RemoveMdev || !f.Repair.VF || f.Mdev != "" || f.Host != "h1") {
					t.Errorf("orphan %+v (repair %+v), want remove_mdev of VF %s on h1", f, f.Repair, vf)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("findings %+v, want %+v", got, tc.want)
			}
		})
	}
}
