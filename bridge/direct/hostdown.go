// SPDX-License-Identifier: Apache-2.0

package direct

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// handleService runs Nova's notification about a nova-compute service
// (service.update …): when its host is forced down, one
// pipeline.EventHostDown event (HalfHold) per instance of the host with
// claimed direct-path vGPUs; when it is up again, one (HalfRestore) per
// instance with vGPUs held off the host. The hosts row, which the ingest
// updated with the notification (newest first), says which. It reports
// handled = false when there is nothing to do (the other stages go on).
func (p *Path) handleService(ctx context.Context, w *pipeline.Work) (_ bool, err error) {
	host := pipeline.ServiceHost(w.Row)
	if host == "" || w.Row.ObserveOnly() {
		return false, nil
	}
	defer wrapErr(&err, "service of host %s", host)
	forced, err := forcedDown(ctx, w.Tx, host)
	if err != nil {
		return false, err
	}
	half, q := pipeline.HalfRestore, `SELECT DISTINCT instance_uuid::text FROM vgpu_attachments WHERE host = $1 AND state = 'held'`
	if forced {
		half, q = pipeline.HalfHold, `SELECT DISTINCT a.instance_uuid::text FROM vgpu_attachments a JOIN instances i ON i.uuid = a.instance_uuid
			WHERE a.host = $1 AND a.state = 'attached' AND a.provider_uuid IS NOT NULL AND i.host = $1 AND coalesce(i.vm_state, '') <> 'deleted'`
	}
	rows, err := w.Tx.Query(ctx, q, host)
	if err != nil {
		return false, err
	}
	insts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(insts) == 0 {
		return false, err
	}
	for _, inst := range insts {
		if err := pipeline.RecordHostDown(ctx, w.Tx, pipeline.HostDownEvent{Instance: inst, Host: host, Half: half, ServiceEvent: w.Row.ID}); err != nil {
			return false, err
		}
	}
	p.log.Info("pipeline: compute service "+map[bool]string{true: "forced down", false: "up again"}[forced]+": direct-path vGPUs of its instances",
		logkey.Host, host, "half", half, "instances", len(insts))
	return true, nil
}

// forcedDown reads whether Nova's compute service of host is forced down
// (hosts.forced_down, kept by the ingest).
func forcedDown(ctx context.Context, tx pgx.Tx, host string) (bool, error) {
	var forced bool
	err := tx.QueryRow(ctx, `SELECT forced_down FROM hosts WHERE name = $1`, host).Scan(&forced)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return forced, err
}

// handleHostDown runs a pipeline.EventHostDown event of one instance. The
// hold takes the claims of its direct-path vGPUs on the forced-down host
// out of its consumer in Placement (planned releases: made once the
// transaction committed, with none open) and marks them held: the agent
// of a dead host cannot act, the mdevs stay. The restore, once the host
// is up again, claims a held vGPU again on its own GPU (the decision's
// plan-then-claim: WaitForClaims, Claim, apply) and marks it attached, if
// the instance is still there; a held vGPU that an evacuation applied
// again elsewhere (move.go; its provider forgotten) has its mdev removed
// from the host. Each is a request of the bridge's own, whose history
// says what was done and why. It reports handled = false for any other
// event; an event with nothing (left) to do is handled without a request.
func (p *Path) handleHostDown(ctx context.Context, w *pipeline.Work, ev policy.Event) (_, _ bool, err error) {
	tx, row := w.Tx, w.Row
	if row.Source != pipeline.BridgeSource || row.EventType != pipeline.EventHostDown {
		return false, false, nil
	}
	var m pipeline.HostDownEvent
	if err := json.Unmarshal(row.Payload, &m); err != nil || m.Instance == "" || m.Host == "" {
		return false, false, fmt.Errorf("host-down event %d: bad payload (%v)", row.ID, err)
	}
	defer wrapErr(&err, "host %s %s of %s", m.Host, m.Half, m.Instance)
	if row.ObserveOnly() {
		return false, true, nil
	}
	forced, err := forcedDown(ctx, tx, m.Host)
	if err != nil {
		return false, false, err
	}
	ev.Kind = pipeline.BridgeKindPrefix + pipeline.EventHostDown
	f, err := p.dec.LoadFacts(ctx, w, ev)
	if err != nil {
		return false, false, err
	}
	open := func(reason string) (uuid.UUID, error) {
		id := uuid.New()
		inst, _ := uuid.Parse(m.Instance)
		body, _ := json.Marshal(map[string]any{"event_id": row.ID, "event_type": row.EventType, "host": m.Host, "half": m.Half, "why": reason})
		if err := p.d.Requests.Create(ctx, tx, requests.Request{ID: id, Source: pipeline.BridgeSource, Kind: pipeline.EventHostDown,
			InstanceUUID: &inst, Body: body}); err != nil {
			return id, err
		}
		return id, nil
	}
	switch {
	case m.Half == pipeline.HalfHold && forced:
		return p.hold(ctx, w, ev, m, f, open)
	case m.Half == pipeline.HalfRestore && !forced:
		return p.restore(ctx, w, ev, m, f, open)
	}
	p.log.Info("pipeline: host-down event outdated: the service changed again", logkey.Instance, m.Instance, logkey.Host, m.Host,
		"half", m.Half, "forced_down", forced)
	return false, true, nil
}

