package direct

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
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
