package requests

import (
	"context"
	"fmt"
)

// WebhookClaims are the webhook endpoint's claims written with the
// requests an accepted batch makes (CreateWebhook): its idempotency keys
// (webhook_idempotency, answer 202) and the digests of the bodies signed
// alone (webhook_signed_bodies), one entry per claim. Each names the
// request it made by its place in the requests it is written with.
type WebhookClaims struct {
	KeySources, Keys []string
	KeyHashes        [][]byte // body_sha256
	KeyRequests      []int32  // 1-based, as SQL arrays count
	KeyAnswers       [][]byte // the 202's body, byte for byte

	BodySources  []string
	BodyHashes   [][]byte
	BodyKeys     []string // "" for a delivery without a key
	BodyRequests []int32

	// TTL is how long the claims hold, in seconds.
	TTL float64
}

// AddKey appends the claim of an idempotency key by the request at index
// request (0-based) of those it is written with.
func (c *WebhookClaims) AddKey(source, key string, hash []byte, request int, answer []byte) {
	c.KeySources = append(c.KeySources, source)
	c.Keys = append(c.Keys, key)
	c.KeyHashes = append(c.KeyHashes, hash)
	c.KeyRequests = append(c.KeyRequests, int32(request+1))
	c.KeyAnswers = append(c.KeyAnswers, answer)
}

// AddBody appends the claim of a body signed alone by the request at
// index request (0-based) of those it is written with.
func (c *WebhookClaims) AddBody(source string, hash []byte, key string, request int) {
	c.BodySources = append(c.BodySources, source)
	c.BodyHashes = append(c.BodyHashes, hash)
	c.BodyKeys = append(c.BodyKeys, key)
	c.BodyRequests = append(c.BodyRequests, int32(request+1))
}

// createWebhookSQL writes, in one statement, the requests (in state
// accepted) with their audit rows, their inbox events and the webhook
// endpoint's plain claims. The claims are plain INSERTs: a key or a body
// claimed already fails the whole statement with a unique violation on
// webhook_idempotency or webhook_signed_bodies, and nothing of it is kept
// (the endpoint then decides the batch in a transaction of its own).
// Their foreign keys to requests are deferred; the others are checked at
// the end of the statement, after every row is in.
const createWebhookSQL = `WITH r AS (
		INSERT INTO requests (id, source, kind, instance_uuid, state, body, callback_url, idempotency_key)
		SELECT id, source, kind, inst, 'accepted', body::jsonb, cb, key
		FROM unnest($2::uuid[], $3::text[], $4::text[], $5::uuid[], $6::text[], $7::text[], $8::text[])
		  AS t(id, source, kind, inst, body, cb, key)
		RETURNING id, source, kind),
	ev AS (
		INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload, request_id, project_id)
		SELECT s, m, t, i, o, p::json, ($2::uuid[])[r]::text, NULLIF(pj, '')
		FROM unnest($9::text[], $10::text[], $11::text[], $12::uuid[], $13::timestamptz[], $14::text[], $15::int[], $16::text[])
		  AS x(s, m, t, i, o, p, r, pj)),
	ik AS (
		INSERT INTO webhook_idempotency (source, key, body_sha256, request_id, status, response, expires_at)
		SELECT s, k, h, ($2::uuid[])[r], 202, resp, now() + make_interval(secs => $26)
		FROM unnest($17::text[], $18::text[], $19::bytea[], $20::int[], $21::bytea[]) AS t(s, k, h, r, resp)),
	sb AS (
		INSERT INTO webhook_signed_bodies (source, body_sha256, key, request_id, expires_at)
		SELECT s, h, k, ($2::uuid[])[r], now() + make_interval(secs => $26)
		FROM unnest($22::text[], $23::bytea[], $24::text[], $25::int[]) AS t(s, h, k, r))
	INSERT INTO audit_log (actor, action, object_type, object_id, request_id, detail)
	SELECT $1, 'create', 'request', id::text, id::text,
	       jsonb_build_object('to', 'accepted', 'source', source, 'kind', kind)
	FROM r`

// CreateWebhook writes what the webhook endpoint accepted, in one
// statement of q: the requests rs in state accepted with their audit rows
// (as QueueCreate), their inbox events evs (nil: none), and the
// endpoint's claims c (nil: none), plain INSERTs that fail the statement
// when a key or a body is claimed already. Requests and events are this
// package's; the claims are the webhook endpoint's rows, written here so
// that an accepted batch costs Postgres one statement.
func (s *Store) CreateWebhook(ctx context.Context, q Execer, rs []Request, evs *WebhookEvents, c *WebhookClaims) error {
	if len(rs) == 0 {
		return nil
	}
	a, err := s.createArgs(rs)
	if err != nil {
		return err
	}
	if evs == nil {
		evs = &WebhookEvents{}
	}
	if c == nil {
		c = &WebhookClaims{}
	}
	args := append(a,
		evs.Sources, evs.MessageIDs, evs.Types, evs.Instances, evs.Occurred, evs.Payloads, evs.Requests, evs.Projects,
		c.KeySources, c.Keys, c.KeyHashes, c.KeyRequests, c.KeyAnswers,
		c.BodySources, c.BodyHashes, c.BodyKeys, c.BodyRequests,
		c.TTL)
	if _, err := q.Exec(ctx, createWebhookSQL, args...); err != nil {
		return fmt.Errorf("create requests: %w", err)
	}
	return nil
}
