package controls

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
)

// purgeLock is the session advisory lock that makes one replica purge at
// a time.
const purgeLock int64 = 0x7667707570757267 // "vgpupurg"

// Retention says how old rows get before the purge deletes them; 0 keeps
// them forever.
type Retention struct {
	Events      time.Duration // processed inbox rows (and their decisions), by received_at
	DeadLetters time.Duration // by received_at
	Requests    time.Duration // requests in a final state, by finished_at, with their commands, callbacks, decisions
	Audit       time.Duration // audit_log rows, by at
	Diagnostics time.Duration // diagnostics bundles, by requested_at, with their commands
	// Notifications: the bridge's own notifications once published, by
	// sent_at (unsent ones are never purged).
	Notifications time.Duration
	// Usage: accounted usage intervals that ended before the cutoff and
	// within a closed audit period, and the closed periods themselves
	// (billing records: 0, forever, by default).
	Usage     time.Duration
	Interval  time.Duration // time between purge rounds
	BatchSize int           // rows per delete statement (and transaction)
}

// Purged counts rows by table.
type Purged map[string]int64

// Total sums the counts.
func (p Purged) Total() int64 {
	var n int64
	for _, v := range p {
		n += v
	}
	return n
}

// ErrPurgeBusy says another replica is purging.
var ErrPurgeBusy = errors.New("another replica is purging")

// Purge deletes (or with dryRun counts) what r says is old, in batches,
// holding the purge lock; ErrPurgeBusy when another replica holds it.
func (s *Store) Purge(ctx context.Context, r Retention, dryRun bool) (Purged, error) {
	if r.BatchSize <= 0 {
		r.BatchSize = DefaultRetention().BatchSize
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, purgeLock).Scan(&ok); err != nil {
		return nil, fmt.Errorf("purge lock: %w", err)
	}
	if !ok {
		return nil, ErrPurgeBusy
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, purgeLock) //nolint:errcheck

	out := Purged{}
	start := time.Now()
	steps := []struct {
		table string
		age   time.Duration
		count string
		purge func(ctx context.Context, tx pgx.Tx, cutoff time.Time, n int) (Purged, error)
	}{
		{"events", r.Events, `SELECT count(*) FROM events WHERE processed_at IS NOT NULL AND received_at < $1`, purgeEvents},
		{"dead_letters", r.DeadLetters, `SELECT count(*) FROM dead_letters WHERE received_at < $1`, purgeDeadLetters},
		{"requests", r.Requests, `SELECT count(*) FROM requests r WHERE ` + requests.FinalOld,
			func(ctx context.Context, tx pgx.Tx, cutoff time.Time, n int) (Purged, error) {
				return requests.PurgeFinal(ctx, tx, cutoff, n)
			}},
		{"audit_log", r.Audit, `SELECT count(*) FROM audit_log WHERE at < $1`, purgeAudit},
		{"diagnostics", r.Diagnostics, `SELECT count(*) FROM diagnostics WHERE requested_at < $1`, purgeDiagnostics},
		{"bridge_notifications", r.Notifications, `SELECT count(*) FROM bridge_notifications WHERE sent_at < $1`, purgeNotifications},
		{"vgpu_usage", r.Usage, `SELECT count(*) FROM vgpu_usage u WHERE ` + requests.UsageOld,
			func(ctx context.Context, tx pgx.Tx, cutoff time.Time, n int) (Purged, error) {
				return requests.PurgeUsage(ctx, tx, cutoff, n)
			}},
	}
	for _, st := range steps {
		if st.age <= 0 {
			continue
		}
		cutoff := time.Now().Add(-st.age)
		if dryRun {
			var n int64
			if err := conn.QueryRow(ctx, st.count, cutoff).Scan(&n); err != nil {
				return out, fmt.Errorf("count %s: %w", st.table, err)
			}
			out[st.table] += n
			continue
		}
		for {
			var got Purged
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				var err error
				got, err = st.purge(ctx, tx, cutoff, r.BatchSize)
				return err
			})
			if err != nil {
				return out, fmt.Errorf("purge %s: %w", st.table, err)
			}
			for k, v := range got {
				out[k] += v
				s.m.purged.WithLabelValues(k).Add(float64(v))
			}
			if got[st.table] < int64(r.BatchSize) {
				break
			}
		}
	}
	if !dryRun {
		s.log.Info("retention purge done", logkey.Deleted, out.Total(), "events", out["events"], "dead_letters", out["dead_letters"],
			"requests", out["requests"], "audit_log", out["audit_log"], "diagnostics", out["diagnostics"],
			"notifications", out["bridge_notifications"], "usage", out["vgpu_usage"], logkey.Duration, time.Since(start))
	}
	return out, nil
}

