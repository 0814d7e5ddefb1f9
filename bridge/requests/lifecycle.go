package requests

// The lifecycle verbs. This package alone writes the request lifecycle:
// requests (with their audit rows, Transition), the decisions taken for
// inbox events, the outbox of commands, the vGPU attachments, their usage
// (usage.go), the inbox itself (events.go), the audit log (audit.go), the
// Nova-path resizes (resize.go) and the callbacks (callbacks.go). Everyone
// else calls these verbs, in their own transaction; TestOneOwner fails when
// a production package writes a table it does not own (owner_test.go maps
// each table to its owner).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
)

// Execer is what a verb writes through: a transaction, or the pool for a
// change of one statement.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SetDeadline sets when the request's deadline loop looks at it again.
func SetDeadline(ctx context.Context, q Execer, id uuid.UUID, at time.Time) error {
	if _, err := q.Exec(ctx, `UPDATE requests SET deadline_at = $2 WHERE id = $1`, id, at); err != nil {
		return fmt.Errorf("set deadline of request %s: %w", id, err)
	}
	return nil
}

// Decision is the record of what the policy decided for one inbox event.
type Decision struct {
	EventID      int64
	RequestID    *uuid.UUID // nil for an event no request is about
	InstanceUUID *string
	Policy       string
	Rejected     bool
	Reason       string
	Doc          []byte // the decision and plan, as JSON
	Replica      string
}

// RecordDecision records d once per event (a replay of the event keeps the
// first record). created_at is when the decision was made (after its
// claims), not when its transaction began.
func RecordDecision(ctx context.Context, q Execer, d Decision) error {
	p := RecordDecisionPart(d)
	if _, err := q.Exec(ctx, p.SQL, p.Args...); err != nil {
		return fmt.Errorf("record decision of event %d: %w", d.EventID, err)
	}
	return nil
}

// RecordDecisionPart is RecordDecision as a part of a statement
// (store.With).
func RecordDecisionPart(d Decision) store.Part {
	return store.Part{SQL: `INSERT INTO decisions (event_id, request_id, instance_uuid, policy, rejected, reason, decision, replica, created_at)
		VALUES ($1::bigint, $2::uuid, $3::uuid, $4::text, $5::bool, nullif($6::text,''), $7::jsonb, $8::text, clock_timestamp()) ON CONFLICT (event_id) DO NOTHING`,
		Args: []any{d.EventID, d.RequestID, d.InstanceUUID, d.Policy, d.Rejected, d.Reason, d.Doc, d.Replica}}
}

// Command purposes (commands.purpose).
const (
	PurposeAction       = "action"
	PurposeCompensation = "compensation"
)

// Command is one row of the outbox: a signed-at-send command for a host's
// agent, sent in seq order within its request and purpose.
type Command struct {
	ID           string
	Host         string
	Kind         string
	Body         []byte // the protocol.Command as JSON
	ExpiresAt    time.Time
	Seq          int
	AttachmentID *uuid.UUID
	InstanceUUID string // "" when the command is not about an instance
}

// QueueCommands puts cmds of request reqID in the outbox; the relay sends
// them after the caller commits.
func QueueCommands(ctx context.Context, q Execer, reqID uuid.UUID, purpose string, cmds []Command) error {
	for _, c := range cmds {
		var inst *string
		if c.InstanceUUID != "" {
			inst = &c.InstanceUUID
		}
		if _, err := q.Exec(ctx, `INSERT INTO commands (id, request_id, host, kind, body, expires_at, seq, purpose, attachment_id, instance_uuid)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::uuid)`,
			c.ID, reqID, c.Host, c.Kind, c.Body, c.ExpiresAt, c.Seq, purpose, c.AttachmentID, inst); err != nil {
			return fmt.Errorf("request %s: queue command %s %s: %w", reqID, c.Kind, c.ID, err)
		}
	}
	return nil
}

