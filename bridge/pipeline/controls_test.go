package pipeline

import (
	"testing"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

func TestObserve(t *testing.T) {
	f := Facts{Instance: InstanceFacts{Host: "cmp1"}}
	mdev := uuid.MustParse("6f2b7c1e-0c43-4b8e-9a1d-2f7e3c5b9a10")
	tests := []struct {
		name  string
		steps []flow.Step
		want  string
		keep  int // notify steps kept
	}{
		{"attach", []flow.Step{{Kind: flow.StepAttach, Intent: policy.Intent{Profile: "T4-4Q", Trait: "CUSTOM_NVIDIA_232", Count: 2}}},
			"observe-only mode: would have: attach 2 × T4-4Q (CUSTOM_NVIDIA_232) on host cmp1", 0},
		{"release and notify", []flow.Step{{Kind: flow.StepRelease, Release: []flow.Attachment{{ID: mdev, Profile: "T4-4Q", Host: "cmp1"}}},
			{Kind: flow.StepNotify, Intent: policy.Intent{Message: "hi"}}},
			"observe-only mode: would have: release T4-4Q (mdev " + mdev.String() + ") on cmp1", 1},
		{"nova resize", []flow.Step{{Kind: flow.StepNovaResize, Intent: policy.Intent{Profile: "T4-4Q", Trait: "CUSTOM_NVIDIA_232"}, Host: "cmp1"}},
			"observe-only mode: would have: resize through Nova to a flavor with 1 × T4-4Q (CUSTOM_NVIDIA_232), on host cmp1 or where Nova's scheduler puts it", 0},
		{"command", []flow.Step{{Kind: flow.StepCommand, Command: protocol.SetVMLimits, Host: "cmp1"}},
			"observe-only mode: would have: set_vm_limits on cmp1", 0},
		{"nothing", nil, "observe-only mode: would have: nothing an agent would have been sent", 0},
	}
	for _, tt := range tests {
		got := observe(flow.Plan{Outcome: flow.OutcomeAct, Steps: tt.steps}, f)
		if got.Outcome != flow.OutcomeReject || got.Code != flow.CodeObserveOnly || got.Reason != tt.want || len(got.Steps) != tt.keep {
			t.Errorf("%s: %s %s %q with %d steps, want reject %s %q with %d", tt.name, got.Outcome, got.Code, got.Reason, len(got.Steps),
				flow.CodeObserveOnly, tt.want, tt.keep)
		}
		for _, s := range got.Steps {
			if s.Kind != flow.StepNotify {
				t.Errorf("%s: step %s kept", tt.name, s.Kind)
			}
		}
	}
}
