package direct

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// TakeResult moves a request on with an agent's result: the next phase,
// success once every command of the request succeeded, or failure and
// compensation. It takes every result it is handed (the direct path is
// the last taker): a compensation command's is audited; a late success
// for a request that ended is undone.
func (p *Path) TakeResult(ctx context.Context, tx pgx.Tx, ar *pipeline.AgentResult) (bool, error) {
	return true, p.takeResult(ctx, tx, ar)
}

func (p *Path) takeResult(ctx context.Context, tx pgx.Tx, ar *pipeline.AgentResult) (err error) {
	r, c := ar.Result, ar.Command
	reqID, purpose, kind, host, attID := c.Request, c.Purpose, c.Kind, c.Host, c.Attachment
	if purpose == requests.PurposeCompensation {
		detail, _ := json.Marshal(map[string]any{"command_id": r.CommandID, "kind": kind, "status": r.Status, "code": r.Code, "message": r.Message})
		if err := requests.Audit(ctx, tx, requests.Entry{Actor: p.actor(), Action: "compensation_result", ObjectType: "command",
			ObjectID: r.CommandID, RequestID: reqID.String(), Detail: detail}); err != nil {
			return err
		}
		if kind == string(protocol.AttachVGPU) && r.Status != protocol.Succeeded && attID != nil {
			return p.restoreFailed(ctx, tx, *reqID, *attID, pipeline.DescribeResult(host, kind, r))
		}
		return nil
	}
	// The request, locked, what of it is still open, and what its
	// completion reads (requestView): read with the result
	// (requests.FinishCommandOnceView), or here.
	var st string
	var nextKind *string
	var openFailed bool
	var rv requestView
	if v := c.View; v != nil {
		st, openFailed = string(v.State), v.OpenFailed
		if v.NextKind != "" {
			nextKind = &v.NextKind
		}
		rv = requestView{releasing: v.Releasing, instance: v.Instance, move: v.Move, workload: v.Workload, kind: v.Kind,
			profile: v.Profile, host: v.Host}
	} else if err := tx.QueryRow(ctx, `SELECT r.state,
			(SELECT kind FROM commands WHERE request_id = $1 AND purpose = 'action' AND finished_at IS NULL ORDER BY seq LIMIT 1),
			EXISTS (SELECT 1 FROM commands WHERE request_id = $1 AND purpose = 'action' AND finished_at IS NOT NULL AND result_status <> 'succeeded'),
			EXISTS (SELECT 1 FROM vgpu_attachments WHERE release_request_id = $1 AND state = 'releasing'),
			coalesce(r.instance_uuid::text, ''), coalesce(r.body->>'move', ''), coalesce(r.body->>'workload', ''), coalesce(r.kind, ''),
			coalesce(a.profile, ''), coalesce(a.host, '')
		FROM requests r LEFT JOIN LATERAL (SELECT profile, host FROM vgpu_attachments
			WHERE request_id = r.id AND state IN ('pending', 'attached') ORDER BY created_at LIMIT 1) a ON true
		WHERE r.id = $1 FOR UPDATE OF r`, *reqID).Scan(&st, &nextKind, &openFailed,
		&rv.releasing, &rv.instance, &rv.move, &rv.workload, &rv.kind, &rv.profile, &rv.host); err != nil {
		return err
	}
	state := requests.State(st)
	if state.Final() {
		// A late answer for a request that already ended: undo what the
		// command did if it succeeded.
		if r.Status == protocol.Succeeded && attID != nil && (kind == string(protocol.CreateMdev) || kind == string(protocol.AttachVGPU)) {
			ar.Outbox = true
			return p.undoLate(ctx, tx, *reqID, *attID, kind == string(protocol.AttachVGPU))
		}
		return nil
	}
	if r.Status != protocol.Succeeded {
		code := flow.CodeAgentFailed
		if r.Status == protocol.Refused {
			code = flow.CodeAgentRefused
		}
		ar.Outbox = true
		return p.failRequest(ctx, tx, *reqID, code, pipeline.DescribeResult(host, kind, r), attID)
	}
	if state == requests.Decided {
		if _, err := p.d.Requests.Transition(ctx, tx, *reqID, requests.Dispatched, flow.PhaseOf(protocol.Kind(kind)), "", ""); err != nil {
			return err
		}
		state = requests.Dispatched
	}
	if nextKind != nil {
		ar.Outbox = true
		_, err := p.d.Requests.Transition(ctx, tx, *reqID, state, flow.PhaseOf(protocol.Kind(*nextKind)), "", "")
		return err
	}
	if openFailed {
		return nil // failed before; nothing more to do
	}
	ar.Changed, err = p.complete(ctx, tx, *reqID, r.FinishedAt, rv)
	return err
}

