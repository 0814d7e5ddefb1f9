package requests

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// DeleteEventDecisions deletes the decisions of inbox events ids that no
// request refers to (the retention purge of the inbox); it returns how many.
func DeleteEventDecisions(ctx context.Context, q Execer, ids []int64) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM decisions WHERE event_id = ANY($1) AND request_id IS NULL`, ids)
	if err != nil {
		return 0, fmt.Errorf("delete decisions of purged events: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DeleteOperatorCommands deletes the commands ids that belong to no
// request (QueueOperatorCommand; the retention purge of what they were
// for); it returns how many.
func DeleteOperatorCommands(ctx context.Context, q Execer, ids []uuid.UUID) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM commands WHERE id = ANY($1) AND request_id IS NULL`, ids)
	if err != nil {
		return 0, fmt.Errorf("delete purged operator commands: %w", err)
	}
	return tag.RowsAffected(), nil
}

// FinalOld selects requests (alias r) final before $1 with nothing still
// in flight: no callback to deliver, no command unanswered.
const FinalOld = `r.state IN ('succeeded','failed','rejected') AND r.finished_at < $1
	AND NOT EXISTS (SELECT 1 FROM request_callbacks cb WHERE cb.request_id = r.id AND cb.state = 'pending')
	AND NOT EXISTS (SELECT 1 FROM commands c WHERE c.request_id = r.id AND c.finished_at IS NULL)`

// PurgeFinal deletes up to n requests final before cutoff with nothing in
// flight (FinalOld), with every row that refers to them; it returns the
// rows deleted by table.
func PurgeFinal(ctx context.Context, tx pgx.Tx, cutoff time.Time, n int) (map[string]int64, error) {
	rows, err := tx.Query(ctx, `SELECT r.id FROM requests r WHERE `+FinalOld+` ORDER BY r.finished_at LIMIT $2 FOR UPDATE SKIP LOCKED`, cutoff, n)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil || len(ids) == 0 {
		return map[string]int64{"requests": 0}, err
	}
	out := map[string]int64{}
	del := func(name, q string) error {
		tag, err := tx.Exec(ctx, q, ids)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		out[name] += tag.RowsAffected()
		return nil
	}
	if err := del("request_callback_attempts", `DELETE FROM request_callback_attempts WHERE callback_id IN
			(SELECT id FROM request_callbacks WHERE request_id = ANY($1))`); err != nil {
		return nil, err
	}
	if err := del("decisions", `DELETE FROM decisions WHERE request_id = ANY($1)`); err != nil {
		return nil, err
	}
	// Every table with a foreign key to requests (request_callbacks,
	// commands, webhook_idempotency, and those of later migrations).
	refs, err := tx.Query(ctx, `SELECT c.conrelid::regclass::text, a.attname FROM pg_constraint c
		JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
		WHERE c.contype = 'f' AND c.confrelid = 'requests'::regclass AND array_length(c.conkey, 1) = 1
		ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	type ref struct{ table, col string }
	rs, err := pgx.CollectRows(refs, func(r pgx.CollectableRow) (ref, error) {
		var x ref
		return x, r.Scan(&x.table, &x.col)
	})
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		// r.table is regclass text: quoted as needed already.
		if err := del(r.table, fmt.Sprintf(`DELETE FROM %s WHERE %s = ANY($1)`, r.table, pgx.Identifier{r.col}.Sanitize())); err != nil {
			return nil, err
		}
	}
	if err := del("requests", `DELETE FROM requests WHERE id = ANY($1)`); err != nil {
		return nil, err
	}
	return out, nil
}

// UsageOld selects usage intervals (u) that ended before cutoff ($1) and
// within a closed audit period, so that what vgpu.exists reported stays.
const UsageOld = `u.ended_at < $1 AND u.ended_at <= (SELECT max(period_end) FROM vgpu_usage_periods)`

// PurgeUsage deletes up to n usage intervals of UsageOld, and the closed
// audit periods (with their frozen rows) that ended before cutoff but the
// last (where the next period to close begins); it returns the rows
// deleted by table.
func PurgeUsage(ctx context.Context, tx pgx.Tx, cutoff time.Time, n int) (map[string]int64, error) {
	tag, err := tx.Exec(ctx, `DELETE FROM vgpu_usage WHERE id IN (SELECT u.id FROM vgpu_usage u WHERE `+UsageOld+`
		ORDER BY u.ended_at LIMIT $2 FOR UPDATE SKIP LOCKED)`, cutoff, n)
	if err != nil {
		return nil, fmt.Errorf("purge usage: %w", err)
	}
	out := map[string]int64{"vgpu_usage": tag.RowsAffected()}
	ptag, err := tx.Exec(ctx, `DELETE FROM vgpu_usage_periods WHERE period_start IN (SELECT period_start FROM vgpu_usage_periods
		WHERE period_end < $1 AND period_end < (SELECT max(period_end) FROM vgpu_usage_periods) ORDER BY period_start LIMIT $2)`, cutoff, n)
	if err != nil {
		return nil, fmt.Errorf("purge audit periods: %w", err)
	}
	out["vgpu_usage_periods"] = ptag.RowsAffected()
	return out, nil
}
