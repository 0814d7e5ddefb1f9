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

func (p *Path) callResize(ctx context.Context, r resizeRow, srv computeapi.Server, state map[string]any) callOutcome {
	if r.Kind == KindMove {
		return p.callMigrate(ctx, r, srv, state)
	}
	if r.RequestState.Final() {
		return callOutcome{audit: map[string]any{"call": "none", "server": state, "note": "the request ended before the resize"},
			apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
				return requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepDone})
			}}
	}
	if srv.Resizing() || (r.ResizeSent && r.onTarget(srv.Flavor)) {
		if r.ResizeSent {
			// An earlier attempt's call reached Nova before its outcome was
			// recorded: follow that resize.
			return callOutcome{audit: map[string]any{"call": "none", "server": state, "note": "a resize is under way: an earlier attempt's call"},
				apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
					if srv.Status == "VERIFY_RESIZE" {
						r.FlavorName = srv.Flavor.Name
						if err := requests.SetResizeFlavorName(ctx, tx, r.RequestID, srv.Flavor.Name); err != nil {
							return err
						}
						_, err := p.finished(ctx, tx, r, srv.Host)
						return err
					}
					if !srv.Resizing() { // confirmed already
						r.FlavorName, r.TargetHost = srv.Flavor.Name, srv.Host
						return p.finishSucceeded(ctx, tx, r, "the server was found on the flavor")
					}
					return p.resizeCalled(ctx, tx, r, "", srv.Flavor.Name, srv.Flavor.Name)
				}}
		}
		return callOutcome{audit: map[string]any{"call": "none", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return p.finishFailed(ctx, tx, r, flow.CodeBusy, fmt.Sprintf("server %s is being resized already (status %s, task state %s); retry when it is finished",
				r.Instance, srv.Status, cmp.Or(srv.TaskState, "none")))
		}}
	}
	flavors, err := p.nova.Flavors(ctx, r.NovaRequestID)
	if err != nil {
		return p.retryOrFail("list flavors", err, flow.CodeNovaError)
	}
	var fl computeapi.Flavor
	if r.Kind == KindRelease {
		fl, err = computeapi.ChooseReleaseFlavor(srv.Flavor, flavors)
	} else {
		fl, err = computeapi.ChooseFlavor(srv.Flavor, flavors, r.want())
	}
	if err == nil && fl.Name == srv.Flavor.Name {
		err = fmt.Errorf("%w: the server is on flavor %s already", computeapi.ErrNoFlavor, fl.Name)
	}
	if err != nil {
		return callOutcome{audit: map[string]any{"call": "none", "server": state, "error": err.Error()}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return p.finishFailed(ctx, tx, r, flow.CodeNoFlavor, err.Error())
		}}
	}
	// Committed before the call: should the bridge die before recording
	// the outcome, the next attempt follows the resize under way instead
	// of calling again.
	if err := requests.MarkResizeSent(ctx, p.pool, r.RequestID); err != nil {
		return p.retryOrFail("record the resize call", &computeapi.Error{Op: "record", Kind: computeapi.KindRetryable, Err: err}, flow.CodeNovaError)
	}
	if err := p.nova.Resize(ctx, srv.ID, fl.ID, r.NovaRequestID); err != nil {
		code := flow.CodeNovaError
		return p.retryOrFail(fmt.Sprintf("resize to flavor %s (%s)", fl.Name, fl.ID), err, code)
	}
	return callOutcome{audit: map[string]any{"call": "resize", "flavor_id": fl.ID, "flavor": fl.Name, "old_flavor": srv.Flavor.Name, "server": state},
		apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return p.resizeCalled(ctx, tx, r, fl.ID, fl.Name, srv.Flavor.Name)
		}}
}

func (p *Path) resizeCalled(ctx context.Context, tx pgx.Tx, r resizeRow, flavorID, flavorName, oldFlavor string) (err error) {
	defer wrapErr(&err, "resize %s called", r.RequestID)
	if err := requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepResizing, Deadline: p.cfg.ResizeTimeout,
		Called: &requests.ResizeCall{FlavorID: flavorID, FlavorName: flavorName, OldFlavor: oldFlavor}}); err != nil {
		return err
	}
	to := r.RequestState
	if to == requests.Decided {
		to = requests.Dispatched
	}
	why := fmt.Sprintf("Nova resizes the server from flavor %s to %s (%s)", cmp.Or(oldFlavor, "?"), flavorName, r.what())
	if r.Kind == KindMove {
		why = fmt.Sprintf("Nova cold-migrates the server (flavor %s) off GPU %s of host %s", flavorName, cmp.Or(r.LeaveGPU, "?"), cmp.Or(r.SourceHost, "?"))
	}
	_, err = p.reqs.Transition(ctx, tx, r.RequestID, to, flow.PhaseResizing, why, "")
	return err
}

// callMigrate is callResize for a move: Nova's migrate action, the flavor
// unchanged, the host Nova's scheduler's choice (a flavor that forbids the
// fault trait keeps it off the faulted GPU; verify checks it did).
func (p *Path) callMigrate(ctx context.Context, r resizeRow, srv computeapi.Server, state map[string]any) callOutcome {
	if r.RequestState.Final() {
		return callOutcome{audit: map[string]any{"call": "none", "server": state, "note": "the request ended before the migration"},
			apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
				return requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepDone})
			}}
	}
	if r.ResizeSent {
		// An earlier attempt's call may have reached Nova before its
		// outcome was recorded: follow what Nova did.
		return callOutcome{audit: map[string]any{"call": "none", "server": state, "note": "a migration may be under way: an earlier attempt's call"},
			apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
				switch {
				case srv.Status == "VERIFY_RESIZE":
					_, err := p.finished(ctx, tx, r, srv.Host)
					return err
				case srv.Resizing():
					return p.resizeCalled(ctx, tx, r, srv.Flavor.ID, srv.Flavor.Name, srv.Flavor.Name)
				case srv.Host != r.SourceHost:
					r.FlavorName, r.TargetHost = srv.Flavor.Name, srv.Host
					return p.finishSucceeded(ctx, tx, r, "the server was found on host "+srv.Host)
				}
				return p.finishFailed(ctx, tx, r, flow.CodeNovaFailed, fmt.Sprintf("the cold migration of server %s did not take place: it is %s on host %s",
					r.Instance, srv.Status, srv.Host))
			}}
	}
	if srv.Resizing() || srv.Status != "ACTIVE" && srv.Status != "SHUTOFF" {
		return callOutcome{audit: map[string]any{"call": "none", "server": state}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return p.finishFailed(ctx, tx, r, flow.CodeBusy, fmt.Sprintf("server %s cannot be migrated now (status %s, task state %s); retry when it is ACTIVE or SHUTOFF",
				r.Instance, srv.Status, cmp.Or(srv.TaskState, "none")))
		}}
	}
	if err := requests.MarkResizeSent(ctx, p.pool, r.RequestID); err != nil {
		return p.retryOrFail("record the migrate call", &computeapi.Error{Op: "record", Kind: computeapi.KindRetryable, Err: err}, flow.CodeNovaError)
	}
	if err := p.nova.Migrate(ctx, srv.ID, "", r.NovaRequestID); err != nil {
		return p.retryOrFail("cold-migrate", err, flow.CodeNovaError)
	}
	return callOutcome{audit: map[string]any{"call": "migrate", "flavor": srv.Flavor.Name, "source_host": srv.Host, "leave_gpu": r.LeaveGPU, "server": state},
		apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return p.resizeCalled(ctx, tx, r, srv.Flavor.ID, srv.Flavor.Name, srv.Flavor.Name)
		}}
}
