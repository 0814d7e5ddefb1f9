package requests

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/failpoint"
)

// A decision that needs Placement claims is taken in two transactions
// with the claims between them, none open while Placement is called:
// the first commits the vGPUs it plans to claim (PlanClaims), which count
// in the project's usage from then on; the second records the claims'
// attachments and drops the plan (DropPlanned), so the usage moves from
// one to the other in one commit.

// PlannedClaim is the vGPUs of one profile a decision plans to claim.
type PlannedClaim struct {
	Profile string
	Units   int
}

// PlanClaims records claims the decision of inbox event eventID plans
// for instance and request reqID. What an earlier attempt at the event
// planned is dropped first (DropPlanned).
func PlanClaims(ctx context.Context, tx pgx.Tx, eventID int64, reqID uuid.UUID, instance string, planned []PlannedClaim) error {
	p := PlanClaimsPart(eventID, reqID, instance, planned)
	if _, err := tx.Exec(ctx, p.SQL, p.Args...); err != nil {
		return fmt.Errorf("plan the claims of event %d: %w", eventID, err)
	}
	return nil
}

// PlanClaimsPart is PlanClaims as a part of a statement (store.With):
// the decision's first transaction writes its plan, its decision and
// the policy's state in one statement (pipeline's Record stage).
func PlanClaimsPart(eventID int64, reqID uuid.UUID, instance string, planned []PlannedClaim) store.Part {
	profiles := make([]string, len(planned))
	units := make([]int32, len(planned))
	for i, c := range planned {
		profiles[i], units[i] = c.Profile, int32(max(c.Units, 1))
	}
	return store.Part{SQL: `INSERT INTO planned_claims (event_id, request_id, instance_uuid, profile, units)
		SELECT $1::bigint, $2::uuid, $3::uuid, p, u FROM unnest($4::text[], $5::int[]) AS c(p, u)`,
		Args: []any{eventID, reqID, instance, profiles, units}}
}

// DropPlanned deletes the planned claims of inbox event eventID: its
// decision recorded them as attachments, or no longer makes them.
func DropPlanned(ctx context.Context, q Execer, eventID int64) error {
	if _, err := q.Exec(ctx, `DELETE FROM planned_claims WHERE event_id = $1`, eventID); err != nil {
		return fmt.Errorf("drop the planned claims of event %d: %w", eventID, err)
	}
	return nil
}

// CloseApplied closes inbox event eventID whose planned claims were
// recorded: the plan goes and the event is processed, in one statement.
func CloseApplied(ctx context.Context, q Execer, eventID int64) error {
	if _, err := q.Exec(ctx, `WITH gone AS (DELETE FROM planned_claims WHERE event_id = $1)
		UPDATE events SET processed_at = now() WHERE id = $1`, eventID); err != nil {
		return fmt.Errorf("close event %d with its claims recorded: %w", eventID, err)
	}
	return nil
}

// CloseAppliedWith is CloseApplied that, in the same statement, queues
// notes (notify.QueueAll: the notifications of the transitions the
// record made, ActDecided's later) and, with unlock, gives back the
// session advisory lock of that name (the caller's transaction holds
// the lock of the same name, to its end). The lock not held is an
// error.
func CloseAppliedWith(ctx context.Context, q Querier, eventID int64, notes []notify.Item, unlock string) error {
	parts := []store.Part{
		{SQL: `DELETE FROM planned_claims WHERE event_id = $1::bigint`, Args: []any{eventID}},
		{SQL: `UPDATE events SET processed_at = now() WHERE id = $1::bigint`, Args: []any{eventID}},
	}
	signal := "0::bigint"
	if len(notes) > 0 {
		p, err := notify.QueueAllPart(notes)
		if err != nil {
			return err
		}
		parts = append(parts, p)
		signal = `(SELECT count(*) FROM (SELECT pg_notify('` + notify.Channel + `', '') FROM w3 LIMIT 1) n)`
	}
	sql, args := store.With(store.Part{SQL: `SELECT CASE WHEN $1::text <> '' THEN pg_advisory_unlock(hashtextextended($1::text, 0)) END, ` + signal,
		Args: []any{unlock}}, parts...)
	var unlocked *bool
	var signalled int64
	if err := q.QueryRow(ctx, sql, args...).Scan(&unlocked, &signalled); err != nil {
		return fmt.Errorf("close event %d with its claims recorded: %w", eventID, err)
	}
	if unlock != "" && (unlocked == nil || !*unlocked) {
		return fmt.Errorf("close event %d with its claims recorded: the lock %s was not held", eventID, unlock)
	}
	for _, n := range notes {
		failpoint.Hit(notify.FailQueued + n.EventType)
	}
	return nil
}

