package requests

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
)

// PolicyMessage is a rule's notify(message) about a request.
type PolicyMessage struct {
	// Request is uuid.Nil for an event that acts without a request (a
	// Nova notification, a bridge event such as bridge.GPU_FAULT, whose
	// decision only notifies): no callback then.
	Request uuid.UUID
	// Kind and Source name the event when there is no request (Request
	// uuid.Nil): its type ("GPU_FAULT") and source ("bridge", "nova").
	Kind, Source string
	Instance     string // "" when the event named none
	Rule         string
	Message      string
	Why          string
	Actor        string
}

// NotifyCallback is the body POSTed to a request's callback URL for a
// rule's notify(message); "event" tells it from the final-state callback
// (Callback), which has none.
type NotifyCallback struct {
	Event        string    `json:"event"` // "notify"
	RequestID    uuid.UUID `json:"request_id"`
	Kind         string    `json:"kind"`
	InstanceUUID string    `json:"instance_uuid,omitempty"`
	Rule         string    `json:"rule"`
	Message      string    `json:"message"`
	At           time.Time `json:"at"`
}

// NotifyEvent is NotifyCallback's event.
const NotifyEvent = "notify"

// DeliverPolicyMessage records and delivers a rule's notify(message) in
// tx: an audit row, the bridge's vgpu.policy.notify notification in the
// outbox, and, when the request has a callback URL, a callback in
// request_callbacks. Both go out once tx commits (the notification relay,
// the callback loop: signed, with a timeout, retried), never inside it.
func DeliverPolicyMessage(ctx context.Context, tx pgx.Tx, m PolicyMessage) error {
	var kind, source, callbackURL, project, user string
	var now time.Time
	// A message about no request row (none is expected, but a notify must
	// not fail its decision) is audited and notified without a callback.
	err := tx.QueryRow(ctx, `SELECT coalesce(r.kind, ''), coalesce(r.source, ''), coalesce(r.callback_url, ''),
			coalesce(i.project_id, ''), coalesce(i.user_id, ''), now()
		FROM (SELECT $1::uuid AS id, $2::text AS inst) q LEFT JOIN requests r ON r.id = q.id
		LEFT JOIN instances i ON i.uuid::text = coalesce(r.instance_uuid::text, nullif(q.inst, ''))`, m.Request, m.Instance).
		Scan(&kind, &source, &callbackURL, &project, &user, &now)
	if err != nil {
		return fmt.Errorf("notify of request %s: %w", m.Request, err)
	}
	if m.Request == uuid.Nil {
		kind, source = m.Kind, m.Source
	}
	detail, err := json.Marshal(map[string]any{"message": m.Message, "rule": m.Rule, "why": m.Why,
		"notification": notify.PolicyNotify, "callback": callbackURL != ""})
	if err != nil {
		return err
	}
	object := m.Instance
	if object == "" {
		object = "-"
	}
	reqID := ""
	if m.Request != uuid.Nil {
		reqID = m.Request.String()
	}
	if err := Audit(ctx, tx, Entry{Actor: m.Actor, Action: "notify", ObjectType: "instance", ObjectID: object,
		RequestID: reqID, Detail: detail}); err != nil {
		return err
	}
	if err := notify.Queue(ctx, tx, notify.PolicyNotify, notify.Info, notify.NotifyObject(notify.NotifyPayload{
		RequestID: reqID, RequestKind: kind, Source: source, InstanceUUID: m.Instance, ProjectID: project, UserID: user,
		Rule: m.Rule, Message: m.Message, Why: m.Why})); err != nil {
		return err
	}
	if callbackURL == "" {
		return nil
	}
	payload, err := json.Marshal(NotifyCallback{Event: NotifyEvent, RequestID: m.Request, Kind: kind, InstanceUUID: m.Instance,
		Rule: m.Rule, Message: m.Message, At: now.UTC()})
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO request_callbacks (request_id, source, url, payload) VALUES ($1, $2, $3, $4)`,
		m.Request, SourceName(source), callbackURL, payload); err != nil {
		return fmt.Errorf("queue the notify callback of request %s: %w", m.Request, err)
	}
	return nil
}
