package requests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
)

// The verbs of this file write, in one statement each (data-modifying
// CTEs), what the verbs beside them write in several, on the paths that
// run once per attach: the relay's record of what it sent with the
// request's move to dispatched (TransitionIfSent), an agent's result with
// the read of its request (FinishCommandOnceView), and a request's
// success with its change event and notification (MarkAttachedNoted, then
// SucceedNoted). The rows written are those the separate verbs write.

// moveExtra is what a request's move (Store.move) writes besides, in its
// statement.
type moveExtra struct {
	// sent: commands the broker confirmed, recorded as Sent does.
	sent []SentCommand
	// noted: the move's notification was built beforehand, note (nil:
	// the move notifies nothing); notifyTransition is not run.
	noted bool
	note  *queuedNote
	// event: an inbox event queued as QueueEvent does.
	event *Event
}

type queuedNote struct {
	event   string
	prio    notify.Priority
	payload []byte
}

// ctes appends what x writes to a move's statement as CTEs after u and a
// (their arguments appended to args); queued: the statement queues the
// notification (CTE n).
func (x *moveExtra) ctes(args *[]any) (ctes string, queued bool) {
	if x == nil {
		return "", false
	}
	arg := func(v any) string {
		*args = append(*args, v)
		return "$" + strconv.Itoa(len(*args))
	}
	if len(x.sent) > 0 {
		ids, bodies := sentArrays(x.sent)
		ctes += `, s AS (UPDATE commands c SET sent_at = now(), publish_attempts = c.publish_attempts + 1, last_error = NULL,
				body = coalesce(t.body::jsonb, c.body)
			FROM unnest(` + arg(ids) + `::uuid[], ` + arg(bodies) + `::text[]) AS t(id, body) WHERE c.id = t.id)`
	}
	if e := x.event; e != nil {
		inst := arg(e.Instance)
		ctes += `, e AS (INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload, project_id, processed_at)
			VALUES (` + arg(e.Source) + `, ` + arg(e.MessageID) + `, ` + arg(e.Type) + `, ` + inst + `, now(), ` + arg(e.Payload) + `,
				(SELECT project_id FROM instances WHERE uuid = ` + inst + `), CASE WHEN ` + arg(e.Processed) + ` THEN now() END)
			ON CONFLICT (source, message_id) DO NOTHING)`
	}
	if n := x.note; n != nil {
		ctes += ", " + notify.QueueCTE("n", "u", arg(n.event), arg(string(n.prio)), arg(string(n.payload)))
		queued = true
	}
	return ctes, queued
}

// SentCommand is a command the broker confirmed (Sent): Signed, when not
// nil, is its body as it went out.
type SentCommand struct {
	ID     uuid.UUID
	Signed []byte
}

func sentArrays(sent []SentCommand) ([]uuid.UUID, []*string) {
	ids, bodies := make([]uuid.UUID, len(sent)), make([]*string, len(sent))
	for i, c := range sent {
		ids[i] = c.ID
		if c.Signed != nil {
			b := string(c.Signed)
			bodies[i] = &b
		}
	}
	return ids, bodies
}

// SentBatch records, in one statement, that the broker confirmed the
// commands sent, as Sent does for each.
func SentBatch(ctx context.Context, q Execer, sent []SentCommand) error {
	if len(sent) == 0 {
		return nil
	}
	ids, bodies := sentArrays(sent)
	if _, err := q.Exec(ctx, `UPDATE commands c SET sent_at = now(), publish_attempts = c.publish_attempts + 1, last_error = NULL,
			body = coalesce(t.body::jsonb, c.body)
		FROM unnest($1::uuid[], $2::text[]) AS t(id, body) WHERE c.id = t.id`, ids, bodies); err != nil {
		return fmt.Errorf("record %d sent command(s): %w", len(sent), err)
	}
	return nil
}

// TransitionIfSent is TransitionIf that also records the commands sent
// as sent (SentBatch), in the same statement, whether the request moves
// or not.
func (s *Store) TransitionIfSent(ctx context.Context, tx pgx.Tx, id uuid.UUID, from, to State, phase, reason, code string, sent []SentCommand) (Request, bool, error) {
	if !Allowed(from, to) {
		return Request{}, false, fmt.Errorf("request %s: %s → %s: %w", id, from, to, ErrIllegal)
	}
	r, err := s.move(ctx, tx, s.actor, id, []string{string(from)}, to, phase, reason, code, nil, &moveExtra{sent: sent})
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	return r, err == nil, err
}

