package direct

import (
	"context"
	"encoding/json"
	"errors"
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

// FailRequest fails a request with code and reason and compensates what
// it did (failRequest): the pipeline's Failer, whatever path ran the
// request. It runs in a transaction of the pipeline (InTx, a result's,
// a decision's): the claims it gives back are planned there
// (pipeline.ReleaseFor) and made once it committed, and the request
// reads failed only once they are (pipeline.Finish).
func (p *Path) FailRequest(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, code, reason string) error {
	return p.failRequest(ctx, tx, reqID, code, reason, nil)
}

// Cancel ends request id at actor's word (POST /v1/requests/{id}/cancel:
// requests.Canceller): failed, code cancelled. A request with direct-path
// vGPUs in flight (being attached or released) is failed as failRequest
// fails it, in one transaction of the pipeline: its compensation is
// queued, the claims it gives back are planned (pipeline.ReleaseFor), and
// it reads cancelled only once they are made (pipeline.Finish); a crash
// between the steps leaves the plans, which the release sweep makes. Any
// other request ends at once (requests.Store.Cancel). A final request,
// or one whose end already waits for its releases, is refused
// (requests.ErrIllegal).
func (p *Path) Cancel(ctx context.Context, id uuid.UUID, actor string) error {
	err := p.pipe.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var st string
		var inFlight, ending bool
		err := tx.QueryRow(ctx, `SELECT r.state,
				EXISTS (SELECT 1 FROM vgpu_attachments a
					WHERE (a.request_id = r.id AND a.state = 'pending') OR (a.release_request_id = r.id AND a.state = 'releasing')),
				EXISTS (SELECT 1 FROM planned_finishes f WHERE f.request_id = r.id)
			FROM requests r WHERE r.id = $1 FOR UPDATE OF r`, id).Scan(&st, &inFlight, &ending)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("cancel request %s: %w", id, requests.ErrNotFound)
		case err != nil:
			return fmt.Errorf("cancel request %s: %w", id, err)
		case requests.State(st).Final() || ending:
			return fmt.Errorf("cancel request %s: it is %s: %w", id, st, requests.ErrIllegal)
		case !inFlight:
			_, err := p.d.Requests.Cancel(ctx, tx, id, actor)
			return err
		}
		reason := "cancelled by " + actor
		if err := requests.Audit(ctx, tx, requests.Entry{Actor: actor, Action: "cancel", ObjectType: "request",
			ObjectID: id.String(), RequestID: id.String()}); err != nil {
			return err
		}
		return p.failRequest(ctx, tx, id, flow.CodeCancelled, reason, nil)
	})
	if err == nil {
		p.kickOutbox() // the compensation's commands
	}
	return err
}

// failRequest fails a request with code and reason and compensates what
// it did: for each attachment it was creating, the Placement claim is
// released and, for what reached the agent, detach_vgpu / remove_mdev are
// queued; attachments it was releasing stay attached. Unsent commands are
// cancelled. Everything is recorded in audit_log. cause, when set, is the
// attachment whose command failed.
func (p *Path) failRequest(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, code, reason string, cause *uuid.UUID) (err error) {
	defer wrapErr(&err, "fail request %s", reqID)
	var st string
	if err := tx.QueryRow(ctx, `SELECT state FROM requests WHERE id = $1 FOR UPDATE`, reqID).Scan(&st); err != nil {
		return err
	}
	state := requests.State(st)
	if state.Final() {
		return nil
	}
	if ending, err := requests.FinishPlanned(ctx, tx, reqID); err != nil || ending {
		return err // it ends once its releases are made (pipeline.Finish)
	}
	if state != requests.Accepted {
		if _, err := p.d.Requests.Transition(ctx, tx, reqID, state, flow.PhaseCompensating, reason, code); err != nil {
			return err
		}
	}
	if err := p.compensate(ctx, tx, reqID, code, reason, cause); err != nil {
		return err
	}
	// Failed once the claims compensate gave back are made (pipeline.Finish).
	if err := pipeline.Finish(ctx, tx, p.d.Requests, reqID, requests.Failed, reason, code); err != nil {
		return err
	}
	p.count.Finished(requests.Failed)
	p.log.Info("pipeline: request failed", logkey.RequestID, reqID, logkey.Code, code, logkey.Reason, reason)
	return nil
}

