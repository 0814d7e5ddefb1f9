package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

// Event is one new notification, as OnApplied sees it.
type Event struct {
	ID           int64 // events.id
	Source       string
	Message      *nova.Message
	Payload      nova.Payload // nil when Status is "unrecognized" and nothing decoded
	InstanceUUID string       // "" when the event is not about an instance
	// Status is "" for an accepted event and "unrecognized" for an unknown
	// event type or payload major version (recorded, not applied).
	Status string
	Detail string
	// Applied is true when the event changed instance or flavor state;
	// false for an event older than the state already held.
	Applied bool
	// At is the time the event's state is ordered by: Nova's timestamp,
	// but never later than ClockSkewTolerance after the bridge received
	// it (ReceivedAt), so a clock running ahead cannot hold the state.
	At time.Time
	// ReceivedAt is when the bridge received the event (events.received_at,
	// Postgres's clock); Horizon is ReceivedAt + ClockSkewTolerance, the
	// latest time the event's times are taken to say.
	ReceivedAt, Horizon time.Time
}

// bounded is t, no later than the event's Horizon.
func (ev *Event) bounded(t time.Time) time.Time {
	if t.After(ev.Horizon) {
		return ev.Horizon
	}
	return t
}

// Dead-letter reasons (the "reason" label of the dead-letter metric).
const (
	ReasonNotJSON        = string(nova.KindNotJSON)
	ReasonBrokenEnvelope = string(nova.KindBrokenEnvelope)
	ReasonNoMessageID    = string(nova.KindNoMessageID)
	ReasonSchema         = string(nova.KindSchema)
	ReasonOversize       = "oversize"
)

// item is one delivery of a batch: an event to keep or a dead letter.
type item struct {
	tag uint64
	src *amqp.Delivery // what was delivered (its body and headers make the dead letter)
	ev  *Event
	// dead letter
	reason, detail string
	msgID          string // when the message decoded far enough to have one
	raw            []byte
	truncated      bool
	headers        []byte
	minimal        bool // the last resort: no body, no delivery headers
	// dedupeKey keeps a dead letter once per source however often its
	// message is delivered: "id:" and its message_id, else "sha256:" and
	// the digest of the body as delivered (see dedupeKey).
	dedupeKey string
}

type batchResult struct {
	applied, duplicates, stale, unrecognized int
	dead                                     map[string]int
}

// statusUnrecognized marks events recorded but not applied.
const statusUnrecognized = "unrecognized"

