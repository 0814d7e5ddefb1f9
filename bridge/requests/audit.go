package requests

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Entry is one row of the audit log: who did what to which object, and why.
type Entry struct {
	Actor      string // "vgpu-bridge/<replica>", an operator, …
	Action     string
	ObjectType string // request, instance, attachment, command, drift_finding, resource_provider, …
	ObjectID   string
	RequestID  string // the request it belongs to; "" for none
	// GlobalRequestID is the row's global request id; "" takes the
	// transaction's vgpu.global_request_id (the column's default).
	GlobalRequestID string
	// Detail is JSON-encoded; []byte and json.RawMessage are taken as
	// JSON already, nil writes NULL.
	Detail any
}

const insertAudit = `INSERT INTO audit_log (actor, action, object_type, object_id, request_id, detail, global_request_id)
	VALUES ($1, $2, $3, $4, nullif($5, ''), $6, coalesce(nullif($7, ''), nullif(current_setting('vgpu.global_request_id', true), '')))`

// Audit writes e in q, the change's own transaction: one statement.
func Audit(ctx context.Context, q Execer, e Entry) error {
	if _, err := q.Exec(ctx, insertAudit, e.Actor, e.Action, e.ObjectType, e.ObjectID, e.RequestID, detailJSON(e.Detail), e.GlobalRequestID); err != nil {
		return fmt.Errorf("audit %s %s/%s: %w", e.Action, e.ObjectType, e.ObjectID, err)
	}
	return nil
}

// QueueAudit queues e's row in b, to be written with the batch.
func QueueAudit(b *pgx.Batch, e Entry) {
	b.Queue(insertAudit, e.Actor, e.Action, e.ObjectType, e.ObjectID, e.RequestID, detailJSON(e.Detail), e.GlobalRequestID)
}

// PurgeAudit deletes up to n audit rows written before cutoff (the
// retention purge); it returns how many.
func PurgeAudit(ctx context.Context, tx pgx.Tx, cutoff time.Time, n int) (int64, error) {
	tag, err := tx.Exec(ctx, `DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log WHERE at < $1 ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED)`, cutoff, n)
	if err != nil {
		return 0, fmt.Errorf("purge audit log: %w", err)
	}
	return tag.RowsAffected(), nil
}

// detailJSON is v as the detail column takes it.
func detailJSON(v any) []byte {
	switch d := v.(type) {
	case nil:
		return nil
	case []byte:
		return d
	case json.RawMessage:
		return d
	}
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	return b
}

// Auditor writes audit rows as one actor, each in its own statement on
// DB: what a lower layer that may not import this package is handed
// (placement.Config.Auditor).
type Auditor struct {
	DB    Execer
	Actor string
}

// Audit writes one row: action on objectType/objectID, with detail.
func (a Auditor) Audit(ctx context.Context, action, objectType, objectID string, detail any) error {
	return Audit(ctx, a.DB, Entry{Actor: a.Actor, Action: action, ObjectType: objectType, ObjectID: objectID, Detail: detail})
}