// hold takes the claims of the instance's vGPUs on the forced-down host
// out of its consumer.
func (p *Path) hold(ctx context.Context, w *pipeline.Work, ev policy.Event, m pipeline.HostDownEvent, f pipeline.Facts,
	open func(string) (uuid.UUID, error)) (bool, bool, error) {
	tx := w.Tx
	if !f.Instance.Known || f.Instance.Deleted || f.Instance.Host != m.Host {
		return false, true, nil // gone or moved meanwhile: nothing is Nova's to carry
	}
	var hold []flow.Attachment
	for _, a := range f.Attachments {
		if a.State == flow.AttAttached && a.Host == m.Host && a.Provider != "" {
			hold = append(hold, a)
		}
	}
	if len(hold) == 0 {
		return false, true, nil
	}
	why := fmt.Sprintf("the compute service of host %s is forced down: the vGPU's claim is taken out of the instance's consumer, "+
		"so that Nova can evacuate it (Nova 26 hands the destination the whole allocation); the mdev stays on the host; "+
		"the vGPU is applied again after an evacuation, or claimed again on the same GPU when the host is back", m.Host)
	id, err := open(why)
	if err != nil {
		return false, false, err
	}
	var notes []string
	for _, a := range hold {
		if err := requests.Hold(ctx, tx, a.ID, why); err != nil {
			return false, false, err
		}
		if err := pipeline.ReleaseFor(ctx, tx, a); err != nil {
			return false, false, err
		}
		detail, _ := json.Marshal(map[string]any{"held_off_host": map[string]any{"attachment": a.ID, "host": a.Host, "provider": a.Provider,
			"class": a.Class, "amount": max(a.Amount, 1), "pci_address": a.PCIAddress, "profile": a.Profile}, "reason": why})
		if err := requests.Audit(ctx, tx, requests.Entry{Actor: p.actor(), Action: "hold", ObjectType: "attachment", ObjectID: a.ID.String(),
			RequestID: id.String(), Detail: detail}); err != nil {
			return false, false, err
		}
		notes = append(notes, fmt.Sprintf("hold %s (mdev %s) on %s GPU %s: claim taken out of the consumer", a.Profile, a.ID, a.Host, a.PCIAddress))
	}
	reason := joinNonEmpty("; ", notes...)
	if err := p.succeed(ctx, tx, id, requests.Accepted, flow.PhaseApplying, reason); err != nil {
		return false, false, err
	}
	plan := flow.Plan{Outcome: flow.OutcomeAct, Notes: notes}
	if err := p.dec.RecordDecision(ctx, w, &id, &policy.Decision{Kind: ev.Kind, Reason: why}, plan); err != nil {
		return false, false, err
	}
	p.log.Info("pipeline: direct-path vGPUs held off a forced-down host", logkey.Instance, m.Instance, logkey.Host, m.Host,
		"held", len(hold), "request_id", id)
	return false, true, nil
}

