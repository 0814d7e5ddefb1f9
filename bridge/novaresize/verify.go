package novaresize

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
)

// finished goes on from a resize Nova finished (VERIFY_RESIZE) on host:
// to the agent's verification, or straight to the confirm for a release
// (there is no vGPU to verify); a resize that finished after its deadline
// is reverted instead when [nova] on_deadline says so. outbox is true
// when a command was queued.
func (p *Path) finished(ctx context.Context, tx pgx.Tx, r resizeRow, host string) (outbox bool, err error) {
	if (r.Overdue || r.DeadlinePassed) && p.cfg.OnDeadline == OnDeadlineRevert {
		r.TargetHost = host
		if err := requests.SetResizeTarget(ctx, tx, r.RequestID, host); err != nil {
			return false, err
		}
		return false, p.startRevert(ctx, tx, r, flow.CodeNovaTimeout, fmt.Sprintf("Nova finished the resize to %s on host %s after its deadline (%s); "+
			"reverting it as [nova] on_deadline = revert says", cmp.Or(r.FlavorName, "the new flavor"), host, p.cfg.ResizeTimeout))
	}
	if r.Kind != KindRelease {
		return true, p.queueVerify(ctx, tx, r, host)
	}
	if err := requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepConfirm, Due: true, TargetHost: host, ResetAttempts: true}); err != nil {
		return false, err
	}
	if !r.RequestState.Final() {
		to := r.RequestState
		if to == requests.Decided {
			to = requests.Dispatched
		}
		if _, err := p.reqs.Transition(ctx, tx, r.RequestID, to, flow.PhaseConfirming,
			fmt.Sprintf("Nova finished the resize to %s (no vGPU) on host %s; confirming it", cmp.Or(r.FlavorName, "the new flavor"), host), ""); err != nil {
			return false, err
		}
	}
	p.kick()
	return false, nil
}

// queueVerify sends verify_vgpu to the target host's agent.
func (p *Path) queueVerify(ctx context.Context, tx pgx.Tx, r resizeRow, host string) (err error) {
	defer wrapErr(&err, "verify resize %s on host %s", r.RequestID, host)
	now := time.Now()
	c, err := pipeline.NewCommand(protocol.VerifyVGPU, host, r.RequestID.String(), r.Instance,
		protocol.VerifyParams{TypeID: r.TypeID, Count: r.Count}, now, now.Add(p.cfg.VerifyTimeout))
	if err != nil {
		return err
	}
	if err := pipeline.QueueAction(ctx, tx, r.RequestID, c); err != nil {
		return err
	}
	if err := requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepVerifying, Deadline: p.cfg.VerifyTimeout,
		TargetHost: host, VerifyCommand: c.ID}); err != nil {
		return err
	}
	if !r.RequestState.Final() {
		to := r.RequestState
		if to == requests.Decided {
			to = requests.Dispatched
		}
		if _, err := p.reqs.Transition(ctx, tx, r.RequestID, to, flow.PhaseVerifying,
			fmt.Sprintf("Nova finished the resize to %s on host %s; the agent verifies the vGPU", cmp.Or(r.FlavorName, "the new flavor"), host), ""); err != nil {
			return err
		}
	}
	return nil
}

// result takes the agent's answer to a verify_vgpu of the Nova path.
// handled is false for results of other requests.
func (p *Path) result(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, host, kind string, res protocol.Result) (_ bool, err error) {
	defer wrapErr(&err, "verification of resize %s", reqID)
	r, ok, err := lockResize(ctx, tx, `r.request_id = $1`, false, reqID)
	if err != nil || !ok {
		return false, err
	}
	if r.Step != stepVerifying || r.VerifyCommand == nil || r.VerifyCommand.String() != strings.ToLower(res.CommandID) {
		return true, nil // an old verification
	}
	if err := p.auditNova(ctx, tx, r, "nova_verify", map[string]any{"command_id": res.CommandID, "status": res.Status, "code": res.Code,
		"message": res.Message, "details": res.Details}); err != nil {
		return true, err
	}
	if res.Status != protocol.Succeeded {
		return true, p.startRevert(ctx, tx, r, flow.CodeVerifyFailed, pipeline.DescribeResult(host, kind, res))
	}
	if r.RequestState.Final() {
		return true, p.startRevert(ctx, tx, r, flow.CodeVerifyFailed, "the request ended while the agent verified the vGPU")
	}
	if on := stillOn(r, host, res.Details); on != "" {
		return true, p.startRevert(ctx, tx, r, flow.CodeNoCapacity, on)
	}
	if err := requests.SetResizeStep(ctx, tx, r.RequestID, requests.ResizeStep{Step: stepConfirm, Due: true, ResetAttempts: true}); err != nil {
		return true, err
	}
	if _, err := p.reqs.Transition(ctx, tx, r.RequestID, r.RequestState, flow.PhaseConfirming,
		fmt.Sprintf("the agent of host %s verified %s; confirming the resize", host, r.what()), ""); err != nil {
		return true, err
	}
	p.kick()
	return true, nil
}

// stillOn says why a move's verified vGPUs did not leave their GPU: Nova's
// scheduler put one back on it (the flavor does not forbid the fault
// trait, and the migration stayed on the host). "" for other kinds.
func stillOn(r resizeRow, host string, details json.RawMessage) string {
	if r.Kind != KindMove || r.LeaveGPU == "" || host != r.SourceHost {
		return ""
	}
	var d struct {
		VGPUs []struct {
			Parent string `json:"parent"`
		} `json:"vgpus"`
	}
	if json.Unmarshal(details, &d) != nil {
		return ""
	}
	for _, v := range d.VGPUs {
		if strings.EqualFold(v.Parent, r.LeaveGPU) {
			return fmt.Sprintf("Nova's scheduler migrated the server to the same GPU %s of host %s: its flavor does not forbid the GPU fault trait "+
				"(vgpuctl flavor plan prints flavors that do); reverting the migration", r.LeaveGPU, host)
		}
	}
	return ""
}