// A transaction that gives a vGPU's claim back to Placement records the
// release (PlanRelease) and commits; the release is made with no
// transaction open, by the process that committed it at once, or by any
// replica's sweep (LeaseReleases) once its lease ran out; ReleasesDone
// deletes what Placement gave back. Releases are idempotent (held_after).

// PlanRelease records that attachment a's claim is to be given back to
// Placement once the transaction commits; the committing process holds
// it for lease (the sweep leaves it alone until then). A release planned
// already for a is kept.
func PlanRelease(ctx context.Context, tx pgx.Tx, a flow.Attachment, lease time.Duration) error {
	_, err := tx.Exec(ctx, `INSERT INTO planned_releases (attachment_id, request_id, instance_uuid, provider_uuid, resource_class, amount, held_after, not_before)
		VALUES ($1, $2, $3::uuid, $4::uuid, $5, $6, $7, now() + make_interval(secs => $8)) ON CONFLICT (attachment_id) DO NOTHING`,
		a.ID, reqOrNull(a.RequestID), a.InstanceUUID, a.Provider, a.Class, max(a.Amount, 1), a.HeldAfter, lease.Seconds())
	if err != nil {
		return fmt.Errorf("plan the release of attachment %s: %w", a.ID, err)
	}
	return nil
}

// ReleasesDone deletes the planned releases of attachments ids: Placement
// gave their units back (or had them no more).
func ReleasesDone(ctx context.Context, q Execer, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := q.Exec(ctx, `DELETE FROM planned_releases WHERE attachment_id = ANY($1)`, ids); err != nil {
		return fmt.Errorf("record %d release(s) made: %w", len(ids), err)
	}
	return nil
}

// ReleaseFailed records why the planned release of attachment id failed;
// it is tried again once lease passed.
func ReleaseFailed(ctx context.Context, q Execer, id uuid.UUID, cause string, lease time.Duration) error {
	if _, err := q.Exec(ctx, `UPDATE planned_releases SET attempts = attempts + 1, last_error = $2, not_before = now() + make_interval(secs => $3)
		WHERE attachment_id = $1`, id, cause, lease.Seconds()); err != nil {
		return fmt.Errorf("record the failed release of attachment %s: %w", id, err)
	}
	return nil
}

// LeaseReleases takes up to limit planned releases whose lease ran out
// (their process crashed, or Placement failed them) and leases them for
// lease, in one statement: replicas take different ones.
func LeaseReleases(ctx context.Context, q RowsQuerier, limit int, lease time.Duration) ([]flow.Attachment, error) {
	rows, err := q.Query(ctx, `UPDATE planned_releases SET not_before = now() + make_interval(secs => $2)
		WHERE attachment_id IN (SELECT attachment_id FROM planned_releases WHERE not_before <= now()
			ORDER BY not_before LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING attachment_id, coalesce(request_id, '00000000-0000-0000-0000-000000000000'::uuid), instance_uuid::text,
			provider_uuid::text, resource_class, amount, held_after`, limit, lease.Seconds())
	if err != nil {
		return nil, fmt.Errorf("lease planned releases: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (flow.Attachment, error) {
		var a flow.Attachment
		err := r.Scan(&a.ID, &a.RequestID, &a.InstanceUUID, &a.Provider, &a.Class, &a.Amount, &a.HeldAfter)
		return a, err
	})
}

