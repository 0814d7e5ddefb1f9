package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// ResultTaker takes the agent results of requests another package runs
// (the Nova-native resize's verify_vgpu), in HandleResult's transaction
// after the command is recorded finished.
type ResultTaker interface {
	TakeResult(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, host, kind string, r protocol.Result) (taken bool, err error)
}

// HandleResult records an agent's result and moves its request on: the
// next phase, success once every command of the request succeeded, or
// failure and compensation. Duplicate and unknown results are ignored.
func (p *Processor) HandleResult(ctx context.Context, r protocol.Result) (err error) {
	defer wrapErr(&err, "result of command %s", r.CommandID)
	outbox, changed := false, false
	err = p.rounds(ctx, p.d.Pool, func(ctx context.Context, tx pgx.Tx) error {
		outbox, changed = false, false
		body, _ := json.Marshal(r)
		c, ok, err := requests.FinishCommandOnce(ctx, tx, r.CommandID, r.Host, string(r.Status), body)
		if err != nil {
			return fmt.Errorf("result of %s: %w", r.CommandID, err)
		}
		if !ok {
			p.unrecorded(ctx, tx, r)
			return nil
		}
		reqID, purpose, kind, host, attID := c.Request, c.Purpose, c.Kind, c.Host, c.Attachment
		p.m.results.WithLabelValues(kind, string(r.Status)).Inc()
		if reqID == nil {
			return nil
		}
		if purpose == PurposeCompensation {
			detail, _ := json.Marshal(map[string]any{"command_id": r.CommandID, "kind": kind, "status": r.Status, "code": r.Code, "message": r.Message})
			if err := requests.Audit(ctx, tx, requests.Entry{Actor: p.actor(), Action: "compensation_result", ObjectType: "command",
				ObjectID: r.CommandID, RequestID: reqID.String(), Detail: detail}); err != nil {
				return err
			}
			if kind == string(protocol.AttachVGPU) && r.Status != protocol.Succeeded && attID != nil {
				return p.restoreFailed(ctx, tx, *reqID, *attID, DescribeResult(host, kind, r))
			}
			return nil
		}
		for _, rt := range p.results { // the Nova-native resize's verification
			if taken, err := rt.TakeResult(ctx, tx, *reqID, host, kind, r); err != nil || taken {
				return err
			}
		}
		// The request, locked, what of it is still open, and what its
		// completion reads (requestView).
		var st string
		var nextKind *string
		var openFailed bool
		var rv requestView
		if err := tx.QueryRow(ctx, `SELECT r.state,
				(SELECT kind FROM commands WHERE request_id = $1 AND purpose = 'action' AND finished_at IS NULL ORDER BY seq LIMIT 1),
				EXISTS (SELECT 1 FROM commands WHERE request_id = $1 AND purpose = 'action' AND finished_at IS NOT NULL AND result_status <> 'succeeded'),
				EXISTS (SELECT 1 FROM vgpu_attachments WHERE release_request_id = $1 AND state = 'releasing'),
				coalesce(r.instance_uuid::text, ''), coalesce(r.body->>'move', ''), coalesce(r.body->>'workload', ''),
				coalesce(a.profile, ''), coalesce(a.host, '')
			FROM requests r LEFT JOIN LATERAL (SELECT profile, host FROM vgpu_attachments
				WHERE request_id = r.id AND state IN ('pending', 'attached') ORDER BY created_at LIMIT 1) a ON true
			WHERE r.id = $1 FOR UPDATE OF r`, *reqID).Scan(&st, &nextKind, &openFailed,
			&rv.releasing, &rv.instance, &rv.move, &rv.workload, &rv.profile, &rv.host); err != nil {
			return err
		}
		state := requests.State(st)
		if state.Final() {
			// A late answer for a request that already ended: undo what the
			// command did if it succeeded.
			if r.Status == protocol.Succeeded && attID != nil && (kind == string(protocol.CreateMdev) || kind == string(protocol.AttachVGPU)) {
				outbox = true
				return p.undoLate(ctx, tx, *reqID, *attID, kind == string(protocol.AttachVGPU))
			}
			return nil
		}
		if r.Status != protocol.Succeeded {
			code := flow.CodeAgentFailed
			if r.Status == protocol.Refused {
				code = flow.CodeAgentRefused
			}
			outbox = true
			return p.failRequest(ctx, tx, *reqID, code, DescribeResult(host, kind, r), attID)
		}
		if state == requests.Decided {
			if _, err := p.d.Requests.Transition(ctx, tx, *reqID, requests.Dispatched, flow.PhaseOf(protocol.Kind(kind)), "", ""); err != nil {
				return err
			}
			state = requests.Dispatched
		}
		if nextKind != nil {
			outbox = true
			_, err := p.d.Requests.Transition(ctx, tx, *reqID, state, flow.PhaseOf(protocol.Kind(*nextKind)), "", "")
			return err
		}
		if openFailed {
			return nil // failed before; nothing more to do
		}
		changed, err = p.complete(ctx, tx, *reqID, r.FinishedAt, rv)
		return err
	})
	if err == nil && outbox && p.d.OnOutbox != nil {
		p.d.OnOutbox()
	}
	if err == nil && changed {
		p.Wake() // its bridge.vgpu_changed event, committed
	}
	return err
}