// applyBatch writes a batch in one transaction: dead letters, the inbox rows
// (ON CONFLICT DO NOTHING), the state updates of the new events and the
// OnApplied hook.
func (c *Consumer) applyBatch(ctx context.Context, items []*item) (batchResult, error) {
	res := batchResult{dead: map[string]int{}}
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return res, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck

	// Dead letters.
	var dl struct {
		reason, detail, msgID, headers, keys []string
		raw                                  [][]byte
		trunc                                []bool
	}
	for _, it := range items {
		if it.ev != nil {
			continue
		}
		dl.reason = append(dl.reason, it.reason)
		dl.detail = append(dl.detail, it.detail)
		dl.msgID = append(dl.msgID, it.msgID)
		dl.raw = append(dl.raw, it.raw)
		dl.trunc = append(dl.trunc, it.truncated)
		dl.headers = append(dl.headers, string(it.headers))
		dl.keys = append(dl.keys, it.dedupeKey)
	}
	if len(dl.reason) > 0 {
		// A message delivered again is kept once (dead_letters_dedupe_idx):
		// the copies count as duplicates.
		rows, err := tx.Query(ctx, `INSERT INTO dead_letters (source, reason, detail, message_id, raw, raw_truncated, headers, dedupe_key)
			SELECT $1, r, d, NULLIF(m, ''), b, t, h::jsonb, NULLIF(k, '')
			FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[], $6::bool[], $7::text[], $8::text[]) AS x(r, d, m, b, t, h, k)
			ON CONFLICT (source, dedupe_key) DO NOTHING
			RETURNING reason`,
			c.cfg.Source, dl.reason, dl.detail, dl.msgID, dl.raw, dl.trunc, dl.headers, dl.keys)
		if err != nil {
			return res, fmt.Errorf("insert dead letters: %w", err)
		}
		kept := 0
		for rows.Next() {
			var r string
			if err := rows.Scan(&r); err != nil {
				rows.Close()
				return res, err
			}
			res.dead[r]++
			kept++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return res, fmt.Errorf("insert dead letters: %w", err)
		}
		res.duplicates += len(dl.reason) - kept
	}

	// Inbox, deduplicated within the batch first.
	seen := make(map[string]*Event, len(items))
	var evs []*Event
	for _, it := range items {
		if it.ev == nil {
			continue
		}
		if _, dup := seen[it.ev.Message.MessageID]; dup {
			res.duplicates++
			continue
		}
		seen[it.ev.Message.MessageID] = it.ev
		evs = append(evs, it.ev)
	}
	if len(evs) > 0 {
		n := len(evs)
		var (
			ids, types, uuids, pubs, prios, reqs, greqs, projs, users, stats, details = mk(n), mk(n), mkp(n), mk(n), mk(n), mk(n), mk(n), mk(n), mk(n), mkp(n), mkp(n)
			occurred                                                                  = make([]time.Time, n)
		)
		ns := &requests.Notifications{Source: c.cfg.Source, MessageIDs: ids, Types: types, Instances: uuids, Occurred: occurred,
			Publishers: pubs, Priorities: prios, RequestIDs: reqs, GlobalRequestIDs: greqs, Projects: projs, Users: users,
			Statuses: stats, Details: details, PayloadStarts: make([]int32, 0, n), PayloadLens: make([]int32, 0, n)}
		size := 0
		for _, ev := range evs {
			size += len(ev.Message.RawPayload)
		}
		buf := c.payloadBuf(size)
		defer c.putPayloadBuf(buf)
		ns.Payloads = (*buf)[:0]
		for i, ev := range evs {
			m := ev.Message
			ids[i], types[i] = m.MessageID, m.EventType
			ns.AddPayload(m.RawPayload)
			if ev.InstanceUUID != "" {
				uuids[i] = &ev.InstanceUUID
			}
			occurred[i] = m.Timestamp
			pubs[i], prios[i] = m.PublisherID, m.Priority
			reqs[i], greqs[i], projs[i], users[i] = m.Context.RequestID, m.Context.GlobalRequestID, m.Context.ProjectID, m.Context.UserID
			if ev.Status != "" {
				stats[i] = &ev.Status
			}
			if ev.Detail != "" {
				details[i] = &ev.Detail
			}
		}
		rows, err := requests.InsertNotifications(ctx, tx, ns)
		if err != nil {
			return res, fmt.Errorf("insert events: %w", err)
		}
		inserted := 0
		for rows.Next() {
			var id int64
			var mid string
			var recv time.Time
			if err := rows.Scan(&id, &mid, &recv); err != nil {
				rows.Close()
				return res, err
			}
			ev := seen[mid]
			ev.ID, ev.ReceivedAt, ev.Horizon = id, recv, recv.Add(c.cfg.ClockSkewTolerance)
			ev.At = ev.bounded(ev.Message.Timestamp)
			inserted++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return res, fmt.Errorf("insert events: %w", err)
		}
		res.duplicates += len(evs) - inserted

		// State updates for the new events, in one round trip, ordered by
		// row (table, key) so that concurrent batches lock rows in the same
		// order and cannot deadlock; the events of one row keep their order.
		order := make([]*Event, 0, len(evs))
		for _, ev := range evs {
			if ev.ID != 0 {
				order = append(order, ev)
			}
		}
		sort.SliceStable(order, func(i, j int) bool { return rowKey(order[i]) < rowKey(order[j]) })
		var b pgx.Batch
		var queued, snapEvents []*Event
		for _, ev := range order {
			if ev.ID == 0 {
				continue
			}
			if ev.Status == statusUnrecognized && ev.Payload == nil {
				res.unrecognized++
				continue
			}
			if ev.Status == statusUnrecognized {
				res.unrecognized++
			}
			if _, _, ok := instanceOf(ev.Payload); ok {
				snapEvents = append(snapEvents, ev) // the fold leaves stale copies out (snapshotOf)
				continue
			}
			if queueState(&b, ev) {
				queued = append(queued, ev)
			}
		}
		snaps, stale := foldSnapshots(snapEvents)
		res.stale += stale
		stale, err = applySnapshots(ctx, tx, snaps)
		if err != nil {
			return res, err
		}
		res.stale += stale
		if b.Len() > 0 {
			br := tx.SendBatch(ctx, &b)
			for _, ev := range queued {
				tag, err := br.Exec()
				if err != nil {
					br.Close()
					return res, fmt.Errorf("update state from %s %s: %w", ev.Message.EventType, ev.Message.MessageID, err)
				}
				ev.Applied = tag.RowsAffected() > 0
				if !ev.Applied {
					res.stale++
				}
			}
			if err := br.Close(); err != nil {
				return res, fmt.Errorf("update state: %w", err)
			}
		}
		for _, ev := range evs {
			if ev.ID == 0 {
				continue
			}
			res.applied++
			if c.cfg.OnApplied != nil {
				if err := c.cfg.OnApplied(ctx, tx, *ev); err != nil {
					return res, fmt.Errorf("on applied %s: %w", ev.Message.MessageID, err)
				}
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("commit: %w", err)
	}
	return res, nil
}

// rowKey names the state row an event updates.
func rowKey(ev *Event) string {
	if ev.InstanceUUID != "" {
		return "i" + ev.InstanceUUID
	}
	if f, ok := ev.Payload.(*nova.Flavor); ok {
		return "f" + f.FlavorID
	}
	if sv, ok := ev.Payload.(*nova.ServiceStatus); ok {
		return "h" + sv.Host
	}
	return ""
}

// payloadBuf returns a buffer of at least size bytes for a batch's
// payloads (requests.Notifications.Payloads), kept between batches:
// pgx copies it into its own while it sends the statement.
func (c *Consumer) payloadBuf(size int) *[]byte {
	if b, _ := c.payloads.Get().(*[]byte); b != nil && cap(*b) >= size {
		return b
	}
	b := make([]byte, 0, size+size/4)
	return &b
}

// putPayloadBuf keeps b for the next batch, unless it grew past what a
// default batch of large messages needs.
func (c *Consumer) putPayloadBuf(b *[]byte) {
	if cap(*b) <= maxKeptPayloadBuf {
		c.payloads.Put(b)
	}
}

const maxKeptPayloadBuf = 8 << 20

func mk(n int) []string   { return make([]string, n) }
func mkp(n int) []*string { return make([]*string, n) }

const upsertTask = `INSERT INTO instances AS i (uuid, project_id, user_id, vm_state, flavor, vgpu_demand, vgpus, fault,
		last_event_type, last_event_at, last_event_rank, last_message_id, updated_at)
	VALUES ($1, NULLIF($2, ''), NULLIF($3, ''), NULLIF($4, ''), $5, $6, $7, $8, $9, $10, $11, $12, now())
	ON CONFLICT (uuid) DO UPDATE SET
		vm_state = CASE WHEN i.vm_state = 'deleted' THEN i.vm_state ELSE COALESCE(EXCLUDED.vm_state, i.vm_state) END,
		task_state = NULL, fault = EXCLUDED.fault,
		project_id = COALESCE(i.project_id, EXCLUDED.project_id), user_id = COALESCE(i.user_id, EXCLUDED.user_id),
		flavor = COALESCE(i.flavor, EXCLUDED.flavor),
		vgpu_demand = CASE WHEN i.flavor IS NULL THEN EXCLUDED.vgpu_demand ELSE i.vgpu_demand END,
		vgpus = CASE WHEN i.flavor IS NULL THEN EXCLUDED.vgpus ELSE i.vgpus END,
		last_event_type = EXCLUDED.last_event_type, last_event_at = EXCLUDED.last_event_at,
		last_event_rank = EXCLUDED.last_event_rank, last_message_id = EXCLUDED.last_message_id,
		updated_at = now()
	WHERE i.last_event_at IS NULL
		OR (i.last_event_at, i.last_event_rank) < (EXCLUDED.last_event_at, EXCLUDED.last_event_rank)`

const upsertFlavor = `INSERT INTO flavors AS f (flavorid, name, vcpus, memory_mb, is_public, extra_specs, vgpu_demand, vgpus,
		spec_error, last_event_at, deleted_at, updated_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, now())
	ON CONFLICT (flavorid) DO UPDATE SET
		name = EXCLUDED.name, vcpus = EXCLUDED.vcpus, memory_mb = EXCLUDED.memory_mb, is_public = EXCLUDED.is_public,
		extra_specs = EXCLUDED.extra_specs, vgpu_demand = EXCLUDED.vgpu_demand, vgpus = EXCLUDED.vgpus,
		spec_error = EXCLUDED.spec_error, last_event_at = EXCLUDED.last_event_at,
		deleted_at = COALESCE(f.deleted_at, EXCLUDED.deleted_at), updated_at = now()
	WHERE f.last_event_at IS NULL OR f.last_event_at <= EXCLUDED.last_event_at`

// queueState queues the state update of one event; false when the event
// changes no state.
func queueState(b *pgx.Batch, ev *Event) bool {
	m := ev.Message
	rank := m.Event.Phase.Rank()
	switch p := ev.Payload.(type) {
	case *nova.ComputeTask:
		var flavor, demand []byte
		vgpus := 0
		projectID, userID := "", ""
		if rs := p.RequestSpec; rs != nil {
			projectID, userID = rs.ProjectID, rs.UserID
			if rs.Flavor != nil {
				flavor, demand, vgpus = flavorJSON(rs.Flavor)
			}
		}
		b.Queue(upsertTask, p.InstanceUUID, projectID, userID, p.State, flavor, demand, vgpus, jsonOrNil(p.Reason),
			m.EventType, ev.At, rank, m.MessageID)
		return true
	case *nova.Flavor:
		var deleted *time.Time
		if m.EventType == "flavor.delete" {
			deleted = &ev.At
		}
		specs, _ := json.Marshal(p.ExtraSpecs)
		d, err := nova.ParseExtraSpecs(p.ExtraSpecs)
		var specErr *string
		var demand []byte
		if err != nil {
			s := err.Error()
			specErr = &s
		} else {
			demand, _ = json.Marshal(d)
		}
		b.Queue(upsertFlavor, p.FlavorID, p.Name, p.VCPUs, p.MemoryMB, p.IsPublic, specs, demand, demandUnits(d),
			specErr, ev.At, deleted)
		return true
	case *nova.ServiceStatus:
		return queueService(b, m, p, ev.At)
	}
	return false
}

// flavorJSON returns the flavor, its parsed vGPU demand ({"error": …} when
// the extra specs are malformed) and its vGPU units.
func flavorJSON(f *nova.Flavor) (flavor, demand []byte, vgpus int) {
	flavor, _ = json.Marshal(f)
	d, err := nova.ParseExtraSpecs(f.ExtraSpecs)
	if err != nil {
		demand, _ = json.Marshal(map[string]string{"error": err.Error()})
		return flavor, demand, 0
	}
	demand, _ = json.Marshal(d)
	return flavor, demand, demandUnits(d)
}

func demandUnits(d nova.Demand) int {
	n := d.VGPUs()
	for _, v := range d.CustomResources() {
		n += v
	}
	return n
}

func jsonOrNil(v *nova.Exception) []byte {
	if v == nil {
		return nil
	}
	b, _ := json.Marshal(v)
	return b
}

// storable reports why Postgres could not store a decoded message (a NUL
// character, invalid UTF-8), so it becomes a dead letter instead of failing
// its batch.
func storable(m *nova.Message) error {
	for _, s := range []string{m.MessageID, m.EventType, m.PublisherID, m.Priority,
		m.Context.RequestID, m.Context.GlobalRequestID, m.Context.ProjectID, m.Context.UserID} {
		if strings.IndexByte(s, 0) >= 0 {
			return errors.New("a string field contains NUL")
		}
	}
	if !utf8.Valid(m.RawPayload) {
		return errors.New("payload is not valid UTF-8")
	}
	if hasEscapedNUL(m.RawPayload) {
		return errors.New(`payload contains \u0000, which Postgres cannot store`)
	}
	return nil
}

// hasEscapedNUL finds a JSON escape \u0000 (not an escaped backslash
// followed by "u0000").
func hasEscapedNUL(b []byte) bool {
	for i := 0; i+5 < len(b); i++ {
		// Jump to the next backslash (most of a payload has none).
		j := bytes.IndexByte(b[i:len(b)-5], '\\')
		if j < 0 {
			return false
		}
		i += j
		if b[i+1] == '\\' {
			i++ // skip the escaped backslash
			continue
		}
		if string(b[i+1:i+6]) == "u0000" {
			return true
		}
	}
	return false
}

// isDataError reports a Postgres data exception (class 22) or integrity
// violation (class 23): the batch holds a message Postgres refuses, which
// retrying as a whole will not fix.
func isDataError(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23")
	}
	return false
}

// isConflict reports a deadlock or serialization failure (class 40) between
// concurrent batches; retrying the batch resolves it.
func isConflict(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && strings.HasPrefix(pe.Code, "40")
}
