// Package controls holds the operators' switches over the bridge, kept in
// Postgres so that every replica obeys them: global pause and observe-only
// mode, host and GPU drains, dead-letter replay, the audit log's API, the
// profile catalog's API, and retention (the purge loop).
//
// Pause and observe-only are read by the pipeline and the outbox relay in
// their own transactions under a shared advisory lock that a change takes
// exclusively (Gate): when POST /v1/controls has answered, no decision or
// send made under the old mode is still in flight on any replica.
package controls

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls/controlswire"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// gateLock is the advisory lock key of the mode: shared by readers that act
// on it, exclusive while it changes.
const gateLock int64 = 0x7667707563746c73 // "vgpuctls"

// NotifyChannel is the Postgres channel every replica listens on: mode,
// drain and service-state changes (migration 00007's triggers).
const NotifyChannel = "vgpu_controls"

// Mode is the global switches.
type Mode = controlswire.Mode

// Change is a request to change the mode; nil fields keep their value.
type Change = controlswire.Change

// Gate is what the pipeline learns about one event in its transaction.
type Gate struct {
	Paused      bool
	ObserveOnly bool
	// GlobalRequestID is the OpenStack request id the event carries
	// (Nova's global_request_id or request_id; req-<request uuid> for a
	// webhook request); "" when none.
	GlobalRequestID string
}

// Store reads and changes the switches.
type Store struct {
	pool *pgxpool.Pool
	log  *slog.Logger
	m    *metrics
}

// NewStore returns a store over pool; reg (may be nil) takes its metrics.
func NewStore(pool *pgxpool.Pool, reg prometheus.Registerer, log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{pool: pool, log: log, m: newMetrics(reg)}
}

// Pool returns the store's pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

const modeCols = `paused, observe_only, coalesce(reason,''), coalesce(actor,''), coalesce(request_id,''), paused_at, observe_since, updated_at`

func scanMode(row pgx.Row) (Mode, error) {
	var m Mode
	err := row.Scan(&m.Paused, &m.ObserveOnly, &m.Reason, &m.Actor, &m.RequestID, &m.PausedAt, &m.ObserveSince, &m.UpdatedAt)
	return m, err
}

// Get returns the mode and refreshes the gauges.
func (s *Store) Get(ctx context.Context) (Mode, error) {
	m, err := scanMode(s.pool.QueryRow(ctx, `SELECT `+modeCols+` FROM bridge_controls WHERE id = 1`))
	if err != nil {
		return m, fmt.Errorf("read controls: %w", err)
	}
	s.m.set(m)
	return m, nil
}

// Paused reports whether the pipeline is paused: the cheap check before an
// inbox poll. Each true answer counts in vgpu_bridge_controls_held_total.
func (s *Store) Paused(ctx context.Context, part string) (bool, error) {
	var p bool
	if err := s.pool.QueryRow(ctx, `SELECT paused FROM bridge_controls WHERE id = 1`).Scan(&p); err != nil {
		return false, fmt.Errorf("read controls: %w", err)
	}
	if p {
		s.m.held.WithLabelValues(part).Inc()
	}
	return p, nil
}

// Gate reads the mode in tx for one inbox event, holding the mode's
// shared lock until tx ends, and sets the transaction's
// vgpu.global_request_id (audit rows written in tx inherit it).
func (s *Store) Gate(ctx context.Context, tx pgx.Tx, eventID int64) (Gate, error) {
	var g Gate
	var set string
	err := tx.QueryRow(ctx, `SELECT c.paused, c.observe_only, r.id, set_config('vgpu.global_request_id', r.id, true)
		FROM bridge_controls c CROSS JOIN pg_advisory_xact_lock_shared($1)
		CROSS JOIN (SELECT coalesce(e.global_request_id,
				CASE WHEN e.source LIKE 'webhook:%' AND e.request_id ~ '^[0-9a-f-]{36}$' THEN 'req-' || e.request_id
				     WHEN e.request_id LIKE 'req-%' THEN e.request_id END, '') AS id
			FROM (SELECT 1) one LEFT JOIN events e ON e.id = $2) r
		WHERE c.id = 1`, gateLock, eventID).Scan(&g.Paused, &g.ObserveOnly, &g.GlobalRequestID, &set)
	if err != nil {
		return g, fmt.Errorf("read controls: %w", err)
	}
	if g.Paused {
		s.m.held.WithLabelValues("decision").Inc()
	}
	return g, nil
}

