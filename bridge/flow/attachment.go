package flow

import "github.com/google/uuid"

// Attachment states (vgpu_attachments.state).
const (
	AttPending   = "pending"   // claimed in Placement, commands queued
	AttAttached  = "attached"  // the agent created and attached the mdev
	AttReleasing = "releasing" // detach and remove queued
	AttReleased  = "released"  // removed and the claim released
	AttFailed    = "failed"    // the attach failed and was compensated
	// AttHeld: its claim was taken out of the instance's consumer while
	// its host's compute service is forced down (an evacuation may
	// follow); the mdev stays on the host. With a provider, it is claimed
	// again on that GPU when the host comes back; without (the instance
	// was evacuated and the vGPU applied again elsewhere), its mdev is
	// removed then.
	AttHeld = "held"
	// AttKept: the instance's cold migration or resize to another host
	// awaits its confirm (Nova's VERIFY_RESIZE): the vGPU stays on the
	// source, its mdev in the source's shut-off guest definition and its
	// claim (Provider) in Nova's migration consumer, for a revert. The
	// confirm removes its mdev (released); the revert marks it attached
	// again, its claim back in the instance's consumer.
	AttKept = "kept"
)

// Attachment is a direct-path vGPU: a Placement claim in the instance's
// consumer and the mdev (ID) the agent creates for it.
type Attachment struct {
	ID           uuid.UUID
	InstanceUUID string
	RequestID    uuid.UUID
	Host         string // compute service host
	Node         string // root provider name
	Provider     string // GPU provider uuid
	Class        string
	Amount       int
	HeldAfter    int
	PCIAddress   string
	TypeID       string
	Profile      string
	Trait        string
	Mode         string // protocol.ModeLive | ModeConfig | ModeCold
	State        string
	// FrameRateLimit is the workload's frame-rate limiter (nil: the
	// driver's default), sent with every attach of this vGPU.
	FrameRateLimit *bool
	// Units are the Placement units of Class the vGPU holds when they are
	// not Amount (0): a vGPU of a mixed bridge-owned GPU holds its type's
	// framebuffer, in MiB of placement.BridgeFBClass.
	Units int
}

// PlacementUnits are the units of Class the vGPU holds in Placement.
func (a Attachment) PlacementUnits() int {
	if a.Units > 0 {
		return a.Units
	}
	return max(a.Amount, 1)
}
