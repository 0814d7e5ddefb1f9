package pipeline

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// factReader reads what a decision is taken on (state.go, quota.go): an
// event's instance, its vGPUs, its host's report and its project's usage
// and limits.
type factReader struct {
	staleAge time.Duration // [pipeline] stale_report_age
	catalog  Catalog       // may be nil
	limits   LimitSource   // nil: the policy file's quotas only
	log      *slog.Logger
	// aliases are the PCI aliases of Nova-owned VF GPUs (Config.NovaVFAliases).
	aliases map[string]placement.NovaVFAlias
}

// Decisions is what a stage uses to take part in the decision about an
// event, in the event's transaction (Work): read the facts, lock the
// project's quota before adding to it, record the decision, move the
// request on or close it. The pipeline's own stages and the paths' (package
// direct, package novaresize) hold it; Processor.Lend gives it.
type Decisions struct {
	facts    *factReader
	requests *requests.Store
	replica  string
}

// Close ends request reqID (in state) whose plan does nothing: rejected,
// or failed when the bridge cannot act (a request with further events
// waits for its last).
func (d Decisions) Close(ctx context.Context, w *Work, reqID uuid.UUID, state requests.State, plan flow.Plan) error {
	return d.closeWithout(ctx, w.Tx, w.Row, reqID, state, plan)
}

// Fail ends w's request without acting: the plan becomes a failure with
// code and reason (a request with further events waits for its last).
func (d Decisions) Fail(ctx context.Context, w *Work, code, reason string) error {
	w.Plan.Outcome, w.Plan.Code, w.Plan.Reason, w.Plan.Steps = flow.OutcomeFail, code, reason, nil
	return d.closeWithout(ctx, w.Tx, w.Row, w.Request, w.State, w.Plan)
}

// Notify records the notify steps among steps in the audit log.
func (d Decisions) Notify(ctx context.Context, w *Work, steps []flow.Step) error {
	return RecordNotify(ctx, w.Tx, d.actor(), w.Request, w.Facts.Instance.UUID, steps)
}

// Decided moves w's request to decided (or keeps it past that) in phase
// with reason.
func (d Decisions) Decided(ctx context.Context, w *Work, phase, reason string) error {
	_, err := d.requests.Transition(ctx, w.Tx, w.Request, NextState(w.State, requests.Decided), phase, reason, "")
	return err
}
