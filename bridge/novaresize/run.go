package novaresize

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

// Run makes the due Nova calls and handles passed deadlines until ctx
// ends; without Nova's API it returns at once.
func (p *Path) Run(ctx context.Context) error {
	if p.nova == nil {
		return nil
	}
	// Each round works through what is due, then waits for a wake-up (a
	// notification, a new resize) or the poll interval.
	return wake.Loop(ctx, p.wake, func(ctx context.Context) (time.Duration, error) {
		for ctx.Err() == nil && !p.paused(ctx) {
			did, err := p.Once(ctx)
			if err != nil && ctx.Err() == nil {
				p.log.Warn("nova resize: step failed", logkey.Err, err)
				break
			}
			if !did {
				break
			}
		}
		return p.cfg.PollInterval, nil
	})
}

// Once makes one due Nova call or handles one passed deadline; it reports
// whether it found one.
func (p *Path) Once(ctx context.Context) (bool, error) {
	if p.nova == nil {
		return false, nil
	}
	did, err := p.due(ctx)
	if did || err != nil {
		return did, err
	}
	return p.deadline(ctx)
}

// due leases one row whose call is due (its due_at moves past the
// lease, its attempts count up, committed), makes the call outside any
// transaction, then records the outcome under the row's lock.
func (p *Path) due(ctx context.Context) (_ bool, err error) {
	defer wrapErr(&err, "due Nova call")
	var r resizeRow
	found := false
	err = p.pipe.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var ok bool
		var err error
		r, ok, err = lockResize(ctx, tx, `r.step IN ('resize','confirm','revert') AND r.due_at <= now() ORDER BY r.due_at`, true)
		if err != nil || !ok {
			return err
		}
		found = true
		r.Attempts++
		return requests.LeaseResizeCall(ctx, tx, r.RequestID, p.cfg.CallLease, r.Attempts)
	})
	if err != nil || !found {
		return found, err
	}
	out := p.callNova(ctx, r)
	return true, p.pipe.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		cur, ok, err := lockResize(ctx, tx, `r.request_id = $1`, false, r.RequestID)
		if err != nil || !ok {
			return err
		}
		if cur.Step != r.Step || cur.Attempts != r.Attempts {
			// A notification moved the row on meanwhile (or another replica
			// took it over): the call is recorded, the row is not touched.
			return p.auditNova(ctx, tx, cur, "nova_call", out.audit)
		}
		if err := p.auditNova(ctx, tx, cur, "nova_call", out.audit); err != nil {
			return err
		}
		return out.apply(ctx, tx, cur)
	})
}

// callOutcome is what a Nova call did, applied under the row's lock.
type callOutcome struct {
	audit map[string]any
	apply func(ctx context.Context, tx pgx.Tx, r resizeRow) error
}

// retryOrFail reschedules a call after a retryable error, or fails the
// request after MaxAttempts or a final error.
func (p *Path) retryOrFail(op string, err error, failCode string) callOutcome {
	return callOutcome{audit: map[string]any{"call": op, "error": err.Error()}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
		if computeapi.IsRetryable(err) && r.Attempts < p.cfg.MaxAttempts {
			wait := backoff.Policy{Min: p.cfg.RetryMin, Max: p.cfg.RetryMax}.Delay(r.Attempts - 1)
			return requests.RetryResizeCall(ctx, tx, r.RequestID, wait, err.Error())
		}
		reason := fmt.Sprintf("%s: %v", op, err)
		if r.Step == stepRevert {
			reason = r.FailReason + "; and the revert failed: " + reason
			failCode = cmp.Or(r.FailCode, failCode)
		}
		return p.finishFailed(ctx, tx, r, failCode, reason)
	}}
}

func (p *Path) callNova(ctx context.Context, r resizeRow) callOutcome {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.CallLease/2)
	defer cancel()
	nc, id := p.nova, r.NovaRequestID
	srv, err := nc.Server(cctx, r.Instance, id)
	if computeapi.IsNotFound(err) {
		return callOutcome{audit: map[string]any{"call": "get server", "error": err.Error()}, apply: func(ctx context.Context, tx pgx.Tx, r resizeRow) error {
			return p.finishFailed(ctx, tx, r, flow.CodeNoInstance, fmt.Sprintf("Nova has no server %s", r.Instance))
		}}
	}
	if err != nil {
		return p.retryOrFail("get server", err, flow.CodeNovaError)
	}
	state := map[string]any{"status": srv.Status, "task_state": srv.TaskState, "host": srv.Host, "flavor": srv.Flavor.Name}
	switch r.Step {
	case stepResize:
		return p.callResize(cctx, r, srv, state)
	case stepConfirm:
		return p.callConfirm(cctx, r, srv, state)
	default:
		return p.callRevert(cctx, r, srv, state)
	}
}

func faultSuffix(f string) string {
	if f == "" {
		return ""
	}
	return "; fault: " + f
}