// QueueOperatorCommand puts c in the outbox on its own, with no request
// (an operator's collect_diagnostics); the relay sends it after the caller
// commits.
func QueueOperatorCommand(ctx context.Context, q Execer, c Command) error {
	var inst *string
	if c.InstanceUUID != "" {
		inst = &c.InstanceUUID
	}
	if _, err := q.Exec(ctx, `INSERT INTO commands (id, request_id, host, kind, body, expires_at, seq, purpose, attachment_id, instance_uuid)
		VALUES ($1, NULL, $2, $3, $4, $5, $6, $7, $8, $9::uuid)`,
		c.ID, c.Host, c.Kind, c.Body, c.ExpiresAt, c.Seq, PurposeAction, c.AttachmentID, inst); err != nil {
		return fmt.Errorf("queue command %s %s for %s: %w", c.Kind, c.ID, c.Host, err)
	}
	return nil
}

// FinishCommand records an agent's result of command id.
func FinishCommand(ctx context.Context, q Execer, id, status string, result []byte) error {
	if _, err := q.Exec(ctx, `UPDATE commands SET result_status = $2, result = $3, finished_at = now() WHERE id::text = $1`,
		id, status, result); err != nil {
		return fmt.Errorf("record result of command %s: %w", id, err)
	}
	return nil
}

// FinishedCommand is a command whose result FinishCommandOnce recorded.
type FinishedCommand struct {
	Request    *uuid.UUID // nil for an operator's command
	Purpose    string
	Kind       string
	Host       string
	Attachment *uuid.UUID
	// View is its request as read, locked, with it
	// (FinishCommandOnceView); nil when not read.
	View *ResultView
}

// FinishCommandOnce records the result of command id, answered by host
// ("" for any), unless it has one already or is another host's; false:
// nothing recorded (unknown, a duplicate, or another host's).
func FinishCommandOnce(ctx context.Context, q Querier, id, host, status string, result []byte) (FinishedCommand, bool, error) {
	var c FinishedCommand
	// Command ids are UUIDs in their canonical text: no other text names
	// one. Matched as a uuid, the primary key finds the row.
	u, err := uuid.Parse(id)
	if err != nil || u.String() != id {
		return c, false, nil
	}
	err = q.QueryRow(ctx, `UPDATE commands SET result_status = $3, result = $4, finished_at = now()
		WHERE id = $1 AND finished_at IS NULL AND ($2 = '' OR host = $2)
		RETURNING request_id, purpose, kind, host, attachment_id`, u, host, status, result).
		Scan(&c.Request, &c.Purpose, &c.Kind, &c.Host, &c.Attachment)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("record result of command %s: %w", id, err)
	}
	return c, true, nil
}

// CancelUnsent makes sure the request's commands not yet sent never go out.
func CancelUnsent(ctx context.Context, q Execer, reqID uuid.UUID) error {
	if _, err := q.Exec(ctx, `UPDATE commands SET result_status = 'cancelled', finished_at = now()
		WHERE request_id = $1 AND sent_at IS NULL AND finished_at IS NULL`, reqID); err != nil {
		return fmt.Errorf("cancel unsent commands of request %s: %w", reqID, err)
	}
	return nil
}

// ExpireUnsent finishes the commands that expired before they could be
// sent (their request's deadline handles the request); it returns how many.
func ExpireUnsent(ctx context.Context, q Execer) (int64, error) {
	tag, err := q.Exec(ctx, `UPDATE commands SET result_status = 'expired', finished_at = now(), last_error = 'expired before it was published'
		WHERE sent_at IS NULL AND finished_at IS NULL AND expires_at < now()`)
	if err != nil {
		return 0, fmt.Errorf("expire unsent commands: %w", err)
	}
	return tag.RowsAffected(), nil
}

// PublishFailed counts a failed attempt to send command id.
func PublishFailed(ctx context.Context, q Execer, id uuid.UUID, cause string) error {
	if _, err := q.Exec(ctx, `UPDATE commands SET publish_attempts = publish_attempts + 1, last_error = $2 WHERE id = $1`,
		id, cause); err != nil {
		return fmt.Errorf("record failed publish of command %s: %w", id, err)
	}
	return nil
}

