// Package requests is the request store: what a source asked for and where
// it stands. Requests move through the states of the operator API,
//
//	accepted → decided → dispatched → succeeded | failed | rejected
//
// with failed and rejected also reachable from accepted and decided.
// Transition is the single place that changes a request's state: it checks
// the move, writes the audit row in the caller's transaction and, on a
// final state, queues the request's callback (delivered by package
// webhook). It is the one writer of the records that hang off requests
// (the inbox, the audit log, Nova-path resizes, callbacks: lifecycle.go).
// The package also serves GET /v1/requests/{id} and
// POST /v1/requests/{id}/cancel.
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
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
)

// State is where a request stands.
type State string

// States of the operator API.
const (
	Accepted   State = "accepted"
	Decided    State = "decided"
	Dispatched State = "dispatched"
	Succeeded  State = "succeeded"
	Failed     State = "failed"
	Rejected   State = "rejected"
)

// Final reports whether no transition leaves s.
func (s State) Final() bool { return s == Succeeded || s == Failed || s == Rejected }

// Valid reports whether s is one of the known states.
func (s State) Valid() bool {
	switch s {
	case Accepted, Decided, Dispatched, Succeeded, Failed, Rejected:
		return true
	}
	return false
}

// next lists the states each state may move to. A non-final state may also
// "move" to itself to change only its phase, reason or code.
var next = map[State][]State{
	Accepted:   {Decided, Failed, Rejected},
	Decided:    {Dispatched, Failed, Rejected},
	Dispatched: {Succeeded, Failed, Rejected},
}

// allowedFrom lists the states a request may move to to from.
func allowedFrom(to State) []string {
	var out []string
	for _, s := range []State{Accepted, Decided, Dispatched, Succeeded, Failed, Rejected} {
		if Allowed(s, to) {
			out = append(out, string(s))
		}
	}
	return out
}

