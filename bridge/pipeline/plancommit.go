package pipeline

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// A decision whose acts wait for their claims commits its plan in one
// statement (writePlan): the planned claims of each act (PlanClaims),
// the decision and the policy's load state (the Record stage), the check
// that the project's usage did not move since the decision read it
// (LockQuota's second read), and the instance's session lock that keeps
// other replicas off the instance until the claims are recorded or given
// back (decideLocked). Each of these was a statement of its own.

// plannedWrite is the planned claims of one act, written by writePlan.
type plannedWrite struct {
	request  uuid.UUID
	instance string
	claims   []requests.PlannedClaim
}

// PlanClaims plans the claims of request reqID's act for instance, in
// the decision's first transaction: the project's usage is locked now (as
// LockQuota does), and the claims are written, with the check that the
// usage did not move, by the statement that commits the plan
// (writePlan). The planned claims count in the project's usage from its
// commit on.
func (d Decisions) PlanClaims(ctx context.Context, w *Work, reqID uuid.UUID, instance string, planned []requests.PlannedClaim) error {
	g := w.quota
	if g != nil && g.unified != nil && g.unified.err != nil && g.unified.project == g.project {
		// The unified limits could not be read: what adds waits.
		return g.unified.err
	}
	if g != nil && !g.locked && g.project != "" {
		if err := lockProject(ctx, w.Tx, g.project); err != nil {
			return err
		}
		g.locked, g.recheck = true, true
	}
	w.planned = append(w.planned, plannedWrite{request: reqID, instance: instance, claims: planned})
	return nil
}

// writePlan writes, in one statement, the planned claims of w's acts
// with more (the decision, the policy's state), checks the project's
// usage when PlanClaims locked it (errQuotaMoved when it moved), and
// takes the session lock of the event's instance when the decision
// holds none (Work.sessionLocked; decideLocked gives it back).
func (d Decisions) writePlan(ctx context.Context, w *Work, more ...store.Part) error {
	parts := make([]store.Part, 0, len(w.planned)+len(more))
	for _, pw := range w.planned {
		parts = append(parts, requests.PlanClaimsPart(w.Row.ID, pw.request, pw.instance, pw.claims))
	}
	parts = append(parts, more...)
	w.planned, w.planWritten = nil, true
	key := ""
	if w.Row.InstanceUUID != "" && w.held == "" && len(w.pending) > 0 {
		key = "vgpu-instance:" + w.Row.InstanceUUID
	}
	g := w.quota
	recheck := g != nil && g.recheck
	final := store.Part{SQL: `SELECT CASE WHEN $1::text <> '' THEN pg_try_advisory_lock(hashtextextended($1::text, 0)) END,
		NULL::text, NULL::int, NULL::jsonb`, Args: []any{key}}
	if recheck {
		final = store.Part{SQL: `SELECT l.locked, u.p, u.n, u.d FROM (SELECT CASE WHEN $2::text <> ''
				THEN pg_try_advisory_lock(hashtextextended($2::text, 0)) END AS locked OFFSET 0) l
			LEFT JOIN (` + projectUsageSQL + `) u(p, n, d) ON true`, Args: []any{g.project, key}}
	}
	sql, args := store.With(final, parts...)
	rows, err := w.Tx.Query(ctx, sql, args...)
	if err != nil {
		w.lockUnknown = key != ""
		return fmt.Errorf("event %d: write its plan: %w", w.Row.ID, err)
	}
	var u policy.Usage
	var locked *bool
	for rows.Next() {
		var prof *string
		var n *int
		var demand []byte
		if err := rows.Scan(&locked, &prof, &n, &demand); err != nil {
			rows.Close()
			w.lockUnknown = key != ""
			return fmt.Errorf("event %d: write its plan: %w", w.Row.ID, err)
		}
		if n != nil {
			d.facts.addUsage(&u, *prof, int(*n), demand)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		w.lockUnknown = key != ""
		return fmt.Errorf("event %d: write its plan: %w", w.Row.ID, err)
	}
	if key != "" {
		if locked == nil || !*locked {
			return fmt.Errorf("lock instance %s for the claims", w.Row.InstanceUUID)
		}
		w.sessionLocked = true
	}
	if !recheck {
		return nil
	}
	g.recheck = false
	if err := d.facts.addNovaVFs(ctx, w.Tx, g.project, &u); err != nil {
		return err
	}
	if u != g.usage {
		return errQuotaMoved
	}
	return nil
}