// ResultView is what the direct path reads of the request an agent's
// result answers, with the request's row locked (FinishCommandOnceView).
type ResultView struct {
	State State
	// NextKind is the kind of the request's first action command still
	// open, "" when none; OpenFailed: an action command of it finished
	// other than succeeded. The command answered counts in neither.
	NextKind   string
	OpenFailed bool
	// Releasing: attachments are being released by the request.
	Releasing bool
	// Instance, Move, Workload, Kind: the request's instance, and its
	// body's move and workload, and its kind.
	Instance, Move, Workload, Kind string
	// Profile and Host of its first vGPU being made (pending or attached).
	Profile, Host string
}

// FinishCommandOnceView is FinishCommandOnce that, for an action command
// of a request whose kind is not one of noView, also locks the request
// and reads its ResultView, in the same statement (c.View; nil when not
// read or the request is gone).
func FinishCommandOnceView(ctx context.Context, q Querier, id, host, status string, result []byte, noView []string) (FinishedCommand, bool, error) {
	var c FinishedCommand
	u, err := uuid.Parse(id)
	if err != nil || u.String() != id {
		return c, false, nil
	}
	var st, next, instance, move, workload, kind, profile, vhost *string
	var openFailed, releasing *bool
	// The statement's snapshot is taken before the command is finished:
	// the command answered is left out of the open and failed ones by
	// its id.
	err = q.QueryRow(ctx, `WITH c AS (
			UPDATE commands SET result_status = $3, result = $4, finished_at = now()
			WHERE id = $1 AND finished_at IS NULL AND ($2 = '' OR host = $2)
			RETURNING id, request_id, purpose, kind, host, attachment_id)
		SELECT c.request_id, c.purpose, c.kind, c.host, c.attachment_id,
			v.state, v.next_kind, v.open_failed, v.releasing, v.instance, v.move, v.workload, v.kind, v.profile, v.host
		FROM c LEFT JOIN LATERAL (
			SELECT r.state,
				(SELECT kind FROM commands WHERE request_id = r.id AND purpose = 'action' AND finished_at IS NULL AND id <> c.id
					ORDER BY seq LIMIT 1) AS next_kind,
				EXISTS (SELECT 1 FROM commands WHERE request_id = r.id AND purpose = 'action' AND finished_at IS NOT NULL
					AND result_status <> 'succeeded' AND id <> c.id) AS open_failed,
				EXISTS (SELECT 1 FROM vgpu_attachments WHERE release_request_id = r.id AND state = 'releasing') AS releasing,
				coalesce(r.instance_uuid::text, '') AS instance, coalesce(r.body->>'move', '') AS move,
				coalesce(r.body->>'workload', '') AS workload, coalesce(r.kind, '') AS kind,
				coalesce(a.profile, '') AS profile, coalesce(a.host, '') AS host
			FROM requests r LEFT JOIN LATERAL (SELECT profile, host FROM vgpu_attachments
				WHERE request_id = r.id AND state IN ('pending', 'attached') ORDER BY created_at LIMIT 1) a ON true
			WHERE r.id = c.request_id AND c.purpose = 'action' AND c.kind <> ALL($5::text[])
			FOR UPDATE OF r) v ON true`, u, host, status, result, noView).
		Scan(&c.Request, &c.Purpose, &c.Kind, &c.Host, &c.Attachment,
			&st, &next, &openFailed, &releasing, &instance, &move, &workload, &kind, &profile, &vhost)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("record result of command %s: %w", id, err)
	}
	if st != nil {
		c.View = &ResultView{State: State(*st), OpenFailed: *openFailed, Releasing: *releasing, Instance: *instance, Move: *move,
			Workload: *workload, Kind: *kind, Profile: *profile, Host: *vhost}
		if next != nil {
			c.View.NextKind = *next
		}
	}
	return c, true, nil
}