// ReleasesPending reports whether a planned release of instance's vGPUs
// is not made yet: Placement still holds units the bridge records as
// given back, which a claim must not take for its own.
func ReleasesPending(ctx context.Context, q Querier, instance string) (bool, error) {
	var pending bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM planned_releases WHERE instance_uuid = $1::uuid)`, instance).Scan(&pending); err != nil {
		return false, fmt.Errorf("planned releases of %s: %w", instance, err)
	}
	return pending, nil
}

// A request whose end gives vGPUs back (a release completed, a failure
// compensated) ends only once Placement has the units back: the
// transaction that plans the releases records the end (PlanFinish)
// instead of making it; the transaction that records the releases made
// takes the ends no planned release holds up any more (ReadyFinishes),
// moves each request to its final state and deletes its row (DropFinish).

// Finish is the final state a request takes once the planned releases it
// waits on are made.
type Finish struct {
	Request      uuid.UUID
	State        State
	Reason, Code string
}

// PlanFinish records that request f.Request ends in f.State once the
// planned releases of attachments releases are made. A finish planned
// already for the request is replaced, and waits on both's releases.
func PlanFinish(ctx context.Context, tx pgx.Tx, f Finish, releases []uuid.UUID) error {
	if !f.State.Final() {
		return fmt.Errorf("plan the end of request %s: %s is not final: %w", f.Request, f.State, ErrIllegal)
	}
	_, err := tx.Exec(ctx, `INSERT INTO planned_finishes (request_id, state, reason, code, releases) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (request_id) DO UPDATE SET state = excluded.state, reason = excluded.reason, code = excluded.code,
			releases = ARRAY(SELECT DISTINCT unnest(planned_finishes.releases || excluded.releases))`,
		f.Request, string(f.State), f.Reason, f.Code, releases)
	if err != nil {
		return fmt.Errorf("plan the end of request %s: %w", f.Request, err)
	}
	return nil
}

// FinishPlanned reports whether request id's end is planned: it is
// ending, and only waits for its releases.
func FinishPlanned(ctx context.Context, q Querier, id uuid.UUID) (bool, error) {
	var planned bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM planned_finishes WHERE request_id = $1)`, id).Scan(&planned); err != nil {
		return false, fmt.Errorf("planned end of request %s: %w", id, err)
	}
	return planned, nil
}

// ReadyFinishes locks, in tx, up to limit planned ends none of whose
// releases is still planned; with made set, only those waiting on one of
// the releases made (the attachments' ids). Ends another transaction
// holds are skipped: it takes them.
func ReadyFinishes(ctx context.Context, tx pgx.Tx, made []uuid.UUID, limit int) ([]Finish, error) {
	rows, err := tx.Query(ctx, `SELECT request_id, state, reason, code FROM planned_finishes f
		WHERE ($1::uuid[] IS NULL OR f.releases && $1::uuid[])
			AND NOT EXISTS (SELECT 1 FROM planned_releases r WHERE r.attachment_id = ANY(f.releases))
		ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED`, made, limit)
	if err != nil {
		return nil, fmt.Errorf("planned ends ready: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Finish, error) {
		var f Finish
		var st string
		err := r.Scan(&f.Request, &st, &f.Reason, &f.Code)
		f.State = State(st)
		return f, err
	})
}

// DropFinish deletes the planned end of request id: it was made.
func DropFinish(ctx context.Context, q Execer, id uuid.UUID) error {
	if _, err := q.Exec(ctx, `DELETE FROM planned_finishes WHERE request_id = $1`, id); err != nil {
		return fmt.Errorf("drop the planned end of request %s: %w", id, err)
	}
	return nil
}

// reqOrNull is id, or NULL for the zero id (an attachment of no request).
func reqOrNull(id uuid.UUID) *uuid.UUID {
	if id == uuid.Nil {
		return nil
	}
	return &id
}
