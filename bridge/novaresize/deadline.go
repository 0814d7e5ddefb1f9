package novaresize

import (
	"cmp"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

// deadline handles one row whose step passed its deadline: it reads the
// server (a notification may have been lost) and moves on, reverts or
// fails. As for a call, the row is leased first (its deadline moves past
// the lease, committed) and the server is read with no transaction open.
func (p *Path) deadline(ctx context.Context) (_ bool, err error) {
	defer wrapErr(&err, "resize deadline")
	var lease resizeRow
	found := false
	err = p.pipe.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var ok bool
		var err error
		lease, ok, err = lockResize(ctx, tx, `r.step IN ('resizing','verifying','confirming','reverting') AND r.deadline_at < now() ORDER BY r.deadline_at`, true)
		if err != nil || !ok {
			return err
		}
		found = true
		// A resize past its deadline is overdue from now on, whatever the
		// read of the server finds: a late resize_finish.end meanwhile is
		// handled as late.
		return requests.LeaseResizeLook(ctx, tx, lease.RequestID, p.cfg.CallLease)
	})
	if err != nil || !found {
		return found, err
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.CallLease/2)
	srv, srvErr := p.nova.Server(cctx, lease.Instance, lease.NovaRequestID)
	cancel()
	return true, p.pipe.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		r, ok, err := lockResize(ctx, tx, `r.request_id = $1`, false, lease.RequestID)
		if err != nil || !ok || r.Step != lease.Step {
			return err // a notification moved the row on meanwhile
		}
		if err := srvErr; err != nil && !computeapi.IsNotFound(err) {
			// Try again at the next look, a little later.
			return requests.RetryResizeLook(ctx, tx, r.RequestID, p.cfg.RetryMax, err.Error())
		}
		if computeapi.IsNotFound(srvErr) {
			return p.finishFailed(ctx, tx, r, flow.CodeNoInstance, fmt.Sprintf("Nova has no server %s any more", r.Instance))
		}
		state := fmt.Sprintf("status %s, task state %s, flavor %s%s", srv.Status, cmp.Or(srv.TaskState, "none"), srv.Flavor.Name, faultSuffix(srv.Fault))
		if err := p.auditNova(ctx, tx, r, "nova_deadline", map[string]any{"step": r.Step, "server": state}); err != nil {
			return err
		}
		switch r.Step {
		case stepResizing:
			switch {
			case srv.Status == "VERIFY_RESIZE": // finished late, or the notification was lost
				r.FlavorName = cmp.Or(r.FlavorName, srv.Flavor.Name)
				_, err := p.finished(ctx, tx, r, srv.Host)
				return err
			case srv.Resizing():
				return p.followOverdue(ctx, tx, r, fmt.Sprintf("Nova has not finished the resize to %s within %s (server: %s); the bridge follows it to its end, then %s it ([nova] on_deadline)",
					cmp.Or(r.FlavorName, "?"), p.cfg.ResizeTimeout, state, map[bool]string{true: "reverts", false: "verifies and confirms"}[p.cfg.OnDeadline == OnDeadlineRevert]))
			case r.onTarget(srv.Flavor) && r.FlavorName != "":
				r.TargetHost = srv.Host
				return p.finishSucceeded(ctx, tx, r, "the server was found on the flavor after the deadline (confirmed by someone else, or by Nova's resize_confirm_window)")
			}
			return p.finishFailed(ctx, tx, r, flow.CodeNovaTimeout, fmt.Sprintf("Nova did not finish the resize to %s within %s and the server is no longer resizing (server: %s)",
				cmp.Or(r.FlavorName, "?"), p.cfg.ResizeTimeout, state))
		case stepVerifying:
			if err := requests.CancelUnsent(ctx, tx, r.RequestID); err != nil {
				return err
			}
			return p.startRevert(ctx, tx, r, flow.CodeAgentTimeout, fmt.Sprintf("the agent of host %s did not answer verify_vgpu within %s; is vgpu-agent running there and consuming %s?",
				r.TargetHost, p.cfg.VerifyTimeout, protocol.AgentQueue(r.TargetHost)))
		case stepConfirming:
			switch {
			case !srv.Resizing() && r.onTarget(srv.Flavor):
				return p.finishSucceeded(ctx, tx, r, "the server is on the new flavor (no confirm notification seen)")
			case srv.Status == "VERIFY_RESIZE": // the confirm call was lost: make it again
				return requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepConfirm, Due: true, ResetAttempts: true})
			case srv.Resizing():
				return p.followOverdue(ctx, tx, r, fmt.Sprintf("Nova has not confirmed the resize within %s (server: %s); the bridge follows it to its end",
					p.cfg.ConfirmTimeout, state))
			}
			return p.finishFailed(ctx, tx, r, flow.CodeNovaTimeout, fmt.Sprintf("Nova did not confirm the resize within %s (server: %s)", p.cfg.ConfirmTimeout, state))
		default: // reverting
			switch {
			case srv.Status == "VERIFY_RESIZE": // the revert call was lost: make it again
				return requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepRevert, Due: true, ResetAttempts: true})
			case srv.Resizing():
				return p.followOverdue(ctx, tx, r, fmt.Sprintf("Nova has not reverted the resize within %s (server: %s); the bridge follows it to its end",
					p.cfg.ConfirmTimeout, state))
			}
			return p.finishFailed(ctx, tx, r, cmp.Or(r.FailCode, flow.CodeVerifyFailed), r.FailReason+"; Nova reverted the resize")
		}
	})
}

// followOverdue keeps following a step Nova is still working on past its
// deadline: the server is read again every OverdueCheck, and the request
// (unless it ended) shows phase overdue with why.
func (p *Path) followOverdue(ctx context.Context, tx pgx.Tx, r resizeRow, why string) error {
	if err := requests.FollowResizeAt(ctx, tx, r.RequestID, p.cfg.OverdueCheck); err != nil {
		return fmt.Errorf("follow resize %s: %w", r.RequestID, err)
	}
	if r.RequestState.Final() || r.RequestPhase == flow.PhaseOverdue || r.RequestPhase == flow.PhaseCompensating {
		return nil
	}
	p.log.Warn("nova resize: past its deadline, followed to its end", logkey.RequestID, r.RequestID, logkey.Instance, r.Instance, "step", r.Step)
	_, err := p.reqs.Transition(ctx, tx, r.RequestID, r.RequestState, flow.PhaseOverdue, why, "")
	return err
}
