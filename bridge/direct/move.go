package direct

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// outcomeMove counts, among the pipeline's decided events, those a move
// made vGPUs follow (vgpu_bridge_pipeline_events_total{outcome="move"}).
const outcomeMove flow.Outcome = "move"

// Move request kinds' body "move" values.
const (
	moveRelease = "release" // remove_mdev on the host the instance left; its claim is gone with Nova's rewrite
	moveReapply = "reapply" // claim on a GPU of the new host, attach_vgpu (creating the mdev) there
)

// handleMove keeps the instance's direct-path vGPUs where the instance is
// after a Nova move: a vGPU whose instance left its host, or whose claim
// Nova's rewrite of the allocations dropped, is released (remove_mdev on
// its old host, where Nova has undefined or redefined the domain; its
// claim is no longer in the consumer) by one request, and applied again
// on the instance's current host (claim in the consumer, attach_vgpu,
// which creates the mdev, through that host's agent) by another, so that a failure of
// one never leaves the other half-done. A shelve offload only releases
// (the vGPUs are marked shelved); the unshelve applies the shelved ones
// on the host Nova chose. It reports handled = false when the event needs
// nothing of this (the vGPUs are where the instance is, with their
// claims): the ordinary path runs then, and for RebuildEvents attaches
// them again to the domain Nova recreated without them (an unshelve on
// the same host, a rebuild that was not an evacuation). vGPUs held off a
// forced-down host (hostdown.go) are applied again where an evacuation
// took the instance; their mdevs wait there for the host to be back.
//
// A cold migration or resize to another host is not over at
// instance.resize_finish.end: until Nova confirms it, the source keeps
// the guest's definition (with the mdev) and Nova's migration consumer
// the source's allocations (with the vGPU's claim), for a revert. There
// the vGPU left behind is kept (flow.AttKept: no command, its claim left
// to Nova) while one is applied on the destination. At the next move
// event (instance.resize_confirm.end, or the revert's
// instance.resize_revert.end) a kept vGPU off the instance's host is
// released (remove_mdev: the confirm destroyed the guest there, and the
// claim went with the migration consumer), and one on the instance's
// host (the revert: the guest started again there with its mdev, the
// claim moved back into the instance's consumer) is attached again, its
// claim adopted (or made again) on its GPU, in place of applying one
// there; the vGPU the destination got is released like any moved one.
func (p *Path) handleMove(ctx context.Context, w *pipeline.Work, ev policy.Event) (_, _ bool, err error) {
	tx, row := w.Tx, w.Row
	defer wrapErr(&err, "instance %s moved (%s)", ev.InstanceUUID, ev.Kind)
	if row.Webhook() || !pipeline.IsMove(ev.Kind) || ev.InstanceUUID == "" {
		return false, false, nil
	}
	if row.ObserveOnly() {
		return false, false, nil // observe-only mode acts on nothing (controls.go)
	}
	if _, err := uuid.Parse(ev.InstanceUUID); err != nil {
		return false, false, nil
	}
	f, err := p.dec.LoadFacts(ctx, w, ev)
	if err != nil {
		return false, false, err
	}
	if !f.Instance.Known || f.Instance.Deleted {
		return false, false, nil
	}
	shelved, err := shelvedAttachments(ctx, tx, ev.InstanceUUID)
	if err != nil {
		return false, false, err
	}
	kept, err := requests.KeptAttachments(ctx, tx, ev.InstanceUUID)
	if err != nil {
		return false, false, err
	}
	var attached []flow.Attachment
	for _, a := range f.Attachments {
		if a.State == flow.AttAttached {
			attached = append(attached, a)
		}
	}
	offload := ev.Kind == pipeline.NovaKindPrefix+"instance.shelve_offload.end" || f.Instance.Host == ""
	// vGPUs held off a forced-down host (hostdown.go) that the instance
	// left: an evacuation. Applied again here; their mdevs on the old host
	// are removed once it is back.
	var evacuated []flow.Attachment
	if !offload {
		held, err := requests.HeldAttachments(ctx, tx, ev.InstanceUUID)
		if err != nil {
			return false, false, err
		}
		for _, a := range held {
			if a.Provider != "" && a.Host != f.Instance.Host {
				evacuated = append(evacuated, a)
			}
		}
	}
	if len(attached) == 0 && len(shelved) == 0 && len(evacuated) == 0 && len(kept) == 0 {
		return false, false, nil
	}
	// A vGPU still being attached on a host the instance left (a revert
	// right after the resize_finish.end's re-apply): wait for its request
	// to end, so that what it made is released with the rest.
	for _, a := range f.Attachments {
		if a.State == flow.AttPending && a.Host != f.Instance.Host && !w.LastAttempt() {
			return false, false, pipeline.Retry(fmt.Errorf("vGPU %s (mdev %s) of request %s is still being attached on host %s, which the instance left",
				a.Profile, a.ID, a.RequestID, a.Host))
		}
	}
	holds := map[string]int{} // units the consumer holds per GPU provider
	if !offload {
		hl, err := w.HeldBy(ev.InstanceUUID) // read before the decision, outside its transaction
		if err != nil {
			return false, false, err
		}
		for _, h := range hl {
			holds[h.Provider] += h.Amount
		}
	}
	// Which vGPUs moved: off the instance's host, or without their claim.
	var moved []flow.Attachment
	need := map[string]int{}
	for _, a := range attached {
		need[a.Provider] += a.Amount
	}
	for _, a := range attached {
		if offload || a.Host != f.Instance.Host || a.Provider == "" || holds[a.Provider] < need[a.Provider] {
			moved = append(moved, a)
		}
	}
	// Kept vGPUs (a move awaiting its confirm): restored on the
	// instance's host (reverted), released elsewhere (confirmed).
	var restore, unkeep []flow.Attachment
	for _, a := range kept {
		if !offload && a.Host == f.Instance.Host && a.Provider != "" {
			restore = append(restore, a)
		} else {
			unkeep = append(unkeep, a)
		}
	}
	var reapply []flow.Attachment
	if !offload {
		// The vGPUs a restored one stands for (the destination's, moved
		// back off it) are released, not applied again.
		back := map[string]int{}
		for _, a := range restore {
			back[a.Profile] += max(a.Amount, 1)
		}
		for _, a := range moved {
			if n := max(a.Amount, 1); back[a.Profile] >= n {
				back[a.Profile] -= n
				continue
			}
			reapply = append(reapply, a)
		}
		if ev.Kind == pipeline.NovaKindPrefix+"instance.unshelve.end" {
			reapply = append(reapply, shelved...)
		}
		reapply = append(reapply, evacuated...)
	}
	// A cold migration or resize to another host awaiting its confirm:
	// the source's vGPUs are kept there, not released.
	var keep []flow.Attachment
	if ev.Kind == pipeline.NovaKindPrefix+"instance.resize_finish.end" && !offload {
		rest := moved[:0:0]
		for _, a := range moved {
			if a.Host != f.Instance.Host && a.Provider != "" && a.Host != "" {
				keep = append(keep, a)
			} else {
				rest = append(rest, a)
			}
		}
		moved = rest
	}
	if len(moved) == 0 && len(reapply) == 0 && len(keep) == 0 && len(restore) == 0 && len(unkeep) == 0 {
		return false, false, nil
	}
	why := strings.TrimPrefix(ev.Kind, pipeline.NovaKindPrefix)
	var notes []string
	for _, a := range keep {
		note := fmt.Sprintf("vGPU %s (mdev %s) kept on host %s until Nova confirms the move (%s): the source's guest keeps it for a revert, "+
			"its claim is in the migration's consumer", a.Profile, a.ID, a.Host, why)
		if err := requests.Keep(ctx, tx, a.ID, note); err != nil {
			return false, false, err
		}
		notes = append(notes, note)
	}

	// The release: the old mdevs go; their claims left the consumer with
	// Nova's rewrite (the provider is forgotten so that completing the
	// release never takes units off a claim made since on the same GPU).
	// Kept vGPUs off the instance's host: the confirm destroyed the
	// source's guest and deleted the migration's consumer with their claim.
	var relID *uuid.UUID
	if len(moved) > 0 || len(unkeep) > 0 {
		id := uuid.New()
		relID = &id
		if err := p.moveRequest(ctx, tx, row, id, moveRelease); err != nil {
			return false, false, err
		}
		for i, a := range moved {
			if holds[a.Provider] == 0 || offload {
				if err := requests.ForgetClaim(ctx, tx, a.ID, offload, fmt.Sprintf("claim dropped by Nova (%s)", why)); err != nil {
					return false, false, err
				}
				moved[i].Provider = ""
			}
		}
		for i, a := range unkeep {
			if err := requests.ForgetClaim(ctx, tx, a.ID, false, fmt.Sprintf("kept on host %s for a revert; its claim went with Nova's migration consumer (%s)", a.Host, why)); err != nil {
				return false, false, err
			}
			unkeep[i].Provider = ""
		}
		// One step per host: each host's agent removes its mdevs.
		var steps []flow.Step
		for _, a := range append(slices.Clone(moved), unkeep...) {
			i := slices.IndexFunc(steps, func(s flow.Step) bool { return s.Host == a.Host })
			if i < 0 {
				steps = append(steps, flow.Step{Kind: flow.StepRelease, RemoveOnly: true, Host: a.Host})
				i = len(steps) - 1
			}
			steps[i].Release = append(steps[i].Release, a)
		}
		plan := flow.Plan{Outcome: flow.OutcomeAct, Steps: steps}
		if err := p.ActPlan(ctx, w, id, requests.Accepted, &plan, f); err != nil {
			return false, false, err
		}
	}

	// The re-apply on the instance's current host.
	var reqID *uuid.UUID
	plan := flow.Plan{Outcome: flow.OutcomeAct, Notes: notes}
	if len(reapply) > 0 || len(restore) > 0 {
		id := uuid.New()
		reqID = &id
		if err := p.moveRequest(ctx, tx, row, id, moveReapply); err != nil {
			return false, false, err
		}
		mode := moveMode(f.Instance.VMState)
		for _, a := range reapply {
			plan.Steps = append(plan.Steps, flow.Step{Kind: flow.StepAttach, Mode: mode, Host: f.Instance.Host,
				Intent: policy.Intent{Kind: policy.IntentAttach, Rule: "move", Instance: a.InstanceUUID, Profile: a.Profile, TypeID: a.TypeID,
					Trait: a.Trait, Count: max(a.Amount, 1), Mode: policy.ModeDirectLive,
					Why: fmt.Sprintf("vGPU %s (mdev %s) applied again on host %s after %s", a.Profile, a.ID, f.Instance.Host, why)}})
		}
		// A kept vGPU back on the instance's host: its mdev is in the
		// guest Nova started again; its claim, which Nova's revert moved
		// back into the instance's consumer, is adopted (Claim) and the
		// vGPU is attached again. Nothing goes to the agent.
		for _, a := range restore {
			plan.Steps = append(plan.Steps, flow.Step{Kind: flow.StepAttach, Mode: a.Mode, Host: a.Host, Reclaim: &a,
				Intent: policy.Intent{Kind: policy.IntentAttach, Rule: "move", Instance: a.InstanceUUID, Profile: a.Profile, TypeID: a.TypeID,
					Trait: a.Trait, Count: max(a.Amount, 1), Mode: policy.ModeDirectLive,
					Why: fmt.Sprintf("vGPU %s (mdev %s) kept on host %s is attached again after %s", a.Profile, a.ID, a.Host, why)}})
		}
		if problem, code := pipeline.HostProblem(f); problem != "" && len(reapply) > 0 {
			plan = flow.Plan{Outcome: flow.OutcomeFail, Code: code, Reason: "the vGPUs cannot follow the instance: " + problem}
			if err := p.dec.Close(ctx, w, id, requests.Accepted, plan); err != nil {
				return false, false, err
			}
		} else {
			if err := p.ActPlan(ctx, w, id, requests.Accepted, &plan, f); err != nil {
				return false, false, err
			}
		}
		for _, a := range evacuated {
			why := fmt.Sprintf("applied again on host %s by request %s after %s; its mdev on %s is removed once that host is back", f.Instance.Host, id, why, a.Host)
			if err := requests.Evacuated(ctx, tx, a.ID, why); err != nil {
				return false, false, err
			}
			plan.Notes = append(plan.Notes, fmt.Sprintf("vGPU %s (mdev %s) held off host %s since it was forced down: %s", a.Profile, a.ID, a.Host, why))
		}
		if len(shelved) > 0 && ev.Kind == pipeline.NovaKindPrefix+"instance.unshelve.end" {
			ids := make([]uuid.UUID, len(shelved))
			for i, a := range shelved {
				ids[i] = a.ID
			}
			if err := requests.Unshelve(ctx, tx, ids); err != nil {
				return false, false, err
			}
		}
	}
	if relID != nil {
		plan.Notes = append(plan.Notes, fmt.Sprintf("release on the old host: request %s", relID))
	}
	if err := p.dec.RecordDecision(ctx, w, firstID(reqID, relID), &policy.Decision{Kind: ev.Kind, Reason: "the instance moved (" + why + ")"}, plan); err != nil {
		return false, false, err
	}
	p.count.Decided(outcomeMove)
	p.log.Info("pipeline: vGPUs follow a Nova move", logkey.Instance, ev.InstanceUUID, logkey.Host, f.Instance.Host, "event", why,
		"released", len(moved)+len(unkeep), "reapplied", len(reapply), "kept", len(keep), "restored", len(restore))
	return true, true, nil
}