// unrecorded says why result r recorded nothing: its command is unknown,
// or answered already (a duplicate delivery), or another host's.
func (p *Processor) unrecorded(ctx context.Context, tx pgx.Tx, r protocol.Result) {
	var host string
	var finished bool
	err := tx.QueryRow(ctx, `SELECT host, finished_at IS NOT NULL FROM commands WHERE id::text = $1`, r.CommandID).Scan(&host, &finished)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		p.log.Debug("pipeline: result of an unknown command", logkey.Command, r.CommandID, logkey.Host, r.Host)
	case err != nil, finished: // a duplicate delivery
	default:
		p.log.Warn("pipeline: result from another host than the command's; ignored", logkey.Command, r.CommandID, logkey.Host, r.Host, "want", host)
	}
}

// DescribeResult says what an agent answered to a command, for a
// request's reason.
func DescribeResult(host, kind string, r protocol.Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "agent of host %s: %s %s", host, kind, r.Status)
	if r.Code != "" {
		fmt.Fprintf(&b, " (%s", r.Code)
		if r.NvidiaCode != 0 {
			fmt.Fprintf(&b, ", NVIDIA code %d", r.NvidiaCode)
		}
		b.WriteString(")")
	}
	if r.Message != "" {
		b.WriteString(": " + r.Message)
	}
	if r.Remediation != "" {
		b.WriteString("; remediation: " + r.Remediation)
	}
	return b.String()
}

// complete ends a request whose commands all succeeded: new attachments
// are attached; released ones give their claim back. at is the agent's
// time of the last command (their usage begins or ends then).
// rv is the request as read, locked, in the same transaction.
//
// changed reports that it wrote a bridge.vgpu_changed event the pipeline
// is to decide (the caller wakes it once the transaction committed).
func (p *Processor) complete(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, at time.Time, rv requestView) (changed bool, err error) {
	defer wrapErr(&err, "complete request %s", reqID)
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
			if err := p.releaseFor(ctx, a); err != nil {
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
		c.unheard = !p.d.Policy.Policy().Listens(KindVGPUChanged)
		if err := RecordChange(ctx, tx, c); err != nil {
			return false, err
		}
		if c.unheard {
			p.m.events.WithLabelValues(string(flow.OutcomeNothing)).Inc()
		}
		changed = !c.unheard
	}
	if _, err := p.d.Requests.Transition(ctx, tx, reqID, requests.Succeeded, "", reason, ""); err != nil {
		return false, err
	}
	p.m.requests.WithLabelValues(string(requests.Succeeded)).Inc()
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
	profile, host            string
}

// failRequest fails a request with code and reason and compensates what
// it did: for each attachment it was creating, the Placement claim is
// released and, for what reached the agent, detach_vgpu / remove_mdev are
// queued; attachments it was releasing stay attached. Unsent commands are
// cancelled. Everything is recorded in audit_log. cause, when set, is the
// attachment whose command failed.
func (p *Processor) failRequest(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, code, reason string, cause *uuid.UUID) (err error) {
	defer wrapErr(&err, "fail request %s", reqID)
	var st string
	if err := tx.QueryRow(ctx, `SELECT state FROM requests WHERE id = $1 FOR UPDATE`, reqID).Scan(&st); err != nil {
		return err
	}
	state := requests.State(st)
	if state.Final() {
		return nil
	}
	if state != requests.Accepted {
		if _, err := p.d.Requests.Transition(ctx, tx, reqID, state, flow.PhaseCompensating, reason, code); err != nil {
			return err
		}
	}
	if err := p.compensate(ctx, tx, reqID, code, reason, cause); err != nil {
		return err
	}
	if _, err := p.d.Requests.Transition(ctx, tx, reqID, requests.Failed, "", reason, code); err != nil {
		return err
	}
	p.m.requests.WithLabelValues(string(requests.Failed)).Inc()
	p.log.Info("pipeline: request failed", logkey.RequestID, reqID, logkey.Code, code, logkey.Reason, reason)
	return nil
}