// Sent records that the broker confirmed command id. signed, when not
// nil, is the body as it went out (key id and signature included): a
// refusal's body digest is checked against it.
func Sent(ctx context.Context, q Execer, id uuid.UUID, signed []byte) error {
	var err error
	if signed != nil {
		_, err = q.Exec(ctx, `UPDATE commands SET sent_at = now(), publish_attempts = publish_attempts + 1, last_error = NULL, body = $2::jsonb WHERE id = $1`,
			id, string(signed))
	} else {
		_, err = q.Exec(ctx, `UPDATE commands SET sent_at = now(), publish_attempts = publish_attempts + 1, last_error = NULL WHERE id = $1`, id)
	}
	if err != nil {
		return fmt.Errorf("record sent command %s: %w", id, err)
	}
	return nil
}

// AttachmentColumns are the columns ScanAttachments reads, in order.
const AttachmentColumns = `id, instance_uuid::text, coalesce(request_id, '00000000-0000-0000-0000-000000000000'::uuid), host, coalesce(node,''),
	coalesce(provider_uuid::text,''), coalesce(resource_class,''), amount, coalesce(held_after,0), coalesce(pci_address,''),
	coalesce(type_id,''), coalesce(profile,''), coalesce(trait,''), coalesce(mode,''), state, frame_rate_limit, coalesce(units,0)`

// AttachmentsJSON is the JSON array of the attachments of vgpu_attachments
// rows that match where, in the order of ScanAttachments' reads (a
// statement that reads more than them: pipeline's facts);
// ParseAttachments reads it.
func AttachmentsJSON(where string) string {
	return `(SELECT coalesce(jsonb_agg(jsonb_build_object('id', id, 'instance_uuid', instance_uuid::text,
			'request_id', coalesce(request_id, '00000000-0000-0000-0000-000000000000'::uuid), 'host', host, 'node', coalesce(node,''),
			'provider', coalesce(provider_uuid::text,''), 'class', coalesce(resource_class,''), 'amount', amount, 'held_after', coalesce(held_after,0),
			'pci', coalesce(pci_address,''), 'type_id', coalesce(type_id,''), 'profile', coalesce(profile,''), 'trait', coalesce(trait,''),
			'mode', coalesce(mode,''), 'state', state, 'frame_rate_limit', frame_rate_limit, 'units', coalesce(units,0)) ORDER BY created_at, id), '[]'::jsonb)
		FROM vgpu_attachments WHERE ` + where + `)`
}

// ParseAttachments reads an AttachmentsJSON array.
func ParseAttachments(raw []byte) ([]flow.Attachment, error) {
	var rows []struct {
		ID             uuid.UUID `json:"id"`
		InstanceUUID   string    `json:"instance_uuid"`
		RequestID      uuid.UUID `json:"request_id"`
		Host           string    `json:"host"`
		Node           string    `json:"node"`
		Provider       string    `json:"provider"`
		Class          string    `json:"class"`
		Amount         int       `json:"amount"`
		HeldAfter      int       `json:"held_after"`
		PCIAddress     string    `json:"pci"`
		TypeID         string    `json:"type_id"`
		Profile        string    `json:"profile"`
		Trait          string    `json:"trait"`
		Mode           string    `json:"mode"`
		State          string    `json:"state"`
		FrameRateLimit *bool     `json:"frame_rate_limit"`
		Units          int       `json:"units"`
	}
	if err := json.Unmarshal(raw, &rows); err != nil {
		return nil, fmt.Errorf("read attachments: %w", err)
	}
	var out []flow.Attachment
	for _, r := range rows {
		out = append(out, flow.Attachment{ID: r.ID, InstanceUUID: r.InstanceUUID, RequestID: r.RequestID, Host: r.Host, Node: r.Node,
			Provider: r.Provider, Class: r.Class, Amount: r.Amount, HeldAfter: r.HeldAfter, PCIAddress: r.PCIAddress, TypeID: r.TypeID,
			Profile: r.Profile, Trait: r.Trait, Mode: r.Mode, State: r.State, FrameRateLimit: r.FrameRateLimit, Units: r.Units})
	}
	return out, nil
}

