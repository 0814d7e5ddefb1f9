package requests

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// A request's callback is queued by Transition when the request ends
// (request_callbacks); package webhook delivers it, claiming the due ones
// (ClaimCallbacks) and recording each attempt (RecordCallbackAttempt).

// RowsQuerier is what reads rows: a pool, a connection or a transaction.
type RowsQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// DueCallback is a callback claimed for delivery.
type DueCallback struct {
	ID        int64
	RequestID uuid.UUID
	Source    string
	URL       string
	Payload   []byte
	Attempts  int // made so far
}

// ClaimCallbacks claims up to n pending callbacks that are due, for
// lease: another replica claims them again only once it ran out.
func ClaimCallbacks(ctx context.Context, q RowsQuerier, lease time.Duration, n int) ([]DueCallback, error) {
	rows, err := q.Query(ctx, `UPDATE request_callbacks SET next_attempt_at = now() + make_interval(secs => $1)
		WHERE id IN (SELECT id FROM request_callbacks WHERE state = 'pending' AND next_attempt_at <= now()
		             ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED)
		RETURNING id, request_id, source, url, payload, attempts`, lease.Seconds(), n)
	if err != nil {
		return nil, fmt.Errorf("claim callbacks: %w", err)
	}
	var due []DueCallback
	for rows.Next() {
		var d DueCallback
		if err := rows.Scan(&d.ID, &d.RequestID, &d.Source, &d.URL, &d.Payload, &d.Attempts); err != nil {
			rows.Close()
			return nil, err
		}
		due = append(due, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim callbacks: %w", err)
	}
	return due, nil
}

// CallbackAttempt is one delivery attempt of a callback, and where it
// leaves it.
type CallbackAttempt struct {
	Callback   int64
	Attempt    int
	StatusCode *int    // nil: no answer
	Error      *string // nil: none
	Duration   time.Duration
	State      string        // pending (to retry), delivered, failed, refused
	Wait       time.Duration // until the next attempt, when pending
}

// RecordCallbackAttempt records a in q (the caller's transaction): the
// attempt's row and the callback's new state.
func RecordCallbackAttempt(ctx context.Context, q Execer, a CallbackAttempt) error {
	if _, err := q.Exec(ctx, `INSERT INTO request_callback_attempts (callback_id, attempt, status_code, error, duration_ms)
		VALUES ($1, $2, $3, $4, $5)`, a.Callback, a.Attempt, a.StatusCode, a.Error, a.Duration.Milliseconds()); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, `UPDATE request_callbacks SET attempts = $2, state = $3, last_error = $4,
		next_attempt_at = now() + make_interval(secs => $5),
		finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE now() END
		WHERE id = $1`, a.Callback, a.Attempt, a.State, a.Error, a.Wait.Seconds()); err != nil {
		return err
	}
	return nil
}
