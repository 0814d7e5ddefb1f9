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
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// Apply writes a decision's load updates: arming keeps an earlier start,
// clearing deletes it, a change moves the instance's last change forward.
func Apply(ctx context.Context, q Querier, updates []policy.LoadUpdate) error {
	for _, u := range updates {
		var err error
		switch u.Op {
		case policy.LoadArm:
			_, err = q.Exec(ctx, `INSERT INTO policy_load_since (instance_uuid, rule, since) VALUES ($1, $2, $3)
				ON CONFLICT (instance_uuid, rule) DO NOTHING`, u.Instance, u.Rule, u.At)
		case policy.LoadClear:
			_, err = q.Exec(ctx, `DELETE FROM policy_load_since WHERE instance_uuid = $1 AND rule = $2`, u.Instance, u.Rule)
		case policy.LoadChange:
			_, err = q.Exec(ctx, `INSERT INTO policy_last_change (instance_uuid, changed_at) VALUES ($1, $2)
				ON CONFLICT (instance_uuid) DO UPDATE SET changed_at = GREATEST(policy_last_change.changed_at, EXCLUDED.changed_at)`, u.Instance, u.At)
		default:
			err = fmt.Errorf("unknown load update %q", u.Op)
		}
		if err != nil {
			return fmt.Errorf("write policy load state of %s: %w", u.Instance, err)
		}
	}
	return nil
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
