package requests

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The inbox (table events) is written here only: the intake paths add to
// it (QueueWebhookEvents, InsertNotifications), the bridge adds its own
// events (QueueEvent, QueueLoadEvents, DeferEvent), lifecycle.go marks
// them processed and PurgeEvents removes them.

// EventGPUFault is the inbox type of the bridge's GPU fault events
// (source "bridge"; policy kind bridge.GPU_FAULT), whose payload is a
// GPUFaultEvent.
const EventGPUFault = "GPU_FAULT"

// GPUFaultEvent is the payload of a GPU fault event.
type GPUFaultEvent struct {
	ProviderUUID string `json:"provider_uuid"`
	Host         string `json:"host"`
	PCIAddress   string `json:"pci_address"`
	Source       string `json:"source"` // xid, ecc, row_remap, retired_pages, gpu_lost
	Xid          uint64 `json:"xid,omitempty"`
	Reason       string `json:"reason"`
}

// Event is one event the bridge writes into its own inbox, once per
// (Source, MessageID).
type Event struct {
	Source, MessageID, Type string
	Instance                string // the instance's UUID
	Payload                 []byte // JSON
	// Processed writes the event processed already: the caller knows
	// the pipeline would do nothing with it (no rule of the policy
	// listens to its kind).
	Processed bool
}

// QueueEvent writes e into the inbox in q, unless an event of the same
// source and message id is there already; it occurred now, and belongs
// to the instance's project (the pipeline's turns between projects).
func QueueEvent(ctx context.Context, q Execer, e Event) error {
	if _, err := q.Exec(ctx, `INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload, project_id, processed_at)
		VALUES ($1, $2, $3, $4, now(), $5,
			(SELECT project_id FROM instances WHERE uuid = $4), CASE WHEN $6 THEN now() END) ON CONFLICT (source, message_id) DO NOTHING`,
		e.Source, e.MessageID, e.Type, e.Instance, e.Payload, e.Processed); err != nil {
		return fmt.Errorf("queue event %s: %w", e.MessageID, err)
	}
	return nil
}

// LoadEvents are the columns of events of one type the bridge writes in
// bulk (its load samples), one entry per event; they occurred now.
type LoadEvents struct {
	Source, Type                                string
	Instances, MessageIDs, Payloads, ProjectIDs []string
}