// compensate undoes what a request did that is not finished: see
// failRequest. The request's state is the caller's.
func (p *Processor) compensate(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, code, reason string, cause *uuid.UUID) (err error) {
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
			if err := p.releaseFor(ctx, a); err != nil {
				return err
			}
			detail["claim_released"] = map[string]any{"provider": a.Provider, "class": a.Class, "amount": a.Amount}
			p.m.compensations.WithLabelValues("claim_released").Inc()
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
			p.m.compensations.WithLabelValues("mdev_removal_queued").Inc()
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
func (p *Processor) restoreReleases(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, reason string, now time.Time, seq *int) error {
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
		p.m.compensations.WithLabelValues("vgpu_restored").Inc()
	}
	return nil
}

// restoreFailed records that the old vGPU a failed profile change gave
// back (restoreReleases) could not be attached again: the instance has no
// vGPU of it, so its claim is released and the attachment ends failed
// with why, in the audit log and the log as well.
func (p *Processor) restoreFailed(ctx context.Context, tx pgx.Tx, reqID, attID uuid.UUID, why string) error {
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
		if err := p.releaseFor(ctx, a); err != nil {
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
	p.m.compensations.WithLabelValues("restore_failed").Inc()
	p.log.Warn("pipeline: the old vGPU of a failed profile change could not be restored", logkey.RequestID, reqID, logkey.Instance, a.InstanceUUID,
		"attachment", a.ID, logkey.Err, why)
	return nil
}

// compensateEnded compensates requests that ended while their vGPUs were
// in flight without the pipeline ending them (an operator's cancel).
func (p *Processor) compensateEnded(ctx context.Context) (int, error) {
	n := 0
	for {
		done := false
		err := p.rounds(ctx, p.d.Pool, func(ctx context.Context, tx pgx.Tx) error {
			var id uuid.UUID
			var st, reason, code string
			err := tx.QueryRow(ctx, `SELECT r.id, r.state, coalesce(r.reason,''), coalesce(r.code,'') FROM requests r
				WHERE r.state IN ('failed','rejected') AND EXISTS (SELECT 1 FROM vgpu_attachments a
					WHERE (a.request_id = r.id AND a.state = 'pending') OR (a.release_request_id = r.id AND a.state = 'releasing'))
				LIMIT 1 FOR UPDATE OF r SKIP LOCKED`).Scan(&id, &st, &reason, &code)
			if errors.Is(err, pgx.ErrNoRows) {
				done = true
				return nil
			}
			if err != nil {
				return err
			}
			return p.compensate(ctx, tx, id, code, fmt.Sprintf("request %s while in flight: %s", st, orDefault(reason, code)), nil)
		})
		if err != nil || done {
			return n, err
		}
		n++
	}
}

// undoCommands queues the compensation of an attachment: detach_vgpu when
// its attach_vgpu was sent, remove_mdev when its create_mdev was.
func (p *Processor) undoCommands(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, a flow.Attachment, now time.Time, seq *int) ([]outCmd, error) {
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

func (p *Processor) queueUndo(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, a flow.Attachment, detach, remove bool, now time.Time, seq *int) ([]outCmd, error) {
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
	return out, insertCommands(ctx, tx, reqID, PurposeCompensation, out)
}

// undoLate compensates a create or attach that succeeded after its
// request had already ended.
func (p *Processor) undoLate(ctx context.Context, tx pgx.Tx, reqID, attID uuid.UUID, attached bool) (err error) {
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

// CheckDeadlines fails the requests whose deadline passed without every
// answer, with the reason naming the command and host that did not
// answer, and compensates them. Replicas share the work (SKIP LOCKED).
func (p *Processor) CheckDeadlines(ctx context.Context) (int, error) {
	n := 0
	for {
		done := false
		err := p.rounds(ctx, p.d.Pool, func(ctx context.Context, tx pgx.Tx) error {
			var id uuid.UUID
			err := tx.QueryRow(ctx, `SELECT id FROM requests WHERE state IN ('accepted','decided','dispatched')
				AND deadline_at IS NOT NULL AND deadline_at < now() ORDER BY deadline_at LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&id)
			if errors.Is(err, pgx.ErrNoRows) {
				done = true
				return nil
			}
			if err != nil {
				return err
			}
			code, reason, err := p.timeoutReason(ctx, tx, id)
			if err != nil {
				return err
			}
			return p.failRequest(ctx, tx, id, code, reason, nil)
		})
		if err != nil {
			return n, err
		}
		if done {
			m, err := p.compensateEnded(ctx)
			return n + m, err
		}
		n++
		if p.d.OnOutbox != nil {
			p.d.OnOutbox()
		}
	}
}

func (p *Processor) timeoutReason(ctx context.Context, tx pgx.Tx, id uuid.UUID) (string, string, error) {
	var cmdID, kind, host string
	var sentAt *time.Time
	var deadline time.Time
	err := tx.QueryRow(ctx, `SELECT c.id::text, c.kind, c.host, c.sent_at, r.deadline_at FROM commands c JOIN requests r ON r.id = c.request_id
		WHERE c.request_id = $1 AND c.purpose = 'action' AND (c.finished_at IS NULL OR c.result_status IN ('expired','cancelled'))
		ORDER BY c.seq LIMIT 1`, id).Scan(&cmdID, &kind, &host, &sentAt, &deadline)
	if errors.Is(err, pgx.ErrNoRows) {
		return flow.CodeAgentTimeout, fmt.Sprintf("the request did not finish within %s", p.cfg.RequestTimeout), nil
	}
	if err != nil {
		return "", "", err
	}
	if sentAt == nil {
		return flow.CodeNotPublished, fmt.Sprintf("command %s (%s) for host %s could not be published to RabbitMQ before the deadline %s",
			kind, cmdID, host, deadline.UTC().Format(time.RFC3339)), nil
	}
	return flow.CodeAgentTimeout, fmt.Sprintf("the agent of host %s did not answer %s (command %s, sent %s) by the deadline %s; is vgpu-agent running there and consuming %s?",
		host, kind, cmdID, sentAt.UTC().Format(time.RFC3339), deadline.UTC().Format(time.RFC3339), protocol.AgentQueue(host)), nil
}

// wrapErr prefixes *errp, when set, with what failed and its ids; the
// cause stays reachable (errors.Is, errors.As).
func wrapErr(errp *error, format string, args ...any) {
	if *errp != nil {
		*errp = fmt.Errorf(format+": %w", append(args, *errp)...)
	}
}

// InTx runs fn in a transaction of the pipeline's pool, as the pipeline
// runs its own: FailRequest inside it may give claims back to Placement
// between rounds, never inside the transaction.
func (p *Processor) InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return p.rounds(ctx, p.d.Pool, fn)
}

// FailRequest fails a request and compensates what it did (see
// failRequest); it must run inside InTx.
func (p *Processor) FailRequest(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, code, reason string) error {
	return p.failRequest(ctx, tx, reqID, code, reason, nil)
}

// SucceedRequest ends a request that another package ran (a resize
// through Nova) as succeeded with reason.
func (p *Processor) SucceedRequest(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, reason string) error {
	if _, err := p.d.Requests.Transition(ctx, tx, reqID, requests.Succeeded, "", reason, ""); err != nil {
		return fmt.Errorf("request %s succeeded: %w", reqID, err)
	}
	p.m.requests.WithLabelValues(string(requests.Succeeded)).Inc()
	return nil
}

// Compensated counts a compensation step another package took.
func (p *Processor) Compensated(step string) { p.m.compensations.WithLabelValues(step).Inc() }

// QueueAction queues command c as the next action of request reqID.
func QueueAction(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, c protocol.Command) error {
	var seq int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM commands WHERE request_id = $1`, reqID).Scan(&seq); err != nil {
		return fmt.Errorf("request %s: next command: %w", reqID, err)
	}
	return insertCommands(ctx, tx, reqID, PurposeAction, []outCmd{{c: c, seq: seq + 1}})
}
