package pipeline

import (
	"context"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// What a path's own stage reads and writes of the decision it takes part
// in (package direct's, which makes vGPUs follow a Nova move or host
// maintenance): the facts, as the policy's evaluation reads them, and the
// decision's record.

// LoadFacts reads the facts of ev in w's transaction, as Evaluate does
// (the project's usage under the decision's quota guard).
func (d Decisions) LoadFacts(ctx context.Context, w *Work, ev policy.Event) (Facts, error) {
	f, _, err := d.facts.loadFacts(ctx, w.Tx, ev, w.hosts, usageRead{guard: w.quota})
	return f, err
}

// RecordDecision records decision dec with plan for w's event and request
// reqID (nil for none).
func (d Decisions) RecordDecision(ctx context.Context, w *Work, reqID *uuid.UUID, dec *policy.Decision, plan flow.Plan) error {
	return d.recordDecision(ctx, w.Tx, w.Row, reqID, dec, plan)
}

// ObserveOnly reports whether operators set observe-only mode when the
// event was read: nothing is acted on (controls.go).
func (r InboxRow) ObserveOnly() bool { return r.observeOnly }

// HostProblem says why the direct path cannot act on the instance's host
// (its agent's report missing, stale, or the host drained), with the
// code to fail with; "" when it can.
func HostProblem(f Facts) (why, code string) { return hostProblem(f) }
