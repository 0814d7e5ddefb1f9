// SPDX-License-Identifier: Apache-2.0

package pipeline

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// Host maintenance (bridge/maintenance) moves a direct-path VM off a host
// in halves the pipeline makes, as it makes those of a Nova move
// (move.go): before the move, a detach (detach and remove the VM's
// direct-path vGPUs through the agent, their claims given back); after
// it, an attach of the same profiles on the instance's new host, whose
// claim is the maintenance reservation moved into the instance's
// consumer (DirectPath.Claim adopts it). The executor writes a bridge event of type
// EventMaintenance into the inbox and waits on the request it names.

// EventMaintenance is the type of the executor's events.
const EventMaintenance = "maintenance"

// Maintenance halves (MaintenanceEvent.Half).
const (
	MaintenanceDetach = "detach"
	MaintenanceAttach = "attach"
)

// MaintenanceVGPU is one vGPU to attach again after the move.
type MaintenanceVGPU struct {
	Profile string `json:"profile"`
	TypeID  string `json:"type_id"`
	Trait   string `json:"trait"`
	Amount  int    `json:"amount"`
}

// MaintenanceEvent is the payload of an EventMaintenance event.
type MaintenanceEvent struct {
	Request  uuid.UUID         `json:"request_id"`
	Instance string            `json:"instance_uuid"`
	Half     string            `json:"change"` // detach, attach
	VGPUs    []MaintenanceVGPU `json:"vgpus,omitempty"`
	// Host and Node are where Nova says the instance is (attach), read by
	// the maintenance runner once the move's last notification was
	// processed: the attach goes ahead only where the bridge's own record
	// (from the notifications) agrees.
	Host string `json:"host,omitempty"`
	Node string `json:"node,omitempty"`
}

// RecordMaintenance writes the executor's event into the inbox (once per
// request id); the processor makes its request.
func RecordMaintenance(ctx context.Context, q requests.Execer, e MaintenanceEvent) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if err := requests.QueueEvent(ctx, q, requests.Event{Source: BridgeSource, MessageID: EventMaintenance + ":" + e.Request.String(),
		Type: EventMaintenance, Instance: e.Instance, Payload: b}); err != nil {
		return fmt.Errorf("maintenance %s of %s: record the event: %w", e.Half, e.Instance, err)
	}
	return nil
}

// handleMaintenance runs an EventMaintenance event: it reports handled =
// false for any other event.
func (p *Processor) handleMaintenance(ctx context.Context, w *Work, ev policy.Event) (_, _ bool, err error) {
	tx, row, hs := w.Tx, w.Row, w.hosts
	if row.Source != BridgeSource || row.EventType != EventMaintenance {
		return false, false, nil
	}
	var m MaintenanceEvent
	if err := json.Unmarshal(row.Payload, &m); err != nil || m.Request == uuid.Nil {
		return false, false, fmt.Errorf("maintenance event %d: bad payload (%v)", row.ID, err)
	}
	defer wrapErr(&err, "maintenance %s of %s", m.Half, m.Instance)
	body, _ := json.Marshal(map[string]any{"event_id": row.ID, "event_type": row.EventType, "maintenance": m.Half})
	inst, _ := uuid.Parse(m.Instance)
	if err := p.d.Requests.Create(ctx, tx, requests.Request{ID: m.Request, Source: BridgeSource, Kind: EventMaintenance, InstanceUUID: &inst, Body: body}); err != nil {
		return false, false, err
	}
	ev.Kind = BridgeKindPrefix + EventMaintenance
	f, _, err := p.loadFacts(ctx, tx, ev, hs, usageRead{guard: w.quota})
	if err != nil {
		return false, false, err
	}
	fail := func(reason string) (bool, bool, error) {
		plan := flow.Plan{Outcome: flow.OutcomeFail, Code: flow.CodeEventFailed, Reason: reason}
		if err := p.closeWithout(ctx, tx, row, m.Request, requests.Accepted, plan); err != nil {
			return false, false, err
		}
		return false, true, nil
	}
	if !f.Instance.Known || f.Instance.Deleted {
		return fail("the instance is not known (or deleted)")
	}
	plan := flow.Plan{Outcome: flow.OutcomeAct}
	switch m.Half {
	case MaintenanceDetach:
		var attached []flow.Attachment
		for _, a := range f.Attachments {
			if a.State == flow.AttAttached {
				attached = append(attached, a)
			}
		}
		if len(attached) == 0 {
			return fail("the instance has no attached vGPU of the bridge's")
		}
		plan.Steps = []flow.Step{{Kind: flow.StepRelease, Release: attached, Host: attached[0].Host}}
	case MaintenanceAttach:
		if m.Host != "" && m.Host != f.Instance.Host {
			return fail(fmt.Sprintf("Nova says the instance is on %s, the bridge's record (from Nova's notifications) on %s: not attached on either",
				m.Host, f.Instance.Host))
		}
		if problem, _ := hostProblem(f); problem != "" {
			return fail("the vGPUs cannot be attached on the new host: " + problem)
		}
		mode := moveMode(f.Instance.VMState)
		for _, v := range m.VGPUs {
			plan.Steps = append(plan.Steps, flow.Step{Kind: flow.StepAttach, Mode: mode, Host: f.Instance.Host,
				Intent: policy.Intent{Kind: policy.IntentAttach, Rule: "maintenance", Instance: m.Instance, Profile: v.Profile, TypeID: v.TypeID,
					Trait: v.Trait, Count: max(v.Amount, 1), Mode: policy.ModeDirectLive,
					Why: fmt.Sprintf("vGPU %s applied again on host %s after host maintenance moved the instance", v.Profile, f.Instance.Host)}})
		}
		if len(plan.Steps) == 0 {
			return fail("no vGPU to attach")
		}
	default:
		return fail("unknown maintenance half " + m.Half)
	}
	d := &policy.Decision{Kind: ev.Kind, Reason: "host maintenance: " + m.Half}
	if err := p.direct.ActPlan(ctx, w, m.Request, requests.Accepted, &plan, f); err != nil {
		return false, false, err
	}
	if err := p.recordDecision(ctx, tx, row, &m.Request, d, plan); err != nil {
		return false, false, err
	}
	p.log.Info("pipeline: host maintenance", logkey.Instance, m.Instance, logkey.Host, f.Instance.Host, "half", m.Half, "request_id", m.Request)
	return true, true, nil
}
