package controls

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// Actor is who changes something, and under which OpenStack request id.
type Actor struct {
	Name      string // API principal ("ops"), or "vgpu-bridge/<replica>"
	RequestID string // X-OpenStack-Request-ID; "" when none
}

// Entry is one audit_log row to write.
type Entry struct {
	Actor      Actor
	Action     string // e.g. controls.set, host.drain, dead_letter.replay
	ObjectType string // controls, host, gpu, dead_letter, retention
	ObjectID   string
	Detail     any // JSON-encoded
}

// execer is what writes: a pool, a connection or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Audit writes e in q (the change's own transaction).
func Audit(ctx context.Context, q execer, e Entry) error {
	_, err := q.Exec(ctx, `INSERT INTO audit_log (actor, action, object_type, object_id, request_id, detail, global_request_id)
		VALUES ($1, $2, $3, $4, nullif($5, ''), $6, coalesce(nullif($5, ''), nullif(current_setting('vgpu.global_request_id', true), '')))`,
		e.Actor.Name, e.Action, e.ObjectType, e.ObjectID, e.Actor.RequestID, jsonDetail(e.Detail))
	if err != nil {
		return fmt.Errorf("audit %s %s/%s: %w", e.Action, e.ObjectType, e.ObjectID, err)
	}
	return nil
}