// Hold reports, in tx, whether the outbox relay must send nothing (paused
// or observe-only), holding the mode's shared lock until tx ends.
func (s *Store) Hold(ctx context.Context, tx pgx.Tx) (bool, error) {
	var held bool
	if err := tx.QueryRow(ctx, `SELECT c.paused OR c.observe_only FROM bridge_controls c CROSS JOIN pg_advisory_xact_lock_shared($1) WHERE c.id = 1`,
		gateLock).Scan(&held); err != nil {
		return false, fmt.Errorf("read controls: %w", err)
	}
	if held {
		s.m.held.WithLabelValues("relay").Inc()
	}
	return held, nil
}

// ErrNoChange says a Change named no switch.
var ErrNoChange = errors.New("name paused and/or observe_only")

// Set applies c, waiting for decisions and sends in flight under the old
// mode to finish, and writes the audit row. It returns the new mode.
func (s *Store) Set(ctx context.Context, who Actor, c Change) (Mode, Mode, error) {
	if c.Paused == nil && c.ObserveOnly == nil {
		return Mode{}, Mode{}, ErrNoChange
	}
	var before, after Mode
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, gateLock); err != nil {
			return err
		}
		var err error
		before, err = scanMode(tx.QueryRow(ctx, `SELECT `+modeCols+` FROM bridge_controls WHERE id = 1 FOR UPDATE`))
		if err != nil {
			return err
		}
		after, err = scanMode(tx.QueryRow(ctx, `UPDATE bridge_controls SET
				paused = coalesce($1, paused), observe_only = coalesce($2, observe_only),
				paused_at = CASE WHEN coalesce($1, paused) THEN coalesce(paused_at, now()) END,
				observe_since = CASE WHEN coalesce($2, observe_only) THEN coalesce(observe_since, now()) END,
				reason = nullif($3, ''), actor = $4, request_id = nullif($5, ''), updated_at = now()
			WHERE id = 1 RETURNING `+modeCols, c.Paused, c.ObserveOnly, c.Reason, who.Name, who.RequestID))
		if err != nil {
			return err
		}
		return Audit(ctx, tx, Entry{Actor: who, Action: "controls.set", ObjectType: "controls", ObjectID: "global",
			Detail: map[string]any{"reason": c.Reason, "before": modeBrief(before), "after": modeBrief(after)}})
	})
	if err != nil {
		return before, after, fmt.Errorf("set controls: %w", err)
	}
	s.m.set(after)
	s.log.Info("controls changed", logkey.Actor, who.Name, logkey.GlobalRequestID, who.RequestID, logkey.Reason, c.Reason,
		"paused", after.Paused, "observe_only", after.ObserveOnly)
	return before, after, nil
}

func modeBrief(m Mode) map[string]bool {
	return map[string]bool{"paused": m.Paused, "observe_only": m.ObserveOnly}
}

// Listen calls fn with the table name of each change notification (mode,
// drains, service states) until ctx ends, reconnecting with backoff; fn is
// also called once after each (re)connect with "" (changes may have been
// missed).
func (s *Store) Listen(ctx context.Context, fn func(ctx context.Context, table string)) error {
	b := backoff.Policy{Min: time.Second, Max: 30 * time.Second}.New()
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, fn)
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("controls: change notifications interrupted", logkey.Err, err)
		_ = backoff.Wait(ctx, b) // ends early only with ctx
	}
	return nil
}

func (s *Store) listenOnce(ctx context.Context, fn func(ctx context.Context, table string)) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN `+NotifyChannel); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), `UNLISTEN `+NotifyChannel) //nolint:errcheck
	fn(ctx, "")
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		fn(ctx, n.Payload)
	}
}

// jsonDetail encodes an audit detail.
func jsonDetail(v any) []byte {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	return b
}
