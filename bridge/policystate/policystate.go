// Package policystate keeps the policy's load-rule state (policy.LoadState) in
// Postgres (migration 00005_policy.sql), so hysteresis windows and
// cooldowns are shared by every bridge replica and survive restarts.
//
// Use: Snapshot before policy.Evaluate, Apply the decision's LoadUpdates in
// the transaction that records the decision. Serialise evaluations of one
// instance (e.g. a row lock on the instance) so two replicas do not arm the
// same window twice.
package policystate

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// Querier is what policystate needs of a pool, connection or transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Snapshot reads what load rules remember of one instance into an
// in-memory LoadState for one evaluation.
func Snapshot(ctx context.Context, q Querier, instance string) (*policy.Tracker, error) {
	t := policy.NewTracker()
	if instance == "" {
		return t, nil
	}
	rows, err := q.Query(ctx, `SELECT rule, since FROM policy_load_since WHERE instance_uuid = $1
		UNION ALL SELECT '', changed_at FROM policy_last_change WHERE instance_uuid = $1`, instance)
	if err != nil {
		return nil, fmt.Errorf("read policy load state of %s: %w", instance, err)
	}
	var ups []policy.LoadUpdate
	for rows.Next() {
		var u policy.LoadUpdate
		if err := rows.Scan(&u.Rule, &u.At); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read policy load state of %s: %w", instance, err)
		}
		u.Instance, u.Op = instance, policy.LoadArm
		if u.Rule == "" {
			u.Op = policy.LoadChange
		}
		ups = append(ups, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read policy load state of %s: %w", instance, err)
	}
	t.Apply(ups)
	return t, nil
}

// SnapshotJSON is what Snapshot reads of the instance param names (a
// placeholder of text) as a JSON array, for a statement that reads more
// than it (pipeline's facts); FromJSON reads it.
func SnapshotJSON(param string) string {
	return `(SELECT coalesce(jsonb_agg(jsonb_build_array(s.rule, s.since)), '[]'::jsonb) FROM (
		SELECT rule, since FROM policy_load_since WHERE instance_uuid = ` + param + `
		UNION ALL SELECT '', changed_at FROM policy_last_change WHERE instance_uuid = ` + param + `) s(rule, since))`
}

// FromJSON is Snapshot of instance from what SnapshotJSON read.
func FromJSON(instance string, raw []byte) (*policy.Tracker, error) {
	t := policy.NewTracker()
	var rows [][2]json.RawMessage
	if err := json.Unmarshal(raw, &rows); err != nil {
		return nil, fmt.Errorf("read policy load state of %s: %w", instance, err)
	}
	ups := make([]policy.LoadUpdate, 0, len(rows))
	for _, r := range rows {
		u := policy.LoadUpdate{Instance: instance, Op: policy.LoadArm}
		if err := json.Unmarshal(r[0], &u.Rule); err != nil {
			return nil, fmt.Errorf("read policy load state of %s: %w", instance, err)
		}
		if err := json.Unmarshal(r[1], &u.At); err != nil {
			return nil, fmt.Errorf("read policy load state of %s: %w", instance, err)
		}
		if u.Rule == "" {
			u.Op = policy.LoadChange
		}
		ups = append(ups, u)
	}
	t.Apply(ups)
	return t, nil
}

// Apply writes a decision's load updates: arming keeps an earlier start,
// clearing deletes it, a change moves the instance's last change forward.
func Apply(ctx context.Context, q Querier, updates []policy.LoadUpdate) error {
	parts, err := ApplyParts(updates)
	if err != nil {
		return err
	}
	for i, p := range parts {
		if _, err := q.Exec(ctx, p.SQL, p.Args...); err != nil {
			return fmt.Errorf("write policy load state of %s: %w", updates[i].Instance, err)
		}
	}
	return nil
}

// ApplyParts are Apply's writes, one part of a statement (store.With)
// each, in the order of updates. Two updates of one row must not go in
// one statement (Postgres runs its parts on the same snapshot): Apply
// them instead.
func ApplyParts(updates []policy.LoadUpdate) ([]store.Part, error) {
	parts := make([]store.Part, 0, len(updates))
	for _, u := range updates {
		var p store.Part
		switch u.Op {
		case policy.LoadArm:
			p = store.Part{SQL: `INSERT INTO policy_load_since (instance_uuid, rule, since) VALUES ($1::text, $2::text, $3::timestamptz)
				ON CONFLICT (instance_uuid, rule) DO NOTHING`, Args: []any{u.Instance, u.Rule, u.At}}
		case policy.LoadClear:
			p = store.Part{SQL: `DELETE FROM policy_load_since WHERE instance_uuid = $1::text AND rule = $2::text`, Args: []any{u.Instance, u.Rule}}
		case policy.LoadChange:
			p = store.Part{SQL: `INSERT INTO policy_last_change (instance_uuid, changed_at) VALUES ($1::text, $2::timestamptz)
				ON CONFLICT (instance_uuid) DO UPDATE SET changed_at = GREATEST(policy_last_change.changed_at, EXCLUDED.changed_at)`,
				Args: []any{u.Instance, u.At}}
		default:
			return nil, fmt.Errorf("write policy load state of %s: unknown load update %q", u.Instance, u.Op)
		}
		parts = append(parts, p)
	}
	return parts, nil
}

// Distinct reports whether updates write distinct rows, so that their
// parts (ApplyParts) can go in one statement.
func Distinct(updates []policy.LoadUpdate) bool {
	seen := map[[2]string]bool{}
	for _, u := range updates {
		k := [2]string{u.Instance, u.Rule}
		if u.Op == policy.LoadChange {
			k[1] = "\x00change"
		}
		if seen[k] {
			return false
		}
		seen[k] = true
	}
	return true
}

// Forget drops what is remembered of a deleted instance.
func Forget(ctx context.Context, q Querier, instance string) error {
	if _, err := q.Exec(ctx, `DELETE FROM policy_load_since WHERE instance_uuid = $1`, instance); err != nil {
		return fmt.Errorf("forget policy load state of %s: %w", instance, err)
	}
	if _, err := q.Exec(ctx, `DELETE FROM policy_last_change WHERE instance_uuid = $1`, instance); err != nil {
		return fmt.Errorf("forget policy load state of %s: %w", instance, err)
	}
	return nil
}
