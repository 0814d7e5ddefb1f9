package usage

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
)

// Closer closes audit periods once they have ended: it freezes each usage
// interval's seconds within the period (vgpu_usage_exists) and, when
// Exists is set, queues one vgpu.exists per interval in the same
// transaction. Periods close in order, each in its own transaction, by
// one replica at a time; a closed period is never closed again.
type Closer struct {
	Pool    *pgxpool.Pool
	Period  Period
	Exists  bool
	Replica string
	// Delay is how long after its end a period is closed, so that events
	// from before the end that arrive a little late (a notification held
	// up in the broker, an agent's result) are in it.
	Delay time.Duration
	// Every is the time between checks (default a minute, or the period
	// when shorter).
	Every time.Duration
	Log   *slog.Logger
}

// maxPerRound bounds the periods one round closes (a bridge that was
// down for long catches up over a few rounds).
const maxPerRound = 48

// Run checks for ended periods until ctx ends.
func (c *Closer) Run(ctx context.Context) error {
	every := c.Every
	if every <= 0 {
		start := c.Period.Start(time.Now())
		every = min(time.Minute, c.Period.Next(start).Sub(start))
	}
	return wake.Loop(ctx, nil, func(ctx context.Context) (time.Duration, error) {
		if n, err := c.CloseDue(ctx, time.Now()); err != nil {
			c.log().Warn("usage: closing audit periods failed", logkey.Err, err)
		} else if n > 0 {
			c.log().Info("usage: audit periods closed", "periods", n)
		}
		return every, nil
	})
}

func (c *Closer) log() *slog.Logger {
	if c.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Log
}

// CloseDue closes the periods that ended by now (less Delay) and are not
// closed yet,
// up to maxPerRound of them; it returns how many it closed.
func (c *Closer) CloseDue(ctx context.Context, now time.Time) (int, error) {
	n := 0
	for n < maxPerRound {
		closed, err := c.closeNext(ctx, now)
		if err != nil || !closed {
			return n, err
		}
		n++
	}
	return n, nil
}

// closeNext closes the first unclosed period, when it has ended.
func (c *Closer) closeNext(ctx context.Context, now time.Time) (closed bool, err error) {
	err = pgx.BeginFunc(ctx, c.Pool, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended('vgpu-usage-close', 0))`).Scan(&locked); err != nil || !locked {
			return err // another replica closes
		}
		var last, first *time.Time
		if err := tx.QueryRow(ctx, `SELECT (SELECT max(period_end) FROM vgpu_usage_periods), (SELECT min(started_at) FROM vgpu_usage)`).
			Scan(&last, &first); err != nil {
			return err
		}
		var start time.Time
		switch {
		case last != nil:
			start = *last
		case first != nil:
			start = c.Period.Start(*first)
		default:
			return nil // nothing accounted yet
		}
		end := c.Period.Next(start)
		if end.Add(c.Delay).After(now) {
			return nil
		}
		rows, err := tx.Query(ctx, `WITH p AS (
				INSERT INTO vgpu_usage_periods (period_start, period_end, closed_by) VALUES ($1, $2, $3) RETURNING period_start, period_end),
			x AS (INSERT INTO vgpu_usage_exists (period_start, usage_id, instance_uuid, project_id, path, host, profile, vgpu_type, resource_class, amount, seconds)
			SELECT p.period_start, u.id, u.instance_uuid, u.project_id, u.path, u.host, coalesce(u.profile,''), u.vgpu_type, u.resource_class, u.amount,
				round(extract(epoch FROM least(coalesce(u.ended_at, p.period_end), p.period_end) - greatest(u.started_at, p.period_start)))::bigint
			FROM vgpu_usage u, p
			WHERE u.started_at < p.period_end AND (u.ended_at IS NULL OR u.ended_at > p.period_start)
			RETURNING *)
			SELECT x.instance_uuid::text, coalesce(x.project_id,''), coalesce(u.user_id,''), x.path, coalesce(u.attachment_id::text,''),
				coalesce(u.flavor,''), coalesce(x.host,''), x.profile, coalesce(x.vgpu_type,''), x.resource_class, x.amount, x.seconds
			FROM x JOIN vgpu_usage u ON u.id = x.usage_id ORDER BY x.usage_id`, start, end, c.Replica)
		if err != nil {
			return fmt.Errorf("close audit period %s: %w", start.Format(time.RFC3339), err)
		}
		var items []notify.Item
		var e notify.ExistsPayload
		_, err = pgx.ForEachRow(rows, []any{&e.InstanceUUID, &e.ProjectID, &e.UserID, &e.Path, &e.AttachmentID, &e.Flavor, &e.Host, &e.Profile,
			&e.VGPUType, &e.ResourceClass, &e.Amount, &e.Seconds}, func() error {
			e.VGPUSeconds = e.Seconds * int64(e.Amount)
			e.AuditPeriod = notify.AuditPeriod(start.Format(time.RFC3339), end.Format(time.RFC3339))
			items = append(items, notify.Item{EventType: notify.Exists, Priority: notify.Info, Payload: notify.ExistsObject(e)})
			return nil
		})
		if err != nil {
			return fmt.Errorf("close audit period %s: %w", start.Format(time.RFC3339), err)
		}
		if _, err := tx.Exec(ctx, `UPDATE vgpu_usage_periods SET rows = $2 WHERE period_start = $1`, start, len(items)); err != nil {
			return err
		}
		if c.Exists && len(items) > 0 {
			if err := notify.QueueAll(ctx, tx, items); err != nil {
				return err
			}
		}
		closed = true
		return nil
	})
	return closed, err
}