func firstID(ids ...*uuid.UUID) *uuid.UUID {
	for _, id := range ids {
		if id != nil {
			return id
		}
	}
	return nil
}

// moveMode is the attach mode on the new host: live into a running
// domain (active, or resized and awaiting the confirm), else into its
// definition.
func moveMode(vmState string) string {
	switch vmState {
	case "", "active", "resized":
		return pipeline.AgentMode(policy.ModeDirectLive, "active")
	}
	return pipeline.AgentMode(policy.ModeDirectLive, vmState)
}

// moveRequest records a request of the bridge's own for one half of a
// move.
func (p *Path) moveRequest(ctx context.Context, tx pgx.Tx, row pipeline.InboxRow, id uuid.UUID, half string) (err error) {
	defer wrapErr(&err, "open move request %s", id)
	var inst *uuid.UUID
	if u, err := uuid.Parse(row.InstanceUUID); err == nil {
		inst = &u
	}
	body, _ := json.Marshal(map[string]any{"event_id": row.ID, "event_type": row.EventType, "message_id": row.MessageID, "move": half})
	return p.d.Requests.Create(ctx, tx, requests.Request{ID: id, Source: row.Source, Kind: row.EventType, InstanceUUID: inst, Body: body})
}

// shelvedAttachments are the instance's vGPUs released by a shelve
// offload, to apply again at the unshelve.
func shelvedAttachments(ctx context.Context, q pipeline.Querier, instance string) ([]flow.Attachment, error) {
	rows, err := q.Query(ctx, `SELECT `+requests.AttachmentColumns+` FROM vgpu_attachments
		WHERE instance_uuid = $1 AND shelved AND state IN ('releasing','released') ORDER BY created_at, id`, instance)
	if err != nil {
		return nil, fmt.Errorf("read shelved vGPUs of %s: %w", instance, err)
	}
	return requests.ScanAttachments(rows)
}