// complete ends a request whose commands all succeeded: new attachments
// are attached; released ones give their claim back. at is the agent's
// time of the last command (their usage begins or ends then).
// rv is the request as read, locked, in the same transaction.
//
// changed reports that it wrote a bridge.vgpu_changed event the pipeline
// is to decide (the caller wakes it once the transaction committed).
func (p *Path) complete(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, at time.Time, rv requestView) (changed bool, err error) {
	defer wrapErr(&err, "complete request %s", reqID)
	if !rv.releasing {
		return p.completeAttach(ctx, tx, reqID, at, rv)
	}
	attached, err := requests.MarkAttached(ctx, tx, reqID, at)
	if err != nil {
		return false, err
	}
	var rel []flow.Attachment
	if rv.releasing {
		rows, err := tx.Query(ctx, `SELECT `+requests.AttachmentColumns+` FROM vgpu_attachments WHERE release_request_id = $1 AND state = 'releasing' FOR UPDATE`, reqID)
		if err != nil {
			return false, err
		}
		if rel, err = requests.ScanAttachments(rows); err != nil {
			return false, err
		}
	}
	for _, a := range rel {
		if a.Provider != "" {
			if err := pipeline.ReleaseFor(ctx, tx, a); err != nil {
				return false, err
			}
		}
		if err := requests.MarkReleased(ctx, tx, a.ID, at); err != nil {
			return false, err
		}
	}
	var parts []string
	if attached > 0 {
		parts = append(parts, fmt.Sprintf("%d vGPU(s) attached", attached))
	}
	if len(rel) > 0 {
		parts = append(parts, fmt.Sprintf("%d vGPU(s) detached and removed, claim released", len(rel)))
	}
	reason := joinNonEmpty("; ", parts...)
	if reason == "" {
		reason = "all commands succeeded"
	}
	if c, ok := directChange(reqID, rv, int(attached), len(rel)); ok {
		// An event no rule listens to is written processed: the
		// pipeline would close it having decided nothing.
		c.Unheard = !p.d.Policy.Policy().Listens(pipeline.KindVGPUChanged)
		if err := pipeline.RecordChange(ctx, tx, c); err != nil {
			return false, err
		}
		if c.Unheard {
			p.count.Decided(flow.OutcomeNothing)
		}
		changed = !c.Unheard
	}
	// Succeeded once the claims given back are made (pipeline.Finish).
	if err := pipeline.Finish(ctx, tx, p.d.Requests, reqID, requests.Succeeded, reason, ""); err != nil {
		return false, err
	}
	p.count.Finished(requests.Succeeded)
	return changed, nil
}

// completeAttach is complete for a request that gives nothing back: its
// attachments are marked attached, reading what its notification says
// (requests.MarkAttachedNoted), then it ends succeeded in one statement
// with its change event and notification (pipeline.FinishNoted).
func (p *Path) completeAttach(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, at time.Time, rv requestView) (changed bool, err error) {
	attached, noted, err := requests.MarkAttachedNoted(ctx, tx, reqID, at)
	if err != nil {
		return false, err
	}
	reason := "all commands succeeded"
	if attached > 0 {
		reason = fmt.Sprintf("%d vGPU(s) attached", attached)
	}
	var change *pipeline.Change
	if c, ok := directChange(reqID, rv, int(attached), 0); ok {
		// An event no rule listens to is written processed: the
		// pipeline would close it having decided nothing.
		c.Unheard = !p.d.Policy.Policy().Listens(pipeline.KindVGPUChanged)
		change = &c
	}
	if err := pipeline.FinishNoted(ctx, tx, p.d.Requests, reqID, reason, noted, change); err != nil {
		return false, err
	}
	if change != nil {
		if change.Unheard {
			p.count.Decided(flow.OutcomeNothing)
		}
		changed = !change.Unheard
	}
	p.count.Finished(requests.Succeeded)
	return changed, nil
}

// requestView is what the completion of a request reads of it, read
// with its lock (HandleResult): whether it is taking vGPUs back
// (releasing), its instance, the move it follows and the workload it
// named (its body's), and the profile and host of its first vGPU being
// made (pending or attached; all are attached once it completes).
type requestView struct {
	releasing                bool
	instance, move, workload string
	kind                     string // the request's kind (GPU_FAULT: a rule's move() off a faulted GPU)
	profile, host            string
}