// compensate undoes what a request did that is not finished: see
// failRequest. The request's state is the caller's.
func (p *Path) compensate(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, code, reason string, cause *uuid.UUID) (err error) {
	defer wrapErr(&err, "compensate request %s", reqID)
	// Unsent commands never go out.
	if err := requests.CancelUnsent(ctx, tx, reqID); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT `+requests.AttachmentColumns+` FROM vgpu_attachments WHERE request_id = $1 AND state = 'pending' FOR UPDATE`, reqID)
	if err != nil {
		return err
	}
	atts, err := requests.ScanAttachments(rows)
	if err != nil {
		return err
	}
	now := time.Now()
	var seq int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM commands WHERE request_id = $1`, reqID).Scan(&seq); err != nil {
		return err
	}
	for _, a := range atts {
		detail := map[string]any{"reason": reason, "code": code}
		if a.Provider != "" {
			if err := pipeline.ReleaseFor(ctx, tx, a); err != nil {
				return err
			}
			detail["claim_released"] = map[string]any{"provider": a.Provider, "class": a.Class, "amount": a.Amount}
			p.count.Compensated("claim_released")
		}
		cmds, err := p.undoCommands(ctx, tx, reqID, a, now, &seq)
		if err != nil {
			return err
		}
		if len(cmds) > 0 {
			var kinds []string
			for _, c := range cmds {
				kinds = append(kinds, string(c.c.Kind)+" "+c.c.ID)
			}
			detail["commands"] = kinds
			p.count.Compensated("mdev_removal_queued")
		}
		why := reason
		if cause != nil && *cause != a.ID {
			why = "another vGPU of the request failed: " + reason
		}
		if err := requests.MarkFailed(ctx, tx, a.ID, why); err != nil {
			return err
		}
		d, _ := json.Marshal(detail)
		if err := requests.Audit(ctx, tx, requests.Entry{Actor: p.actor(), Action: "compensate", ObjectType: "attachment",
			ObjectID: a.ID.String(), RequestID: reqID.String(), Detail: d}); err != nil {
			return err
		}
	}
	// A profile change (vGPUs both made and taken back) brings back the
	// old vGPUs it had begun to take out: their claims are still held,
	// attach_vgpu creates their mdevs again.
	if len(atts) > 0 {
		if err := p.restoreReleases(ctx, tx, reqID, reason, now, &seq); err != nil {
			return err
		}
	}
	// Releases that did not finish: the vGPU stays where it is.
	return requests.AbandonReleases(ctx, tx, reqID, "release failed: "+reason)
}

// restoreReleases queues attach_vgpu (compensation) for each attachment
// the request was detaching from its domain (a detach_vgpu went out). A
// release without a detach (the domain is gone: a move, a delete) has
// nothing to come back to.
func (p *Path) restoreReleases(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, reason string, now time.Time, seq *int) error {
	rows, err := tx.Query(ctx, `SELECT `+requests.AttachmentColumns+` FROM vgpu_attachments a WHERE release_request_id = $1 AND state = 'releasing'
		AND EXISTS (SELECT 1 FROM commands c WHERE c.attachment_id = a.id AND c.request_id = $1 AND c.purpose = 'action'
			AND c.kind = 'detach_vgpu' AND c.sent_at IS NOT NULL AND coalesce(c.result_status, '') NOT IN ('failed', 'refused'))
		FOR UPDATE`, reqID)
	if err != nil {
		return err
	}
	old, err := requests.ScanAttachments(rows)
	if err != nil {
		return err
	}
	for _, a := range old {
		cs, err := AttachCommands(a, reqID.String(), now, now.Add(p.cfg.RequestTimeout))
		if err != nil {
			return err
		}
		if _, err := queueCompensation(ctx, tx, reqID, a.ID, cs, seq); err != nil {
			return err
		}
		d, _ := json.Marshal(map[string]any{"reason": reason, "commands": []string{string(protocol.AttachVGPU) + " " + cs[0].ID},
			"profile": a.Profile, "gpu": a.PCIAddress})
		if err := requests.Audit(ctx, tx, requests.Entry{Actor: p.actor(), Action: "restore", ObjectType: "attachment",
			ObjectID: a.ID.String(), RequestID: reqID.String(), Detail: d}); err != nil {
			return err
		}
		p.count.Compensated("vgpu_restored")
	}
	return nil
}

// undoCommands queues the compensation of an attachment: detach_vgpu when
// its attach_vgpu was sent, remove_mdev when its create_mdev was.
func (p *Path) undoCommands(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, a flow.Attachment, now time.Time, seq *int) ([]outCmd, error) {
	rows, err := tx.Query(ctx, `SELECT kind FROM commands WHERE attachment_id = $1 AND purpose = 'action' AND sent_at IS NOT NULL
		AND coalesce(result_status, '') NOT IN ('failed', 'refused')`, a.ID)
	if err != nil {
		return nil, err
	}
	sent := map[string]bool{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			rows.Close()
			return nil, err
		}
		sent[k] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return p.queueUndo(ctx, tx, reqID, a, sent[string(protocol.AttachVGPU)], sent[string(protocol.CreateMdev)] || sent[string(protocol.AttachVGPU)], now, seq)
}

func (p *Path) queueUndo(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, a flow.Attachment, detach, remove bool, now time.Time, seq *int) ([]outCmd, error) {
	if !detach && !remove {
		return nil, nil
	}
	all, err := ReleaseCommands(a, !detach, reqID.String(), now, now.Add(p.cfg.RequestTimeout))
	if err != nil {
		return nil, err
	}
	return queueCompensation(ctx, tx, reqID, a.ID, all, seq)
}

// queueCompensation writes cs, about attachment att, as the request's
// compensation commands, numbered on from *seq.
func queueCompensation(ctx context.Context, tx pgx.Tx, reqID, att uuid.UUID, cs []protocol.Command, seq *int) ([]outCmd, error) {
	out := make([]outCmd, 0, len(cs))
	for _, c := range cs {
		*seq++
		out = append(out, outCmd{c: c, seq: *seq, attachment: &att})
	}
	return out, insertCommands(ctx, tx, reqID, requests.PurposeCompensation, out)
}