// ScanAttachments reads rows of AttachmentColumns and closes rows.
func ScanAttachments(rows pgx.Rows) ([]flow.Attachment, error) {
	defer rows.Close()
	var out []flow.Attachment
	for rows.Next() {
		var a flow.Attachment
		if err := rows.Scan(&a.ID, &a.InstanceUUID, &a.RequestID, &a.Host, &a.Node, &a.Provider, &a.Class, &a.Amount, &a.HeldAfter,
			&a.PCIAddress, &a.TypeID, &a.Profile, &a.Trait, &a.Mode, &a.State, &a.FrameRateLimit, &a.Units); err != nil {
			return nil, fmt.Errorf("read attachments: %w", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read attachments: %w", err)
	}
	return out, nil
}

// AddAttachments records the vGPUs request reqID claimed, as pending.
func AddAttachments(ctx context.Context, q Execer, reqID uuid.UUID, atts []flow.Attachment) error {
	for _, a := range atts {
		if _, err := q.Exec(ctx, `INSERT INTO vgpu_attachments (id, instance_uuid, request_id, host, node, provider_uuid, resource_class,
				amount, held_after, pci_address, type_id, profile, trait, mode, state, frame_rate_limit, units)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, 'pending', $15, nullif($16, 0))`,
			a.ID, a.InstanceUUID, reqID, a.Host, a.Node, a.Provider, a.Class, a.Amount, a.HeldAfter, a.PCIAddress, a.TypeID, a.Profile, a.Trait, a.Mode,
			a.FrameRateLimit, a.Units); err != nil {
			return fmt.Errorf("request %s: record attachment %s: %w", reqID, a.ID, err)
		}
	}
	return nil
}

// RecordAct records, in one statement, the vGPUs request reqID claimed,
// as pending (AddAttachments), and the commands it queues with purpose
// (QueueCommands).
func RecordAct(ctx context.Context, q Execer, reqID uuid.UUID, atts []flow.Attachment, purpose string, cmds []Command) error {
	if _, err := q.Exec(ctx, `WITH a AS (`+recordAttachmentsSQL+`) `+recordCommandsSQL, recordActArgs(reqID, atts, purpose, cmds)...); err != nil {
		return fmt.Errorf("request %s: record %d attachment(s) and %d command(s): %w", reqID, len(atts), len(cmds), err)
	}
	return nil
}

// recordAttachmentsSQL and recordCommandsSQL are RecordAct's inserts,
// with recordActArgs ($1 to $25).
const (
	recordAttachmentsSQL = `INSERT INTO vgpu_attachments (id, instance_uuid, request_id, host, node, provider_uuid, resource_class,
				amount, held_after, pci_address, type_id, profile, trait, mode, state, frame_rate_limit, units)
			SELECT id, inst::uuid, $1, host, node, prov::uuid, class, amount, held, pci, typ, prof, trait, mode, 'pending', frl, nullif(units, 0)
			FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::int[], $9::int[], $10::text[],
				$11::text[], $12::text[], $13::text[], $14::text[], $15::bool[], $25::int[])
				AS t(id, inst, host, node, prov, class, amount, held, pci, typ, prof, trait, mode, frl, units)`
	recordCommandsSQL = `INSERT INTO commands (id, request_id, host, kind, body, expires_at, seq, purpose, attachment_id, instance_uuid)
		SELECT id::uuid, $1, host, kind, body::jsonb, exp, seq, $16, att, nullif(inst, '')::uuid
		FROM unnest($17::text[], $18::text[], $19::text[], $20::text[], $21::timestamptz[], $22::int[], $23::uuid[], $24::text[])
			AS c(id, host, kind, body, exp, seq, att, inst)`
)

func recordActArgs(reqID uuid.UUID, atts []flow.Attachment, purpose string, cmds []Command) []any {
	n := len(atts)
	ids, insts, hosts, nodes, provs := make([][16]byte, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	classes, amounts, held, pcis := make([]string, n), make([]int32, n), make([]int32, n), make([]string, n)
	types, profiles, traits, modes, frls := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]pgtype.Bool, n)
	units := make([]int32, n)
	for i, a := range atts {
		units[i] = int32(a.Units)
		ids[i], insts[i], hosts[i], nodes[i], provs[i] = [16]byte(a.ID), a.InstanceUUID, a.Host, a.Node, a.Provider
		classes[i], amounts[i], held[i], pcis[i] = a.Class, int32(a.Amount), int32(a.HeldAfter), a.PCIAddress
		types[i], profiles[i], traits[i], modes[i] = a.TypeID, a.Profile, a.Trait, a.Mode
		if a.FrameRateLimit != nil {
			frls[i] = pgtype.Bool{Bool: *a.FrameRateLimit, Valid: true}
		}
	}
	m := len(cmds)
	cids, chosts, kinds, bodies, cinsts := make([]string, m), make([]string, m), make([]string, m), make([]string, m), make([]string, m)
	expires, seqs, catts := make([]time.Time, m), make([]int32, m), make([]pgtype.UUID, m)
	for i, c := range cmds {
		cids[i], chosts[i], kinds[i], bodies[i], cinsts[i] = c.ID, c.Host, c.Kind, string(c.Body), c.InstanceUUID
		expires[i], seqs[i] = c.ExpiresAt, int32(c.Seq)
		if c.AttachmentID != nil {
			catts[i] = pgtype.UUID{Bytes: *c.AttachmentID, Valid: true}
		}
	}
	return []any{reqID, ids, insts, hosts, nodes, provs, classes, amounts, held, pcis, types, profiles, traits, modes, frls,
		purpose, cids, chosts, kinds, bodies, expires, seqs, catts, cinsts, units}
}

// BeginRelease marks attachment id as being released by request reqID.
func BeginRelease(ctx context.Context, q Execer, id, reqID uuid.UUID) error {
	if _, err := q.Exec(ctx, `UPDATE vgpu_attachments SET state = 'releasing', release_request_id = $2, updated_at = now() WHERE id = $1`,
		id, reqID); err != nil {
		return fmt.Errorf("request %s: release attachment %s: %w", reqID, id, err)
	}
	return nil
}

// MarkAttached marks the pending attachments of request reqID attached
// and opens their usage (usage.go) at at, the agent's time of the last
// command, kept between the request's creation and now; it returns how
// many.
func MarkAttached(ctx context.Context, q Execer, reqID uuid.UUID, at time.Time) (int64, error) {
	tag, err := q.Exec(ctx, `WITH a AS (
			UPDATE vgpu_attachments SET state = 'attached', updated_at = now() WHERE request_id = $1 AND state = 'pending'
			RETURNING id, request_id, instance_uuid, host, profile, type_id, resource_class, amount)
		INSERT INTO vgpu_usage (path, attachment_id, instance_uuid, project_id, user_id, host, profile, vgpu_type, resource_class, amount, started_at)
		SELECT 'direct', a.id, a.instance_uuid, i.project_id, i.user_id, a.host, coalesce(a.profile, ''), a.type_id,
			coalesce(a.resource_class, 'VGPU'), a.amount, `+clampedAt+`
		FROM a LEFT JOIN instances i ON i.uuid = a.instance_uuid
		ON CONFLICT (attachment_id) DO NOTHING`, reqID, nullTime(at))
	if err != nil {
		return 0, fmt.Errorf("request %s: mark attachments attached: %w", reqID, err)
	}
	return tag.RowsAffected(), nil
}

// MarkReleased marks attachment id released (mdev removed, claim given
// back) and closes its usage at at (as MarkAttached's).
func MarkReleased(ctx context.Context, q Execer, id uuid.UUID, at time.Time) error {
	if _, err := q.Exec(ctx, `WITH a AS (
			UPDATE vgpu_attachments SET state = 'released', released_at = now(), updated_at = now() WHERE id = $1
			RETURNING id, coalesce(release_request_id, request_id) AS request_id)
		UPDATE vgpu_usage u SET ended_at = greatest(u.started_at, `+clampedAt+`)
		FROM a WHERE u.attachment_id = a.id AND u.ended_at IS NULL`, id, nullTime(at)); err != nil {
		return fmt.Errorf("mark attachment %s released: %w", id, err)
	}
	return nil
}

// ReleaseStale marks attachments released that the drift reconciler found
// without an instance or claim; it touches only active ones.
func ReleaseStale(ctx context.Context, q Execer, ids []string, why string) error {
	if _, err := q.Exec(ctx, `WITH a AS (
			UPDATE vgpu_attachments SET state = 'released', released_at = now(), updated_at = now(), reason = $2
			WHERE id = ANY($1::uuid[]) AND state IN ('pending','attached','releasing') RETURNING id)
		UPDATE vgpu_usage u SET ended_at = greatest(u.started_at, now()) FROM a WHERE u.attachment_id = a.id AND u.ended_at IS NULL`,
		ids, why); err != nil {
		return fmt.Errorf("mark stale attachments released: %w", err)
	}
	return nil
}

// MarkFailed marks attachment id failed (compensated) with why; the usage
// of one that was attached ends now.
func MarkFailed(ctx context.Context, q Execer, id uuid.UUID, why string) error {
	if _, err := q.Exec(ctx, `WITH a AS (
			UPDATE vgpu_attachments SET state = 'failed', reason = $2, updated_at = now() WHERE id = $1 RETURNING id)
		UPDATE vgpu_usage u SET ended_at = greatest(u.started_at, now()) FROM a WHERE u.attachment_id = a.id AND u.ended_at IS NULL`,
		id, why); err != nil {
		return fmt.Errorf("mark attachment %s failed: %w", id, err)
	}
	return nil
}

// AbandonReleases puts back the attachments request reqID was releasing:
// the vGPU stays where it is, with why.
func AbandonReleases(ctx context.Context, q Execer, reqID uuid.UUID, why string) error {
	if _, err := q.Exec(ctx, `UPDATE vgpu_attachments SET state = 'attached', release_request_id = NULL, reason = $2, updated_at = now()
		WHERE release_request_id = $1 AND state = 'releasing'`, reqID, why); err != nil {
		return fmt.Errorf("request %s: abandon releases: %w", reqID, err)
	}
	return nil
}

// ForgetClaim records that Nova dropped attachment id's claim when it moved
// the instance (shelved: by a shelve-offload).
func ForgetClaim(ctx context.Context, q Execer, id uuid.UUID, shelved bool, why string) error {
	if _, err := q.Exec(ctx, `UPDATE vgpu_attachments SET provider_uuid = NULL, shelved = $2, reason = $3, updated_at = now() WHERE id = $1`,
		id, shelved, why); err != nil {
		return fmt.Errorf("forget claim of attachment %s: %w", id, err)
	}
	return nil
}

// Unshelve clears the shelved mark of attachments ids.
func Unshelve(ctx context.Context, q Execer, ids []uuid.UUID) error {
	if _, err := q.Exec(ctx, `UPDATE vgpu_attachments SET shelved = false, updated_at = now() WHERE id = ANY($1)`, ids); err != nil {
		return fmt.Errorf("unshelve attachments: %w", err)
	}
	return nil
}

// MarkProcessed closes inbox event id: the pipeline is done with it.
func MarkProcessed(ctx context.Context, q Execer, id int64) error {
	if _, err := q.Exec(ctx, `UPDATE events SET processed_at = now() WHERE id = $1`, id); err != nil {
		return fmt.Errorf("mark event %d processed: %w", id, err)
	}
	return nil
}

// MarkEventFailed closes inbox event id as failed, with detail; what its
// decision planned to claim (PlanClaims) goes with it.
func MarkEventFailed(ctx context.Context, q Execer, id int64, detail string) error {
	if _, err := q.Exec(ctx, `WITH gone AS (DELETE FROM planned_claims WHERE event_id = $1)
		UPDATE events SET processed_at = now(), status = 'failed', detail = $2 WHERE id = $1`, id, detail); err != nil {
		return fmt.Errorf("mark event %d failed: %w", id, err)
	}
	return nil
}

// Querier reads one row; pgx.Tx and the pool are both.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// EventAttempt counts a failed attempt at inbox event id; it returns the
// attempts so far, or pgx.ErrNoRows when the event is already closed.
func EventAttempt(ctx context.Context, q Querier, id int64, cause string) (int, error) {
	var n int
	if err := q.QueryRow(ctx, `UPDATE events SET attempts = attempts + 1, last_error = $2
		WHERE id = $1 AND processed_at IS NULL RETURNING attempts`, id, cause).Scan(&n); err != nil {
		return 0, fmt.Errorf("count attempt at event %d: %w", id, err)
	}
	return n, nil
}

// EventNotBefore backs inbox event id off for wait.
func EventNotBefore(ctx context.Context, q Execer, id int64, wait time.Duration) error {
	if _, err := q.Exec(ctx, `UPDATE events SET not_before = now() + make_interval(secs => $2) WHERE id = $1`, id, wait.Seconds()); err != nil {
		return fmt.Errorf("back event %d off: %w", id, err)
	}
	return nil
}

// Hold marks attached attachment id held off its host (flow.AttHeld): its
// claim is being taken out of the instance's consumer (planned release)
// while the host's compute service is forced down; the mdev stays.
func Hold(ctx context.Context, q Execer, id uuid.UUID, why string) error {
	if _, err := q.Exec(ctx, `UPDATE vgpu_attachments SET state = 'held', reason = $2, updated_at = now() WHERE id = $1 AND state = 'attached'`,
		id, why); err != nil {
		return fmt.Errorf("hold attachment %s: %w", id, err)
	}
	return nil
}

// Restore marks held or kept attachment id attached again, its claim made
// again (or found back) on its GPU (heldAfter: what the consumer held
// there right after).
func Restore(ctx context.Context, q Execer, id uuid.UUID, heldAfter int, why string) error {
	if _, err := q.Exec(ctx, `UPDATE vgpu_attachments SET state = 'attached', held_after = $2, reason = $3, updated_at = now()
		WHERE id = $1 AND state IN ('held','kept')`, id, heldAfter, why); err != nil {
		return fmt.Errorf("restore attachment %s: %w", id, err)
	}
	return nil
}

// Evacuated records that held attachment id was applied again on another
// host: its provider is forgotten (its claim is gone; its mdev on the old
// host is removed once that host is back) and its usage ends.
func Evacuated(ctx context.Context, q Execer, id uuid.UUID, why string) error {
	if _, err := q.Exec(ctx, `WITH a AS (
			UPDATE vgpu_attachments SET provider_uuid = NULL, reason = $2, updated_at = now() WHERE id = $1 AND state = 'held' RETURNING id)
		UPDATE vgpu_usage u SET ended_at = greatest(u.started_at, now()) FROM a WHERE u.attachment_id = a.id AND u.ended_at IS NULL`,
		id, why); err != nil {
		return fmt.Errorf("attachment %s evacuated: %w", id, err)
	}
	return nil
}

// HeldAttachments are instance's vGPUs held off their host (flow.AttHeld).
func HeldAttachments(ctx context.Context, q RowsQuerier, instance string) ([]flow.Attachment, error) {
	return attachmentsIn(ctx, q, instance, flow.AttHeld)
}

// attachmentsIn are instance's vGPUs in state, oldest first.
func attachmentsIn(ctx context.Context, q RowsQuerier, instance, state string) ([]flow.Attachment, error) {
	rows, err := q.Query(ctx, `SELECT `+AttachmentColumns+` FROM vgpu_attachments WHERE instance_uuid = $1 AND state = $2 ORDER BY created_at, id`,
		instance, state)
	if err != nil {
		return nil, fmt.Errorf("read %s vGPUs of %s: %w", state, instance, err)
	}
	return ScanAttachments(rows)
}

// Keep marks attached attachment id kept on its host (flow.AttKept): its
// instance's cold migration or resize to another host awaits the confirm;
// the mdev stays on the source and its claim in Nova's migration
// consumer, for a revert. Its usage goes on.
func Keep(ctx context.Context, q Execer, id uuid.UUID, why string) error {
	if _, err := q.Exec(ctx, `UPDATE vgpu_attachments SET state = 'kept', reason = $2, updated_at = now() WHERE id = $1 AND state = 'attached'`,
		id, why); err != nil {
		return fmt.Errorf("keep attachment %s: %w", id, err)
	}
	return nil
}

// KeptAttachments are instance's vGPUs kept on the source of a move that
// awaits its confirm (flow.AttKept).
func KeptAttachments(ctx context.Context, q RowsQuerier, instance string) ([]flow.Attachment, error) {
	return attachmentsIn(ctx, q, instance, flow.AttKept)
}