// QueueLoadEvents writes evs into the inbox in q, but those whose source
// and message id are there already; it returns how many it wrote.
func QueueLoadEvents(ctx context.Context, q Execer, evs LoadEvents) (int64, error) {
	tag, err := q.Exec(ctx, `INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload, project_id)
		SELECT $1, m, $2, i::uuid, now(), p::json, nullif(pj, '') FROM unnest($3::text[], $4::text[], $5::text[], $6::text[]) AS t(i, m, p, pj)
		ON CONFLICT (source, message_id) DO NOTHING`, evs.Source, evs.Type, evs.Instances, evs.MessageIDs, evs.Payloads, evs.ProjectIDs)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// DeferEvent queues the follow-up of inbox event id, due at until, for
// the rules it held back; the copy keeps the event's request when
// keepRequest.
func DeferEvent(ctx context.Context, q Execer, id int64, keepRequest bool, until time.Time, rules []string) error {
	_, err := q.Exec(ctx, `INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload,
			publisher_id, priority, request_id, global_request_id, project_id, user_id, not_before, deferred_from, deferred_rules)
		SELECT source, message_id || '#deferred-' || id, event_type, instance_uuid, occurred_at, payload,
			publisher_id, priority, CASE WHEN $2 THEN request_id END, global_request_id, project_id, user_id, $3, coalesce(deferred_from, id), $4
		FROM events WHERE id = $1`, id, keepRequest, until, rules)
	return err
}

// WebhookEvents are the columns of the inbox rows of accepted webhook
// requests, one entry per event; each names its request by its place in
// the requests it is written with (CreateWebhook).
type WebhookEvents struct {
	Sources, MessageIDs, Types []string
	Instances                  [][16]byte
	Occurred                   []time.Time
	Payloads                   []string
	Requests                   []int32  // 1-based, as SQL arrays count
	Projects                   []string // "" for none
}

// Add appends one event of the request at index request (0-based) of
// those it is written with.
func (w *WebhookEvents) Add(source, messageID, typ string, instance [16]byte, at time.Time, payload string, request int, project string) {
	w.Sources = append(w.Sources, source)
	w.MessageIDs = append(w.MessageIDs, messageID)
	w.Types = append(w.Types, typ)
	w.Instances = append(w.Instances, instance)
	w.Occurred = append(w.Occurred, at)
	w.Payloads = append(w.Payloads, payload)
	w.Requests = append(w.Requests, int32(request+1))
	w.Projects = append(w.Projects, project)
}

// Len is how many events w holds.
func (w *WebhookEvents) Len() int { return len(w.Sources) }

// Notifications are the columns of the inbox rows of notifications from
// one source, one entry per message; a nil pointer writes NULL. A row
// with a Status is processed already (recorded, not run).
//
// The payloads (JSON, valid UTF-8) travel as one byte string, each
// after the one before (AddPayload): Postgres cuts them out of it by
// offset. A text array of them would be built by pgx in a buffer that
// starts small and doubles, a batch's payloads copied again at each step.
type Notifications struct {
	Source                                                                string
	MessageIDs, Types                                                     []string
	Instances                                                             []*string
	Occurred                                                              []time.Time
	Publishers, Priorities, RequestIDs, GlobalRequestIDs, Projects, Users []string
	Statuses, Details                                                     []*string
	// Payloads holds the payloads one after the other; PayloadStarts
	// and PayloadLens say where each is (0-based offset, bytes).
	Payloads                   []byte
	PayloadStarts, PayloadLens []int32
}

// AddPayload appends the payload of the next message.
func (n *Notifications) AddPayload(p []byte) {
	n.PayloadStarts = append(n.PayloadStarts, int32(len(n.Payloads)))
	n.PayloadLens = append(n.PayloadLens, int32(len(p)))
	n.Payloads = append(n.Payloads, p...)
}

// InsertNotifications writes n into the inbox in tx, but the messages
// there already (by source and message id), in one statement; the rows
// it returns are (id, message_id, received_at) of those it wrote, for
// the caller to read and close.
func InsertNotifications(ctx context.Context, tx pgx.Tx, n *Notifications) (pgx.Rows, error) {
	return tx.Query(ctx, `INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload,
				publisher_id, priority, request_id, global_request_id, project_id, user_id, status, detail, processed_at)
			SELECT $1, m, e, u::uuid, o, convert_from(substring($6::bytea FROM ps + 1 FOR pl), 'UTF8')::json,
				pub, pr, NULLIF(rq, ''), NULLIF(grq, ''), NULLIF(pj, ''), NULLIF(us, ''), st, dt,
				CASE WHEN st IS NULL THEN NULL ELSE now() END
			FROM unnest($2::text[], $3::text[], $4::text[], $5::timestamptz[], $15::int[], $16::int[], $7::text[], $8::text[],
				$9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[])
				AS x(m, e, u, o, ps, pl, pub, pr, rq, grq, pj, us, st, dt)
			ON CONFLICT (source, message_id) DO NOTHING
			RETURNING id, message_id, received_at`,
		n.Source, n.MessageIDs, n.Types, n.Instances, n.Occurred, n.Payloads, n.Publishers, n.Priorities, n.RequestIDs,
		n.GlobalRequestIDs, n.Projects, n.Users, n.Statuses, n.Details, n.PayloadStarts, n.PayloadLens)
}

// PurgeEvents deletes the inbox events ids and the decisions about them
// that no request refers to (the retention purge of the inbox); it
// returns the rows deleted by table.
func PurgeEvents(ctx context.Context, q Execer, ids []int64) (map[string]int64, error) {
	d, err := DeleteEventDecisions(ctx, q, ids)
	if err != nil {
		return nil, err
	}
	tag, err := q.Exec(ctx, `DELETE FROM events WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("purge events: %w", err)
	}
	return map[string]int64{"decisions": d, "events": tag.RowsAffected()}, nil
}