// RunPurge purges every r.Interval until ctx ends; one replica at a time.
func (s *Store) RunPurge(ctx context.Context, r Retention) error {
	if r.Interval <= 0 || (r.Events <= 0 && r.DeadLetters <= 0 && r.Requests <= 0 && r.Audit <= 0 && r.Diagnostics <= 0 && r.Notifications <= 0 && r.Usage <= 0) {
		return nil // nothing to purge, ever
	}
	if !wake.Wait(ctx, nil, time.Minute) { // let the replica settle first
		return nil
	}
	return wake.Loop(ctx, nil, func(ctx context.Context) (time.Duration, error) {
		_, err := s.Purge(ctx, r, false)
		switch {
		case errors.Is(err, ErrPurgeBusy):
			s.m.purgeRuns.WithLabelValues("skipped").Inc()
		case err != nil && ctx.Err() == nil:
			s.m.purgeRuns.WithLabelValues("failed").Inc()
			s.log.Warn("retention purge failed; next round retries", logkey.Err, err)
		case err == nil:
			s.m.purgeRuns.WithLabelValues("done").Inc()
		}
		return r.Interval, nil
	})
}

// purgeDeadLetters deletes dead letters received before cutoff.
func purgeDeadLetters(ctx context.Context, tx pgx.Tx, cutoff time.Time, n int) (Purged, error) {
	d, err := ingest.PurgeDeadLetters(ctx, tx, cutoff, n)
	if err != nil {
		return nil, err
	}
	return Purged{"dead_letters": d}, nil
}

// purgeAudit deletes audit rows written before cutoff.
func purgeAudit(ctx context.Context, tx pgx.Tx, cutoff time.Time, n int) (Purged, error) {
	d, err := requests.PurgeAudit(ctx, tx, cutoff, n)
	if err != nil {
		return nil, err
	}
	return Purged{"audit_log": d}, nil
}

func purgeEvents(ctx context.Context, tx pgx.Tx, cutoff time.Time, n int) (Purged, error) {
	rows, err := tx.Query(ctx, `SELECT id FROM events WHERE processed_at IS NOT NULL AND received_at < $1
		ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED`, cutoff, n)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(ids) == 0 {
		return Purged{"events": 0}, err
	}
	return requests.PurgeEvents(ctx, tx, ids)
}

// purgeDiagnostics deletes old diagnostics records (their bundles) and
// their collect_diagnostics commands.
func purgeDiagnostics(ctx context.Context, tx pgx.Tx, cutoff time.Time, n int) (Purged, error) {
	rows, err := tx.Query(ctx, `DELETE FROM diagnostics WHERE id IN (SELECT id FROM diagnostics WHERE requested_at < $1
		ORDER BY requested_at LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING command_id`, cutoff, n)
	if err != nil {
		return nil, err
	}
	cmds, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, err
	}
	out := Purged{"diagnostics": int64(len(cmds))}
	if len(cmds) > 0 {
		n, err := requests.DeleteOperatorCommands(ctx, tx, cmds)
		if err != nil {
			return nil, err
		}
		out["commands"] = n
	}
	return out, nil
}

// purgeNotifications deletes published notifications sent before cutoff.
func purgeNotifications(ctx context.Context, tx pgx.Tx, cutoff time.Time, n int) (Purged, error) {
	d, err := notify.PurgeSent(ctx, tx, cutoff, n)
	if err != nil {
		return nil, err
	}
	return Purged{"bridge_notifications": d}, nil
}
