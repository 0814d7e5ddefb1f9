// SPDX-License-Identifier: Apache-2.0

package direct

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// handleMaintenance runs a pipeline.EventMaintenance event (the halves
// of host maintenance, package pipeline's maintenance.go): it reports
// handled = false for any other event.
func (p *Path) handleMaintenance(ctx context.Context, w *pipeline.Work, ev policy.Event) (_, _ bool, err error) {
	tx, row := w.Tx, w.Row
	if row.Source != pipeline.BridgeSource || row.EventType != pipeline.EventMaintenance {
		return false, false, nil
	}
	var m pipeline.MaintenanceEvent
	if err := json.Unmarshal(row.Payload, &m); err != nil || m.Request == uuid.Nil {
		return false, false, fmt.Errorf("maintenance event %d: bad payload (%v)", row.ID, err)
	}
	defer wrapErr(&err, "maintenance %s of %s", m.Half, m.Instance)
	body, _ := json.Marshal(map[string]any{"event_id": row.ID, "event_type": row.EventType, "maintenance": m.Half})
	inst, _ := uuid.Parse(m.Instance)
	if err := p.d.Requests.Create(ctx, tx, requests.Request{ID: m.Request, Source: pipeline.BridgeSource, Kind: pipeline.EventMaintenance, InstanceUUID: &inst, Body: body}); err != nil {
		return false, false, err
	}
	ev.Kind = pipeline.BridgeKindPrefix + pipeline.EventMaintenance
	f, err := p.dec.LoadFacts(ctx, w, ev)
	if err != nil {
		return false, false, err
	}
	fail := func(reason string) (bool, bool, error) {
		plan := flow.Plan{Outcome: flow.OutcomeFail, Code: flow.CodeEventFailed, Reason: reason}
		if err := p.dec.Close(ctx, w, m.Request, requests.Accepted, plan); err != nil {
			return false, false, err
		}
		return false, true, nil
	}
	if !f.Instance.Known || f.Instance.Deleted {
		return fail("the instance is not known (or deleted)")
	}
	plan := flow.Plan{Outcome: flow.OutcomeAct}
	switch m.Half {
	case pipeline.MaintenanceDetach:
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
	case pipeline.MaintenanceAttach:
		if m.Host != "" && m.Host != f.Instance.Host {
			return fail(fmt.Sprintf("Nova says the instance is on %s, the bridge's record (from Nova's notifications) on %s: not attached on either",
				m.Host, f.Instance.Host))
		}
		if problem, _ := pipeline.HostProblem(f); problem != "" {
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
	if err := p.ActPlan(ctx, w, m.Request, requests.Accepted, &plan, f); err != nil {
		return false, false, err
	}
	if err := p.dec.RecordDecision(ctx, w, &m.Request, d, plan); err != nil {
		return false, false, err
	}
	p.log.Info("pipeline: host maintenance", logkey.Instance, m.Instance, logkey.Host, f.Instance.Host, "half", m.Half, "request_id", m.Request)
	return true, true, nil
}
