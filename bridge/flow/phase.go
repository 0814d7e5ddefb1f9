package flow

import "github.com/vgpu-bridge/vgpu-bridge/agent/protocol"

// Phases of a request in flight (requests.phase).
const (
	PhaseQueued       = "queued"
	PhaseCreating     = "creating_mdev"
	PhaseAttaching    = "attaching"
	PhaseDetaching    = "detaching"
	PhaseRemoving     = "removing_mdev"
	PhaseApplying     = "applying"
	PhaseCompensating = "compensating"
	// PhaseDeferred is the phase of an accepted request whose event waits
	// for a cooldown or for: window to end (its reason says until when).
	PhaseDeferred = "deferred"
)

// Phases of a Nova-path request.
const (
	PhaseResizing   = "resizing"
	PhaseVerifying  = "verifying"
	PhaseConfirming = "confirming"
	// PhaseOverdue: Nova still resizes past the step's deadline; the
	// bridge follows the resize to its end.
	PhaseOverdue = "overdue"
)

// PhaseOf is the phase of a request while command kind k runs.
func PhaseOf(k protocol.Kind) string {
	switch k {
	case protocol.CreateMdev:
		return PhaseCreating
	case protocol.AttachVGPU:
		return PhaseAttaching
	case protocol.DetachVGPU:
		return PhaseDetaching
	case protocol.RemoveMdev:
		return PhaseRemoving
	}
	return PhaseApplying
}
