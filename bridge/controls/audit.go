package controls

import (
	"context"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
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

// Audit writes e in q (the change's own transaction), through the audit
// log's owner: the row's global request id is the actor's, or else the
// transaction's.
func Audit(ctx context.Context, q requests.Execer, e Entry) error {
	return requests.Audit(ctx, q, requests.Entry{Actor: e.Actor.Name, Action: e.Action, ObjectType: e.ObjectType, ObjectID: e.ObjectID,
		RequestID: e.Actor.RequestID, GlobalRequestID: e.Actor.RequestID, Detail: jsonDetail(e.Detail)})
}