// restore claims again, once the host is up, the held vGPUs of an
// instance still there, and removes the mdevs of those applied again
// elsewhere.
func (p *Path) restore(ctx context.Context, w *pipeline.Work, ev policy.Event, m pipeline.HostDownEvent, f pipeline.Facts,
	open func(string) (uuid.UUID, error)) (bool, bool, error) {
	tx := w.Tx
	held, err := requests.HeldAttachments(ctx, tx, m.Instance)
	if err != nil {
		return false, false, err
	}
	gone := !f.Instance.Known || f.Instance.Deleted
	var reclaim, remove []flow.Attachment
	for _, a := range held {
		switch {
		case a.Host != m.Host:
		case a.Provider == "" || gone:
			remove = append(remove, a)
		case f.Instance.Host == a.Host:
			reclaim = append(reclaim, a)
		}
	}
	if len(reclaim) == 0 && len(remove) == 0 {
		return false, true, nil // moved: its move applies them (move.go)
	}
	why := fmt.Sprintf("the compute service of host %s is up again", m.Host)
	id, err := open(why)
	if err != nil {
		return false, false, err
	}
	plan := flow.Plan{Outcome: flow.OutcomeAct}
	if len(remove) > 0 {
		for i, a := range remove {
			if a.Provider != "" {
				// The instance is gone: Nova deleted its consumer.
				if err := requests.Evacuated(ctx, tx, a.ID, "the instance is gone"); err != nil {
					return false, false, err
				}
				remove[i].Provider = ""
			}
		}
		plan.Steps = append(plan.Steps, flow.Step{Kind: flow.StepRelease, Release: remove, Host: m.Host}) // detached from a guest Nova did not destroy yet
		plan.Notes = append(plan.Notes, fmt.Sprintf("remove the mdevs of %d vGPU(s) applied again on another host after the evacuation", len(remove)))
	}
	for _, a := range reclaim {
		plan.Steps = append(plan.Steps, flow.Step{Kind: flow.StepAttach, Mode: a.Mode, Host: a.Host, Reclaim: &a,
			Intent: policy.Intent{Kind: policy.IntentAttach, Rule: "host_down", Instance: m.Instance, Profile: a.Profile, TypeID: a.TypeID,
				Trait: a.Trait, Count: max(a.Amount, 1), Mode: policy.ModeDirectLive,
				Why: fmt.Sprintf("vGPU %s (mdev %s) claimed again on host %s GPU %s: the host is back and the instance was not evacuated",
					a.Profile, a.ID, a.Host, a.PCIAddress)}})
	}
	if err := p.ActPlan(ctx, w, id, requests.Accepted, &plan, f); err != nil {
		return false, false, err
	}
	if err := p.dec.RecordDecision(ctx, w, &id, &policy.Decision{Kind: ev.Kind, Reason: why}, plan); err != nil {
		return false, false, err
	}
	p.log.Info("pipeline: direct-path vGPUs of a host up again", logkey.Instance, m.Instance, logkey.Host, m.Host,
		"reclaim", len(reclaim), "remove", len(remove), "request_id", id)
	return true, true, nil
}

// succeed ends request id, in state, as succeeded with reason, through
// decided and dispatched (phase): what it did needs no agent. Releases
// its transaction planned (pipeline.ReleaseFor) are made before it ends
// (pipeline.Finish).
func (p *Path) succeed(ctx context.Context, tx pgx.Tx, id uuid.UUID, state requests.State, phase, reason string) error {
	if state == requests.Accepted {
		if _, err := p.d.Requests.Transition(ctx, tx, id, requests.Decided, "", reason, ""); err != nil {
			return err
		}
		state = requests.Decided
	}
	if state == requests.Decided {
		if _, err := p.d.Requests.Transition(ctx, tx, id, requests.Dispatched, phase, reason, ""); err != nil {
			return err
		}
	}
	return pipeline.Finish(ctx, tx, p.d.Requests, id, requests.Succeeded, reason, "")
}