// directChange says what a direct-path request that just completed
// changed: attached and released are how many vGPUs it attached and gave
// back; rv is the request as read with its lock.
func directChange(reqID uuid.UUID, rv requestView, attached, released int) (pipeline.Change, bool) {
	if attached == 0 && released == 0 {
		return pipeline.Change{}, false
	}
	c := pipeline.Change{Request: reqID, Path: pipeline.PathDirect, WorkloadRead: true, Instance: rv.instance, Workload: rv.workload}
	switch {
	case rv.move != "" && attached > 0:
		c.Change = pipeline.ChangeMove
	case rv.move != "":
		return c, false // the release half of a move: the re-apply says it
	case rv.kind == requests.EventGPUFault && attached > 0:
		c.Change = pipeline.ChangeMove // move() off a faulted GPU
	case attached > 0 && released > 0:
		c.Change = pipeline.ChangeResize
	case attached > 0:
		c.Change = pipeline.ChangeAttach
	default:
		c.Change = pipeline.ChangeRelease
	}
	if attached > 0 {
		c.Profile, c.Host = rv.profile, rv.host
	}
	return c, true
}

// undoLate compensates a create or attach that succeeded after its
// request had already ended.
func (p *Path) undoLate(ctx context.Context, tx pgx.Tx, reqID, attID uuid.UUID, attached bool) (err error) {
	defer wrapErr(&err, "request %s: undo the late success of attachment %s", reqID, attID)
	rows, err := tx.Query(ctx, `SELECT `+requests.AttachmentColumns+` FROM vgpu_attachments WHERE id = $1 FOR UPDATE`, attID)
	if err != nil {
		return err
	}
	atts, err := requests.ScanAttachments(rows)
	if err != nil || len(atts) == 0 {
		return err
	}
	if atts[0].State != flow.AttFailed {
		return nil
	}
	var seq int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM commands WHERE request_id = $1`, reqID).Scan(&seq); err != nil {
		return err
	}
	cmds, err := p.queueUndo(ctx, tx, reqID, atts[0], attached, true, time.Now(), &seq)
	if err != nil {
		return err
	}
	var kinds []string
	for _, c := range cmds {
		kinds = append(kinds, string(c.c.Kind)+" "+c.c.ID)
	}
	d, _ := json.Marshal(map[string]any{"reason": "a late result said the agent did it after the request had ended", "commands": kinds})
	return requests.Audit(ctx, tx, requests.Entry{Actor: p.actor(), Action: "compensate", ObjectType: "attachment",
		ObjectID: attID.String(), RequestID: reqID.String(), Detail: d})
}

// restoreFailed records that the old vGPU a failed profile change gave
// back (restoreReleases) could not be attached again: the instance has no
// vGPU of it, so its claim is released and the attachment ends failed
// with why, in the audit log and the log as well.
func (p *Path) restoreFailed(ctx context.Context, tx pgx.Tx, reqID, attID uuid.UUID, why string) error {
	rows, err := tx.Query(ctx, `SELECT `+requests.AttachmentColumns+` FROM vgpu_attachments WHERE id = $1 AND state = 'attached' FOR UPDATE`, attID)
	if err != nil {
		return err
	}
	atts, err := requests.ScanAttachments(rows)
	if err != nil || len(atts) == 0 {
		return err // not restored as attached (released since, or never)
	}
	a := atts[0]
	if a.Provider != "" {
		if err := pipeline.ReleaseFor(ctx, tx, a); err != nil {
			return err
		}
	}
	reason := fmt.Sprintf("the vGPU could not be restored after request %s failed (%s); its claim was released", reqID, why)
	if err := requests.MarkFailed(ctx, tx, a.ID, reason); err != nil {
		return err
	}
	d, _ := json.Marshal(map[string]any{"reason": reason, "profile": a.Profile, "gpu": a.PCIAddress, "provider": a.Provider})
	if err := requests.Audit(ctx, tx, requests.Entry{Actor: p.actor(), Action: "restore_failed", ObjectType: "attachment",
		ObjectID: a.ID.String(), RequestID: reqID.String(), Detail: d}); err != nil {
		return err
	}
	p.count.Compensated("restore_failed")
	p.log.Warn("pipeline: the old vGPU of a failed profile change could not be restored", logkey.RequestID, reqID, logkey.Instance, a.InstanceUUID,
		"attachment", a.ID, logkey.Err, why)
	return nil
}
