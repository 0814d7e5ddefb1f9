package novaresize

import (
	"cmp"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

// finishFailed ends a resize and fails its request (unless it already ended).
func (p *Path) finishFailed(ctx context.Context, tx pgx.Tx, r resizeRow, code, reason string) (err error) {
	defer wrapErr(&err, "end resize %s as failed", r.RequestID)
	if err := requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepDone}); err != nil {
		return err
	}
	if r.RequestState.Final() {
		return p.auditNova(ctx, tx, r, "nova_resize_end", map[string]any{"outcome": "failed", "code": code, "reason": reason,
			"note": "the request had ended already"})
	}
	return p.fail.FailRequest(ctx, tx, r.RequestID, code, reason)
}

// startRevert makes revertResize due; the request fails with code and
// reason once Nova reverted.
func (p *Path) startRevert(ctx context.Context, tx pgx.Tx, r resizeRow, code, reason string) (err error) {
	defer wrapErr(&err, "revert resize %s", r.RequestID)
	if err := requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepRevert, Due: true,
		Fail: &requests.ResizeFailure{Code: code, Reason: reason}, ResetAttempts: true}); err != nil {
		return err
	}
	if !r.RequestState.Final() {
		if _, err := p.reqs.Transition(ctx, tx, r.RequestID, r.RequestState, flow.PhaseCompensating, "reverting the resize: "+reason, code); err != nil {
			return err
		}
	}
	p.count.Compensated("resize_reverted")
	return p.auditNova(ctx, tx, r, "compensate", map[string]any{"revert_resize": true, "code": code, "reason": reason})
}

func (p *Path) callRevert(ctx context.Context, r resizeRow, srv computeapi.Server, state map[string]any) callOutcome {
	switch {
	case srv.Status == "VERIFY_RESIZE":
		if err := p.nova.RevertResize(ctx, srv.ID, r.NovaRequestID); err != nil {
			return p.retryOrFail("revert resize", err, flow.CodeNovaError)
		}
		return callOutcome{audit: map[string]any{"call": "revert_resize", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepReverting, Deadline: p.cfg.ConfirmTimeout})
		}}
	case srv.Resizing():
		return callOutcome{audit: map[string]any{"call": "none", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepReverting, Deadline: p.cfg.ConfirmTimeout})
		}}
	}
	return callOutcome{audit: map[string]any{"call": "none", "server": state, "note": "nothing to revert"}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
		return p.finishFailed(ctx, tx, r, cmp.Or(r.FailCode, flow.CodeVerifyFailed),
			fmt.Sprintf("%s; the server is %s on flavor %s", r.FailReason, srv.Status, srv.Flavor.Name))
	}}
}