// Noted is what the success of a request says in its notification, read
// by MarkAttachedNoted with the attachments it marked.
type Noted struct {
	request Request // the fields the notification names (kind, source, instance)
	pre     notePrefetch
}

// MarkAttachedNoted is MarkAttached that also reads, in the same
// statement, what the notification of the request's success names (the
// request, its instance's project and user, and its vGPUs as they are
// once marked): SucceedNoted queues it.
func MarkAttachedNoted(ctx context.Context, q Querier, reqID uuid.UUID, at time.Time) (int64, Noted, error) {
	var n Noted
	var count int64
	err := q.QueryRow(ctx, `WITH a AS (
			UPDATE vgpu_attachments SET state = 'attached', updated_at = now() WHERE request_id = $1 AND state = 'pending'
			RETURNING id, request_id, instance_uuid, host, profile, type_id, resource_class, amount),
		us AS (
			INSERT INTO vgpu_usage (path, attachment_id, instance_uuid, project_id, user_id, host, profile, vgpu_type, resource_class, amount, started_at)
			SELECT 'direct', a.id, a.instance_uuid, i.project_id, i.user_id, a.host, coalesce(a.profile, ''), a.type_id,
				coalesce(a.resource_class, 'VGPU'), a.amount, `+clampedAt+`
			FROM a LEFT JOIN instances i ON i.uuid = a.instance_uuid
			ON CONFLICT (attachment_id) DO NOTHING RETURNING 1)
		SELECT (SELECT count(*) FROM us), r.id, r.source, r.kind, r.instance_uuid, coalesce(i.project_id, ''), coalesce(i.user_id, ''),
			(SELECT coalesce(jsonb_agg(jsonb_build_object(
					'new', v.request_id = $1, 'id', v.id::text, 'profile', coalesce(v.profile,''), 'type_id', coalesce(v.type_id,''),
					'class', coalesce(v.resource_class,'VGPU'), 'amount', v.amount, 'host', v.host, 'provider', coalesce(v.provider_uuid::text,''),
					'pci', coalesce(v.pci_address,''), 'state', CASE WHEN m.id IS NOT NULL THEN 'attached' ELSE v.state END)
					ORDER BY v.created_at, v.id), '[]'::jsonb)
				FROM vgpu_attachments v LEFT JOIN a m ON m.id = v.id WHERE v.request_id = $1 OR v.release_request_id = $1)
		FROM requests r LEFT JOIN instances i ON i.uuid = r.instance_uuid WHERE r.id = $1`, reqID, nullTime(at)).
		Scan(&count, &n.request.ID, &n.request.Source, &n.request.Kind, &n.request.InstanceUUID, &n.pre.project, &n.pre.user, &n.pre.vgpus)
	if err != nil {
		return 0, n, fmt.Errorf("request %s: mark attachments attached: %w", reqID, err)
	}
	return count, n, nil
}

// SucceedNoted moves request id to succeeded with reason, as Transition
// does, queueing in the same statement its notification, from n
// (MarkAttachedNoted, in the same transaction), and event ev when not nil
// (QueueEvent).
func (s *Store) SucceedNoted(ctx context.Context, tx pgx.Tx, id uuid.UUID, reason string, n Noted, ev *Event) (Request, error) {
	to := Succeeded
	x := &moveExtra{event: ev, noted: true}
	// The request as the move leaves it, as far as its notification says.
	r := n.request
	r.State, r.Reason, r.Code = to, reason, ""
	p, op, err := actionPayload(ctx, tx, r, &n.pre)
	if err != nil {
		return Request{}, fmt.Errorf("notification of request %s: %w", id, err)
	}
	if op != "" {
		b, err := json.Marshal(notify.Action(p))
		if err != nil {
			return Request{}, fmt.Errorf("notification of request %s: %w", id, err)
		}
		x.note = &queuedNote{event: "vgpu." + op + ".end", prio: notify.Info, payload: b}
	}
	got, err := s.move(ctx, tx, s.actor, id, allowedFrom(to), to, "", reason, "", nil, x)
	if errors.Is(err, pgx.ErrNoRows) {
		return got, s.refused(ctx, tx, id, to)
	}
	return got, err
}
