package flow

import (
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// StepKind names what a step does.
type StepKind string

// Step kinds.
const (
	StepAttach   StepKind = "attach"   // claim in Placement, attach_vgpu (which creates the mdev)
	StepRelease  StepKind = "release"  // detach_vgpu, remove_mdev, then the claim is released
	StepCommand  StepKind = "command"  // one agent command (set_vm_limits, set_vgpu_scheduler)
	StepReattach StepKind = "reattach" // attach_vgpu again after Nova rebuilt the domain
	StepNotify   StepKind = "notify"   // recorded only
	// StepNovaResize resizes the server through Nova to a flavor with the
	// intent's vGPU.
	StepNovaResize StepKind = "nova_resize"
)

// Step is one thing to do for a decision.
type Step struct {
	Kind   StepKind
	Intent policy.Intent
	// attach: the agent's attach mode.
	Mode string
	// attach: GPU providers the claim must not choose (those a move
	// leaves).
	Exclude []string
	// release: the attachments to take back; RemoveOnly when the domain is
	// gone (the instance was deleted).
	Release    []Attachment
	RemoveOnly bool
	// attach: Reclaim, when set, is a vGPU held off its host
	// (AttHeld) whose units are claimed again on its own GPU; no command
	// goes to the agent (its mdev is still there).
	Reclaim *Attachment
	// command
	Command protocol.Kind
	Params  any
	Host    string
}

// Outcome is what the plan does with the request.
type Outcome string

// Outcomes of a plan.
const (
	OutcomeAct     Outcome = "act"     // steps to run
	OutcomeReject  Outcome = "reject"  // the policy (or a refusal) said no
	OutcomeFail    Outcome = "fail"    // the bridge cannot do what was decided
	OutcomeNothing Outcome = "nothing" // no rule asked for a change
	// OutcomeDefer is the plan of a decision that held rules back and
	// fired none: the event is evaluated again when the hold ends.
	OutcomeDefer Outcome = "defer"
)

// Plan is what the pipeline does about one decision.
type Plan struct {
	Outcome Outcome
	Code    string
	Reason  string
	Steps   []Step
	// Notes are refusals of the planner that did not stop the plan.
	Notes []string
}

// Actions reports whether the plan has steps that change something.
func (p Plan) Actions() bool {
	for _, s := range p.Steps {
		if s.Kind != StepNotify {
			return true
		}
	}
	return false
}
