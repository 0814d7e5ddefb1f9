package novaresize

import (
	"cmp"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

func (p *Path) finishSucceeded(ctx context.Context, tx pgx.Tx, r resizeRow, how string) (err error) {
	defer wrapErr(&err, "end resize %s as succeeded", r.RequestID)
	if err := requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepDone}); err != nil {
		return err
	}
	reason := fmt.Sprintf("resized through Nova to flavor %s (%s) on host %s; the agent verified the vGPU; %s",
		r.FlavorName, r.what(), cmp.Or(r.TargetHost, "?"), how)
	switch r.Kind {
	case KindRelease:
		reason = fmt.Sprintf("resized through Nova to flavor %s (no vGPU) on host %s; %s", r.FlavorName, cmp.Or(r.TargetHost, "?"), how)
	case KindMove:
		reason = fmt.Sprintf("cold-migrated through Nova from host %s to host %s (flavor %s kept), off GPU %s; the agent verified the vGPU; %s",
			cmp.Or(r.SourceHost, "?"), cmp.Or(r.TargetHost, "?"), r.FlavorName, cmp.Or(r.LeaveGPU, "?"), how)
	}
	if r.Overdue {
		reason += fmt.Sprintf(" (after its deadline; [nova] on_deadline = %s)", p.cfg.OnDeadline)
	}
	// The change is recorded (bridge.vgpu_changed) whether or not the
	// request had ended: the server is on the new flavor either way.
	if err := pipeline.RecordChange(ctx, tx, pipeline.Change{Request: r.RequestID, Instance: r.Instance, Change: r.Kind, Path: pipeline.PathNova,
		Profile: r.Profile, Host: r.TargetHost}); err != nil {
		return err
	}
	if r.RequestState.Final() {
		return p.auditNova(ctx, tx, r, "nova_resize_end", map[string]any{"outcome": "succeeded", "reason": reason, "note": "the request had ended already"})
	}
	if err := p.pipe.SucceedRequest(ctx, tx, r.RequestID, reason); err != nil {
		return err
	}
	p.log.Info("nova resize: succeeded", logkey.RequestID, r.RequestID, logkey.Instance, r.Instance, "flavor", r.FlavorName, logkey.Host, r.TargetHost)
	return nil
}

func (p *Path) callConfirm(ctx context.Context, r resizeRow, srv computeapi.Server, state map[string]any) callOutcome {
	if r.RequestState.Final() && srv.Status == "VERIFY_RESIZE" {
		// Cancelled after the verification: undo rather than confirm.
		return callOutcome{audit: map[string]any{"call": "none", "server": state, "note": "the request ended before the confirm"},
			apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
				return p.startRevert(ctx, tx, r, flow.CodeCancelled, "the request ended before the resize was confirmed")
			}}
	}
	switch {
	case srv.Status == "VERIFY_RESIZE":
		if err := p.nova.ConfirmResize(ctx, srv.ID, r.NovaRequestID); err != nil {
			return p.retryOrFail("confirm resize", err, flow.CodeNovaError)
		}
		return callOutcome{audit: map[string]any{"call": "confirm_resize", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepConfirming, Deadline: p.cfg.ConfirmTimeout})
		}}
	case !srv.Resizing() && r.onTarget(srv.Flavor):
		return callOutcome{audit: map[string]any{"call": "none", "server": state, "note": "confirmed already"}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return p.finishSucceeded(ctx, tx, r, "the server is on the new flavor")
		}}
	case srv.Resizing():
		// resize_confirming: an earlier attempt's call is running.
		return callOutcome{audit: map[string]any{"call": "none", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepConfirming, Deadline: p.cfg.ConfirmTimeout})
		}}
	}
	return callOutcome{audit: map[string]any{"call": "none", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
		return p.finishFailed(ctx, tx, r, flow.CodeNovaFailed, fmt.Sprintf("cannot confirm the resize: server %s is %s (task state %s) on flavor %s%s",
			r.Instance, srv.Status, cmp.Or(srv.TaskState, "none"), srv.Flavor.Name, faultSuffix(srv.Fault)))
	}}
}