// Allowed reports whether a request in state from may move to to.
func Allowed(from, to State) bool {
	if from == to {
		return !from.Final()
	}
	for _, s := range next[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Request is one request and its state.
type Request struct {
	ID             uuid.UUID       `json:"id"`
	Source         string          `json:"source"` // "webhook:<name>", "nova", "operator"
	Kind           string          `json:"kind"`   // GPU_REQUEST, GPU_RELEASE, GPU_RESIZE, GPU_LOAD, …
	InstanceUUID   *uuid.UUID      `json:"instance_uuid,omitempty"`
	State          State           `json:"state"`
	Phase          string          `json:"phase,omitempty"`
	Reason         string          `json:"reason,omitempty"`
	Code           string          `json:"code,omitempty"`
	Body           json.RawMessage `json:"body,omitempty"`
	CallbackURL    string          `json:"callback_url,omitempty"`
	IdempotencyKey string          `json:"-"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	DecidedAt      *time.Time      `json:"decided_at,omitempty"`
	DispatchedAt   *time.Time      `json:"dispatched_at,omitempty"`
	FinishedAt     *time.Time      `json:"finished_at,omitempty"`
}

// Errors callers test with errors.Is.
var (
	ErrNotFound = errors.New("request not found")
	// ErrIllegal is a transition the state machine does not allow.
	ErrIllegal = errors.New("transition not allowed")
)

// IsNotFound reports whether err says the request does not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsIllegal reports whether err is a refused state transition.
func IsIllegal(err error) bool { return errors.Is(err, ErrIllegal) }

// Store reads and writes requests in Postgres.
type Store struct {
	pool  *pgxpool.Pool
	actor string
}

// NewStore returns a store over pool. actor names the writer in the audit
// log ("vgpu-bridge" when empty).
func NewStore(pool *pgxpool.Pool, actor string) *Store {
	if actor == "" {
		actor = "vgpu-bridge"
	}
	return &Store{pool: pool, actor: actor}
}

// Pool returns the store's connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Create inserts r in state accepted, with its audit row, in tx. r.ID must
// be set; the caller commits.
func (s *Store) Create(ctx context.Context, tx pgx.Tx, r Request) error {
	return s.CreateBatch(ctx, tx, []Request{r})
}

// CreateBatch inserts many requests, in state accepted, with their audit
// rows, in one statement of tx.
func (s *Store) CreateBatch(ctx context.Context, tx pgx.Tx, rs []Request) error {
	if len(rs) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	if err := s.QueueCreate(b, rs); err != nil {
		return err
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("create requests: %w", err)
	}
	return nil
}

// QueueCreate queues on b the statement that inserts rs, in state
// accepted, with their audit rows; the caller sends b in its transaction,
// with statements of its own (the webhook path adds its inbox rows). The
// audit detail is built by Postgres from the inserted rows, and every
// value goes in binary, so a batch costs one parameter encoding per column.
func (s *Store) QueueCreate(b *pgx.Batch, rs []Request) error {
	if len(rs) == 0 {
		return nil
	}
	args, err := s.createArgs(rs)
	if err != nil {
		return err
	}
	b.Queue(`WITH r AS (
		INSERT INTO requests (id, source, kind, instance_uuid, state, body, callback_url, idempotency_key)
		SELECT id, source, kind, inst, 'accepted', body::jsonb, cb, key
		FROM unnest($2::uuid[], $3::text[], $4::text[], $5::uuid[], $6::text[], $7::text[], $8::text[])
		  AS t(id, source, kind, inst, body, cb, key)
		RETURNING id, source, kind)
		INSERT INTO audit_log (actor, action, object_type, object_id, request_id, detail)
		SELECT $1, 'create', 'request', id::text, id::text,
		       jsonb_build_object('to', 'accepted', 'source', source, 'kind', kind)
		FROM r`, args...)
	return nil
}

// createArgs are the parameters $1 to $8 of the statements that create
// rs: the actor, then one array per column.
func (s *Store) createArgs(rs []Request) ([]any, error) {
	n := len(rs)
	ids := make([][16]byte, n)
	sources := make([]string, n)
	kinds := make([]string, n)
	insts := make([]pgtype.UUID, n)
	bodies := make([]pgtype.Text, n)
	cbs := make([]pgtype.Text, n)
	keys := make([]pgtype.Text, n)
	for i, r := range rs {
		if r.ID == uuid.Nil {
			return nil, fmt.Errorf("create request: no id")
		}
		ids[i] = r.ID
		sources[i] = r.Source
		kinds[i] = r.Kind
		if r.InstanceUUID != nil {
			insts[i] = pgtype.UUID{Bytes: *r.InstanceUUID, Valid: true}
		}
		bodies[i] = pgtype.Text{String: string(r.Body), Valid: len(r.Body) > 0}
		cbs[i] = pgtype.Text{String: r.CallbackURL, Valid: r.CallbackURL != ""}
		keys[i] = pgtype.Text{String: r.IdempotencyKey, Valid: r.IdempotencyKey != ""}
	}
	args := make([]any, 0, 26)
	return append(args, s.actor, ids, sources, kinds, insts, bodies, cbs, keys), nil
}

const columns = `id, source, kind, instance_uuid, state, coalesce(phase,''), coalesce(reason,''), coalesce(code,''),
	body, coalesce(callback_url,''), coalesce(idempotency_key,''), created_at, updated_at, decided_at, dispatched_at, finished_at`

func scan(row pgx.Row) (Request, error) { return scanWith(row, nil) }

// scanWith scans a row of first, then the columns, then last.
func scanWith(row pgx.Row, first []any, last ...any) (Request, error) {
	var r Request
	var inst *uuid.UUID
	var state string
	var body []byte
	dest := append(first, &r.ID, &r.Source, &r.Kind, &inst, &state, &r.Phase, &r.Reason, &r.Code,
		&body, &r.CallbackURL, &r.IdempotencyKey, &r.CreatedAt, &r.UpdatedAt, &r.DecidedAt, &r.DispatchedAt, &r.FinishedAt)
	err := row.Scan(append(dest, last...)...)
	if err != nil {
		return r, err
	}
	r.InstanceUUID = inst
	r.State = State(state)
	if len(body) > 0 {
		r.Body = json.RawMessage(body)
	}
	return r, nil
}

// Get returns one request.
func (s *Store) Get(ctx context.Context, id uuid.UUID) (Request, error) {
	r, err := scan(s.pool.QueryRow(ctx, `SELECT `+columns+` FROM requests WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("request %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("get request %s: %w", id, err)
	}
	return r, nil
}

// ListOptions filters List; zero fields do not filter.
type ListOptions struct {
	Source       string
	State        State
	InstanceUUID *uuid.UUID
	// Project, when set, keeps only requests about instances of that
	// project (as Nova's notifications name it; scope.go).
	Project string
	// Limit caps the answer (default 100, at most 1000); newest first.
	Limit int
}

// List returns requests, newest first.
func (s *Store) List(ctx context.Context, o ListOptions) ([]Request, error) {
	if o.Limit <= 0 || o.Limit > 1000 {
		o.Limit = 100
	}
	var inst *string
	if o.InstanceUUID != nil {
		x := o.InstanceUUID.String()
		inst = &x
	}
	rows, err := s.pool.Query(ctx, `SELECT `+columns+` FROM requests
		WHERE ($1 = '' OR source = $1) AND ($2 = '' OR state = $2) AND ($3::uuid IS NULL OR instance_uuid = $3::uuid)
		AND ($5 = '' OR instance_uuid IN (SELECT uuid FROM instances WHERE project_id = $5))
		ORDER BY created_at DESC, id DESC LIMIT $4`, o.Source, string(o.State), inst, o.Limit, o.Project)
	if err != nil {
		return nil, fmt.Errorf("list requests: %w", err)
	}
	defer rows.Close()
	var out []Request
	for rows.Next() {
		r, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("list requests: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Transition moves request id to state to, with phase, reason and code, in
// tx: it locks the row, refuses moves the state machine does not allow
// (ErrIllegal), records the move in audit_log and, when to is final and the
// request has a callback URL, queues the callback. The caller commits.
// It returns the request as it is after the move.
func (s *Store) Transition(ctx context.Context, tx pgx.Tx, id uuid.UUID, to State, phase, reason, code string) (Request, error) {
	return s.transition(ctx, tx, s.actor, id, to, phase, reason, code)
}

// Cancel ends request id at actor's word (an operator's cancel): failed,
// code cancelled, in tx, the move audited as actor's. ErrIllegal: it is
// final already. A request whose vGPUs are in flight is cancelled
// through the pipeline instead (Canceller), so that it ends after their
// compensation.
func (s *Store) Cancel(ctx context.Context, tx pgx.Tx, id uuid.UUID, actor string) (Request, error) {
	return s.transition(ctx, tx, actor, id, Failed, "", "cancelled by "+actor, flow.CodeCancelled)
}

// TransitionUntil is Transition that also sets when the request's
// deadline loop looks at it again (SetDeadline), in the same statement.
func (s *Store) TransitionUntil(ctx context.Context, tx pgx.Tx, id uuid.UUID, to State, phase, reason, code string, deadline time.Time) (Request, error) {
	if !to.Valid() {
		return Request{}, fmt.Errorf("request %s: unknown state %q: %w", id, to, ErrIllegal)
	}
	r, err := s.move(ctx, tx, s.actor, id, allowedFrom(to), to, phase, reason, code, &deadline, nil)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, s.refused(ctx, tx, id, to)
	}
	return r, err
}

// TransitionIf moves request id from state from to state to, as
// Transition does, when it is in from; otherwise it changes nothing and
// reports false.
func (s *Store) TransitionIf(ctx context.Context, tx pgx.Tx, id uuid.UUID, from, to State, phase, reason, code string) (Request, bool, error) {
	if !Allowed(from, to) {
		return Request{}, false, fmt.Errorf("request %s: %s → %s: %w", id, from, to, ErrIllegal)
	}
	r, err := s.move(ctx, tx, s.actor, id, []string{string(from)}, to, phase, reason, code, nil, nil)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	return r, err == nil, err
}

func (s *Store) transition(ctx context.Context, tx pgx.Tx, actor string, id uuid.UUID, to State, phase, reason, code string) (Request, error) {
	if !to.Valid() {
		return Request{}, fmt.Errorf("request %s: unknown state %q: %w", id, to, ErrIllegal)
	}
	r, err := s.move(ctx, tx, actor, id, allowedFrom(to), to, phase, reason, code, nil, nil)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, s.refused(ctx, tx, id, to)
	}
	return r, err
}

// refused says why request id did not move to to: it is not there, or
// its state does not allow the move.
func (s *Store) refused(ctx context.Context, tx pgx.Tx, id uuid.UUID, to State) error {
	var st string
	switch err := tx.QueryRow(ctx, `SELECT state FROM requests WHERE id = $1`, id).Scan(&st); {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("request %s: %w", id, ErrNotFound)
	case err != nil:
		return fmt.Errorf("transition request %s: %w", id, err)
	}
	return fmt.Errorf("request %s: %s → %s: %w", id, st, to, ErrIllegal)
}

// move moves request id to state to when its state is one of from, audits
// the move, queues its notification and, when to is final and the request
// has a callback URL, its callback. pgx.ErrNoRows: not moved. extra, when
// set, adds writes of the same transaction to the statement that moves
// the request (moveExtra).
func (s *Store) move(ctx context.Context, tx pgx.Tx, actor string, id uuid.UUID, from []string, to State, phase, reason, code string,
	deadline *time.Time, extra *moveExtra) (Request, error) {
	// One statement: the row locked, moved when its state is one of from,
	// the move audited, and what its notification (notifyTransition)
	// says of the instance and the request's vGPUs read.
	args := []any{id, string(to), phase, reason, code, from, actor, deadline}
	ctes, queued := extra.ctes(&args)
	var was State
	var pre notePrefetch
	var pinged int64
	vgpus := `CASE WHEN $2 IN ('decided','succeeded','failed','rejected') THEN (SELECT coalesce(jsonb_agg(jsonb_build_object(
					'new', v.request_id = $1, 'id', v.id::text, 'profile', coalesce(v.profile,''), 'type_id', coalesce(v.type_id,''),
					'class', coalesce(v.resource_class,'VGPU'), 'amount', v.amount, 'host', v.host, 'provider', coalesce(v.provider_uuid::text,''),
					'pci', coalesce(v.pci_address,''), 'state', v.state) ORDER BY v.created_at, v.id), '[]'::jsonb)
				FROM vgpu_attachments v WHERE v.request_id = $1 OR v.release_request_id = $1) END`
	if extra != nil && extra.noted {
		vgpus = "NULL::jsonb" // the notification was built beforehand
	}
	ping := "0::bigint"
	if queued {
		// The statement queues the notification (extra.note) and sends
		// its NOTIFY.
		ping = notify.Pinged("n")
	}
	r, err := scanWith(tx.QueryRow(ctx, `WITH `+transitionCTEs(2, "a")+ctes+`
		SELECT u.*, coalesce(i.project_id, ''), coalesce(i.user_id, ''), `+vgpus+`, `+ping+`
		FROM u LEFT JOIN instances i ON i.uuid = u.instance_uuid`, args...),
		[]any{&was}, &pre.project, &pre.user, &pre.vgpus, &pinged)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, err
	}
	if err != nil {
		return r, fmt.Errorf("transition request %s: %w", id, err)
	}
	switch {
	case queued:
		notify.Queued(extra.note.event)
	case extra != nil && extra.noted: // it notifies nothing
	default:
		cur := Request{State: was}
		if err := notifyTransition(ctx, tx, cur.State, r, &pre); err != nil {
			return r, err
		}
	}
	if to.Final() && r.CallbackURL != "" {
		payload, err := json.Marshal(CallbackPayload(r))
		if err != nil {
			return r, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO request_callbacks (request_id, source, url, payload)
			VALUES ($1, $2, $3, $4)`, id, SourceName(r.Source), r.CallbackURL, payload); err != nil {
			return r, fmt.Errorf("queue callback of request %s: %w", id, err)
		}
	}
	return r, nil
}

// Do runs fn in a transaction of the store's pool and commits when fn
// returns nil.
func (s *Store) Do(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, fn)
}

// WebhookSourcePrefix starts the source of requests that came by webhook.
const WebhookSourcePrefix = "webhook:"

// SourceName returns the webhook source name of a request source
// ("webhook:batch" → "batch"), or the source itself.
func SourceName(source string) string {
	if len(source) > len(WebhookSourcePrefix) && source[:len(WebhookSourcePrefix)] == WebhookSourcePrefix {
		return source[len(WebhookSourcePrefix):]
	}
	return source
}

// Callback is the body POSTed to a request's callback URL.
type Callback struct {
	RequestID    uuid.UUID  `json:"request_id"`
	Kind         string     `json:"kind"`
	InstanceUUID *uuid.UUID `json:"instance_uuid,omitempty"`
	State        State      `json:"state"`
	Phase        string     `json:"phase,omitempty"`
	Reason       string     `json:"reason,omitempty"`
	Code         string     `json:"code,omitempty"`
	CreatedAt    time.Time  `json:"created_at"`
	FinishedAt   *time.Time `json:"finished_at,omitempty"`
}

// CallbackPayload is what the callback of r carries.
func CallbackPayload(r Request) Callback {
	return Callback{RequestID: r.ID, Kind: r.Kind, InstanceUUID: r.InstanceUUID, State: r.State, Phase: r.Phase,
		Reason: r.Reason, Code: r.Code, CreatedAt: r.CreatedAt, FinishedAt: r.FinishedAt}
}

// ActDecided records, in one statement, what request id's act does (as
// RecordAct: its vGPUs, pending, and the commands it queues with
// purpose) and moves the request to to as TransitionUntil does (audited,
// deadline set), to a state that is not final. Its notification
// (vgpu.attach.start …) is queued as TransitionUntil queues it, or,
// with later, appended there for the caller to queue in the same
// transaction (CloseAppliedWith).
func (s *Store) ActDecided(ctx context.Context, tx pgx.Tx, id uuid.UUID, to State, phase, reason string, deadline time.Time,
	atts []flow.Attachment, purpose string, cmds []Command, later *[]notify.Item) (Request, error) {
	if !to.Valid() || to.Final() {
		return Request{}, fmt.Errorf("request %s: ActDecided to %q: %w", id, to, ErrIllegal)
	}
	args := append(recordActArgs(id, atts, purpose, cmds), string(to), phase, reason, "", allowedFrom(to), s.actor, &deadline)
	var was State
	var pre notePrefetch
	// The move's notification lists the request's vGPUs: those of the
	// table (released by it, BeginRelease) and those a inserts, which
	// the statement's other parts do not see.
	r, err := scanWith(tx.QueryRow(ctx, `WITH a AS (`+recordAttachmentsSQL+`
			RETURNING id, request_id, profile, type_id, resource_class, amount, host, provider_uuid, pci_address, state, created_at),
		cmd AS (`+recordCommandsSQL+`),
		`+transitionCTEs(26, "au")+`
		SELECT u.*, coalesce(i.project_id, ''), coalesce(i.user_id, ''),
			CASE WHEN $26 IN ('decided','succeeded','failed','rejected') THEN (SELECT coalesce(jsonb_agg(jsonb_build_object(
					'new', v.request_id = $1, 'id', v.id::text, 'profile', coalesce(v.profile,''), 'type_id', coalesce(v.type_id,''),
					'class', coalesce(v.resource_class,'VGPU'), 'amount', v.amount, 'host', v.host, 'provider', coalesce(v.provider_uuid::text,''),
					'pci', coalesce(v.pci_address,''), 'state', v.state) ORDER BY v.created_at, v.id), '[]'::jsonb)
				FROM (SELECT id, request_id, profile, type_id, resource_class, amount, host, provider_uuid, pci_address, state, created_at
						FROM vgpu_attachments WHERE request_id = $1 OR release_request_id = $1
					UNION ALL SELECT * FROM a) v) END
		FROM u LEFT JOIN instances i ON i.uuid = u.instance_uuid`, args...),
		[]any{&was}, &pre.project, &pre.user, &pre.vgpus)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, s.refused(ctx, tx, id, to)
	}
	if err != nil {
		return r, fmt.Errorf("request %s: record %d attachment(s) and %d command(s) and transition: %w", id, len(atts), len(cmds), err)
	}
	it, err := transitionNote(ctx, tx, was, r, &pre)
	if err != nil || it == nil {
		return r, err
	}
	if later != nil {
		*later = append(*later, *it)
		return r, nil
	}
	return r, notify.Queue(ctx, tx, it.EventType, it.Priority, it.Payload)
}

// transitionCTEs is the part of a statement that moves request $1 to a
// new state, with its audit row: CTE u (the request as moved, with its
// former state cur_state, or no row when its state was not one of those
// allowed) and CTE audit (the audit_log row). The move's parameters
// follow one another from $k: state, phase, reason, code, the states
// allowed, the actor, the deadline.
func transitionCTEs(k int, audit string) string {
	state, phase, reason, code := "$"+strconv.Itoa(k), "$"+strconv.Itoa(k+1), "$"+strconv.Itoa(k+2), "$"+strconv.Itoa(k+3)
	allowed, actor, deadline := "$"+strconv.Itoa(k+4), "$"+strconv.Itoa(k+5), "$"+strconv.Itoa(k+6)
	return `u AS (
			UPDATE requests r SET state = ` + state + `, phase = nullif(` + phase + `,''), reason = nullif(` + reason + `,''),
				code = nullif(` + code + `,''), updated_at = now(),
				decided_at = CASE WHEN ` + state + ` = 'decided' AND decided_at IS NULL THEN now() ELSE decided_at END,
				dispatched_at = CASE WHEN ` + state + ` = 'dispatched' AND dispatched_at IS NULL THEN now() ELSE dispatched_at END,
				finished_at = CASE WHEN ` + state + ` IN ('succeeded','failed','rejected') THEN now() ELSE finished_at END,
				deadline_at = coalesce(` + deadline + `, deadline_at)
			FROM (SELECT id AS cur_id, state AS cur_state FROM requests WHERE id = $1 FOR UPDATE) c
			WHERE r.id = c.cur_id AND c.cur_state = ANY(` + allowed + `::text[])
			RETURNING c.cur_state, ` + columns + `
		), ` + audit + ` AS (
			INSERT INTO audit_log (actor, action, object_type, object_id, request_id, detail)
			SELECT ` + actor + `, 'transition', 'request', $1::text, $1,
				jsonb_build_object('from', cur_state, 'to', ` + state + `::text, 'phase', ` + phase + `::text, 'reason', ` + reason + `::text, 'code', ` + code + `::text) FROM u
		)`
}
