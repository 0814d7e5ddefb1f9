package direct

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

const inst = "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c04"

func att(state, profile string) flow.Attachment {
	return flow.Attachment{ID: uuid.New(), InstanceUUID: inst, Host: "cmp1", Provider: "rp", Class: "VGPU", Amount: 1, PCIAddress: "0000:3b:00.0",
		TypeID: "nvidia-232", Profile: profile, Mode: protocol.ModeLive, State: state}
}

func TestCommands(t *testing.T) {
	a := att(flow.AttPending, "T4-4Q")
	now := time.Now()
	cs, err := AttachCommands(a, "req", now, now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].Kind != protocol.AttachVGPU {
		t.Fatalf("attach commands %+v, want one attach_vgpu", cs)
	}
	// attach_vgpu names the parent and the type: the agent creates the mdev.
	var ap protocol.AttachParams
	if err := cs[0].DecodeParams(&ap); err != nil || ap.Mode != protocol.ModeLive || ap.MdevUUID != a.ID.String() ||
		ap.ParentPCI != "0000:3b:00.0" || ap.TypeID != "nvidia-232" {
		t.Errorf("attach params %+v (%v)", ap, err)
	}
	for _, c := range cs {
		body, _ := json.Marshal(c)
		if _, err := protocol.DecodeCommand(body); err != nil {
			t.Errorf("%s does not decode: %v", c.Kind, err)
		}
	}
	rs, err := ReleaseCommands(a, false, "req", now, now.Add(time.Minute))
	if err != nil || len(rs) != 2 || rs[0].Kind != protocol.DetachVGPU || rs[1].Kind != protocol.RemoveMdev {
		t.Fatalf("release commands %+v (%v)", rs, err)
	}
	rs, err = ReleaseCommands(a, true, "req", now, now.Add(time.Minute))
	if err != nil || len(rs) != 1 || rs[0].Kind != protocol.RemoveMdev {
		t.Fatalf("remove-only commands %+v (%v)", rs, err)
	}
}

// A workload's frame-rate limiter goes with a direct attach: attach_vgpu
// carries it (the plan's side: pipeline's TestPlanFrameRateLimit).
func TestAttachCommandsFrameRateLimit(t *testing.T) {
	off := false
	a := att(flow.AttAttached, "T4-4Q")
	a.FrameRateLimit = &off
	cs, err := AttachCommands(a, "r", time.Now(), time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var p protocol.AttachParams
	if err := json.Unmarshal(cs[0].Params, &p); err != nil || p.FrameRateLimit == nil || *p.FrameRateLimit {
		t.Errorf("attach_vgpu params %s: %v", cs[0].Params, err)
	}
}

// TestCommandsBridgeOwned: on a bridge-owned GPU (placement.BridgeClass)
// the type tells a VF from an mdev: a numeric (vendor-VFIO) type's
// commands name the VF and vendor_vfio; an mdev type's (a bridge-owned
// mdev GPU) are those of an mdev on a GPU of Nova's, the GPU and the type,
// with the attachment's id as the mdev.
func TestCommandsBridgeOwned(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name, class, pci, typeID string
		vf                       bool
	}{
		{"VF", placement.BridgeClass, "0000:c1:00.5", "1430", true},
		{"mixed VF", placement.BridgeFBClass, "0000:c1:00.5", "1431", true},
		{"mdev", placement.BridgeClass, "0000:d8:00.0", "nvidia-231", false},
		{"Nova's mdev GPU", "VGPU", "0000:3b:00.0", "nvidia-232", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := att(flow.AttPending, "P")
			a.Class, a.PCIAddress, a.TypeID = tc.class, tc.pci, tc.typeID
			if IsVF(a) != tc.vf {
				t.Errorf("IsVF = %v, want %v", IsVF(a), tc.vf)
			}
			cs, err := AttachCommands(a, "req", now, now.Add(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			var ap protocol.AttachParams
			if err := cs[0].DecodeParams(&ap); err != nil || ap.VendorVFIO != tc.vf || ap.ParentPCI != tc.pci || ap.TypeID != tc.typeID ||
				ap.MdevUUID != a.ID.String() {
				t.Errorf("attach params %+v (%v)", ap, err)
			}
			rs, err := ReleaseCommands(a, false, "req", now, now.Add(time.Minute))
			if err != nil || len(rs) != 2 {
				t.Fatalf("release commands %+v (%v)", rs, err)
			}
			var mp protocol.MdevParams
			if err := rs[1].DecodeParams(&mp); err != nil || mp.VendorVFIO != tc.vf || mp.MdevUUID != a.ID.String() ||
				(tc.vf && mp.ParentPCI != tc.pci) || (!tc.vf && mp.ParentPCI != "") {
				t.Errorf("remove_mdev params %+v (%v)", mp, err)
			}
			for _, c := range append(cs, rs...) {
				body, _ := json.Marshal(c)
				if _, err := protocol.DecodeCommand(body); err != nil {
					t.Errorf("%s does not decode: %v", c.Kind, err)
				}
			}
		})
	}
}
