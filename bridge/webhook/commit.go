package webhook

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
)

// CodeNoInstance is the code of an Alertmanager request none of whose
// alerts named an instance.
const CodeNoInstance = "no_instance"

type eventRow struct {
	vm      string
	at      time.Time
	payload EventPayload
	alert   int // Alertmanager: the alert's index in the message
	// Set by encodeEvents, in the request's goroutine, so that the commit
	// workers (the serial part) only copy them.
	msgID  string
	vmUUID uuid.UUID
	json   string
	err    error
	// project is the instance's project (events.project_id), "" when
	// the bridge did not know it when the request came.
	project string
}

// encodeEvents gives each event its inbox message id and JSON payload.
func (p *pending) encodeEvents() {
	id := p.req.ID.String()
	for n := range p.events {
		ev := &p.events[n]
		ev.msgID = id
		if len(p.events) > 1 || p.src.cfg.Format == FormatAlertmanager {
			ev.msgID += "/" + strconv.Itoa(n)
		}
		if ev.json == "" { // build encoded a native request's payload with its body
			b, err := json.Marshal(ev.payload)
			ev.json, ev.err = string(b), err
		}
		if u, perr := uuid.Parse(ev.vm); perr != nil && ev.err == nil {
			ev.err = fmt.Errorf("event of request %s: vm_id %q: %w", id, ev.vm, perr)
		} else {
			ev.vmUUID = u
		}
	}
}

// pending is one accepted webhook waiting for its commit.
type pending struct {
	src          *source
	req          requests.Request
	events       []eventRow
	rejectReason string // non-empty: the request is rejected at once
	rejectCode   string // its code (CodeNoInstance when empty)
	answer       []byte
	key          string
	hash         [32]byte
	// bodyOnly: the signature covers the body alone (X-Hub-Signature-256);
	// its digest is claimed so that the body acts at most once.
	bodyOnly bool
	signedAt time.Time // the body's own timestamp, if it has one
	eventID  string    // the body's own event id, if it has one (Native.EventID)
	done     chan result
}

type result struct {
	status   int
	body     []byte
	replay   bool
	conflict bool
	replayed bool // a body-signed request's body was accepted before under another key
	// first is the request that body made (replayed): the same source
	// sent it, so the sender may follow it.
	first uuid.UUID
	err   error
}

// commit hands p to the committers and waits for its outcome.
func (e *Endpoint) commit(ctx context.Context, p *pending) result {
	p.req.IdempotencyKey = p.key
	e.waiting.Add(1)
	defer e.waiting.Add(-1)
	t := time.NewTimer(e.cfg.CommitTimeout)
	defer t.Stop()
	select {
	case e.queue <- p:
	case <-t.C:
		return result{err: errors.New("commit queue full")}
	}
	select {
	case r := <-p.done:
		return r
	case <-t.C:
		return result{err: errors.New("commit timed out")}
	}
}

// commitLoop commits what is queued, in batches: whatever queued up while
// the previous transaction ran goes into the next one. After ctx ends it
// goes on while handlers still wait for an answer (at most a commit
// timeout without work), so that requests the HTTP server is still
// draining get their answer.
func (e *Endpoint) commitLoop(ctx context.Context) {
	batch := make([]*pending, 0, e.cfg.BatchSize)
	bg := context.WithoutCancel(ctx)
	for {
		var p *pending
		select {
		case p = <-e.queue:
		case <-ctx.Done():
			if p = e.drainNext(); p == nil {
				return
			}
		}
		batch = append(batch[:0], p)
	fill:
		for len(batch) < e.cfg.BatchSize {
			select {
			case q := <-e.queue:
				batch = append(batch, q)
			default:
				break fill
			}
		}
		e.commitBatch(bg, batch)
	}
}

// drainNext is the committers' wait after shutdown began: the next
// queued request, or nil once no handler waits for a commit and nothing is
// queued (or after a commit timeout without work).
func (e *Endpoint) drainNext() *pending {
	idle := time.NewTimer(e.cfg.CommitTimeout)
	defer idle.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case p := <-e.queue:
			return p
		case <-idle.C:
			return nil
		case <-tick.C:
			if e.waiting.Load() == 0 && len(e.queue) == 0 {
				return nil
			}
		}
	}
}

func (e *Endpoint) commitBatch(ctx context.Context, batch []*pending) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CommitTimeout)
	defer cancel()
	res, err := e.tryCommit(ctx, batch)
	e.m.batchSize.Observe(float64(len(batch)))
	e.m.commitDur.Observe(time.Since(start).Seconds())
	if err != nil && len(batch) > 1 {
		// One request may spoil a batch (Postgres refuses a value): commit
		// each alone so the others still get in.
		e.log.Warn("webhook batch commit failed; committing one by one", "size", len(batch), "err", err)
		for _, p := range batch {
			r, err := e.tryCommit(ctx, []*pending{p})
			if err != nil {
				p.done <- result{err: err}
				continue
			}
			if e.cfg.OnCommitted != nil {
				e.cfg.OnCommitted()
			}
			p.done <- r[0]
		}
		return
	}
	if err == nil && e.cfg.OnCommitted != nil {
		e.cfg.OnCommitted()
	}
	for i, p := range batch {
		if err != nil {
			p.done <- result{err: err}
			continue
		}
		p.done <- res[i]
	}
}

type keyRef struct{ source, key string }

type storedKey struct {
	hash   []byte
	status int
	body   []byte
}

// tryCommit writes batch in one transaction and returns each one's answer.
func (e *Endpoint) tryCommit(ctx context.Context, batch []*pending) ([]result, error) {
	if res, ok, err := e.tryCommitNew(ctx, batch); ok || err != nil {
		return res, err
	}
	return e.tryCommitTx(ctx, batch)
}

// tryCommitNew is the common case in one statement: every request is new
// (no rejection to record, no idempotency key or signed body seen before
// or twice in the batch). The statement (requests.CreateWebhook) claims
// the keys and bodies by plain INSERTs, so one taken already fails it
// whole, and nothing of it is kept. ok is false when the batch is not of
// that kind, or a key or a body was taken: then tryCommitTx decides it.
func (e *Endpoint) tryCommitNew(ctx context.Context, batch []*pending) (res []result, ok bool, err error) {
	claims := requests.WebhookClaims{TTL: e.cfg.IdempotencyTTL.Seconds()}
	var seen map[keyRef]bool
	var bodies map[bodyRef]bool
	for i, p := range batch {
		if p.rejectReason != "" || p.src.cfg.Format == FormatAlertmanager {
			// Alerts are claimed one by one (claimAlerts): tryCommitTx.
			return nil, false, nil
		}
		if p.bodyOnly {
			b := bodyRef{p.src.cfg.Name, p.hash}
			if len(batch) > 1 {
				if bodies[b] {
					return nil, false, nil
				}
				if bodies == nil {
					bodies = make(map[bodyRef]bool, len(batch))
				}
				bodies[b] = true
			}
			claims.AddBody(b.source, p.hash[:], p.key, i)
		}
		if p.key == "" {
			continue
		}
		k := keyRef{p.src.cfg.Name, p.key}
		if len(batch) > 1 {
			if seen[k] {
				return nil, false, nil
			}
			if seen == nil {
				seen = make(map[keyRef]bool, len(batch))
			}
			seen[k] = true
		}
		claims.AddKey(k.source, k.key, p.hash[:], i, p.answer)
	}
	err = e.create(ctx, e.pool, batch, &claims)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" /* unique_violation */ && (pe.TableName == "webhook_idempotency" || pe.TableName == "webhook_signed_bodies") {
		return nil, false, nil // a key or a body was seen before: the full path tells replay from conflict
	}
	if err != nil {
		return nil, false, fmt.Errorf("store requests: %w", err)
	}
	res = make([]result, len(batch))
	for i, p := range batch {
		res[i] = result{status: http.StatusAccepted, body: p.answer}
	}
	return res, true, nil
}

// create writes the requests of create, their inbox events and claims
// (nil: none) in one statement of q.
func (e *Endpoint) create(ctx context.Context, q requests.Execer, create []*pending, claims *requests.WebhookClaims) error {
	reqs := make([]requests.Request, len(create))
	var evs requests.WebhookEvents
	for j, p := range create {
		reqs[j] = p.req
		for _, ev := range p.events {
			if ev.err != nil {
				return ev.err
			}
			evs.Add(p.src.label, ev.msgID, ev.payload.Type, [16]byte(ev.vmUUID), ev.at, ev.json, j, ev.project)
		}
	}
	return e.store.CreateWebhook(ctx, q, reqs, &evs, claims)
}

// tryCommitTx writes batch in one explicit transaction: it claims the
// idempotency keys it can, answers the others from their first answer
// (or 409), and records rejections.
func (e *Endpoint) tryCommitTx(ctx context.Context, batch []*pending) ([]result, error) {
	res := make([]result, len(batch))
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck

	// Idempotency keys: the first of a key in the batch leads; the others
	// follow its outcome.
	leaders := map[keyRef]int{}
	var followers, keyed []int
	for i, p := range batch {
		if p.key == "" {
			continue
		}
		k := keyRef{p.src.cfg.Name, p.key}
		if _, ok := leaders[k]; ok {
			followers = append(followers, i)
			continue
		}
		leaders[k] = i
		keyed = append(keyed, i)
	}
	existing := map[keyRef]storedKey{}
	inserted := map[keyRef]bool{}
	if len(keyed) > 0 {
		// Claim the keys. ON CONFLICT waits for a concurrent transaction
		// holding the same key, so a loser sees the winner's committed row.
		insert := func(idx []int) error {
			srcs, keys, ids := make([]string, len(idx)), make([]string, len(idx)), make([]string, len(idx))
			resps, hashes := make([][]byte, len(idx)), make([][]byte, len(idx))
			for j, i := range idx {
				p := batch[i]
				srcs[j], keys[j], ids[j], resps[j], hashes[j] = p.src.cfg.Name, p.key, p.req.ID.String(), p.answer, p.hash[:]
			}
			rows, err := tx.Query(ctx, `INSERT INTO webhook_idempotency (source, key, body_sha256, request_id, status, response, expires_at)
				SELECT s, k, h, id, 202, resp, now() + make_interval(secs => $6)
				FROM unnest($1::text[], $2::text[], $3::bytea[], $4::uuid[], $5::bytea[]) AS t(s, k, h, id, resp)
				ON CONFLICT (source, key) DO NOTHING RETURNING source, key`,
				srcs, keys, hashes, ids, resps, e.cfg.IdempotencyTTL.Seconds())
			if err != nil {
				return fmt.Errorf("idempotency keys: %w", err)
			}
			defer rows.Close()
			for rows.Next() {
				var k keyRef
				if err := rows.Scan(&k.source, &k.key); err != nil {
					return err
				}
				inserted[k] = true
			}
			return rows.Err()
		}
		lost := func() (idx []int, srcs, keys []string) {
			for _, i := range keyed {
				if k := (keyRef{batch[i].src.cfg.Name, batch[i].key}); !inserted[k] {
					idx, srcs, keys = append(idx, i), append(srcs, k.source), append(keys, k.key)
				}
			}
			return
		}
		if err := insert(keyed); err != nil {
			return nil, err
		}
		if idx, srcs, keys := lost(); len(idx) > 0 {
			// Some keys were taken: free those that expired, claim them
			// again, and read the first answers of the others.
			tag, err := tx.Exec(ctx, `DELETE FROM webhook_idempotency w USING unnest($1::text[], $2::text[]) AS t(s, k)
				WHERE w.source = t.s AND w.key = t.k AND w.expires_at < now()`, srcs, keys)
			if err != nil {
				return nil, fmt.Errorf("expire idempotency keys: %w", err)
			}
			if tag.RowsAffected() > 0 {
				if err := insert(idx); err != nil {
					return nil, err
				}
				idx, srcs, keys = lost()
			}
			if len(idx) > 0 {
				rows, err := tx.Query(ctx, `SELECT source, key, body_sha256, status, response FROM webhook_idempotency w
					JOIN unnest($1::text[], $2::text[]) AS t(s, k) ON w.source = t.s AND w.key = t.k`, srcs, keys)
				if err != nil {
					return nil, fmt.Errorf("idempotency keys: %w", err)
				}
				for rows.Next() {
					var k keyRef
					var s storedKey
					if err := rows.Scan(&k.source, &k.key, &s.hash, &s.status, &s.body); err != nil {
						rows.Close()
						return nil, err
					}
					existing[k] = s
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					return nil, fmt.Errorf("idempotency keys: %w", err)
				}
			}
		}
	}
	// What a leader that lost to an earlier request answers.
	answerFrom := func(p *pending, s storedKey) result {
		if !bytes.Equal(s.hash, p.hash[:]) {
			return result{conflict: true}
		}
		return result{status: s.status, body: s.body, replay: true}
	}
	var create []*pending
	for i, p := range batch {
		if p.key == "" {
			create = append(create, p)
			res[i] = result{status: http.StatusAccepted, body: p.answer}
			continue
		}
		k := keyRef{p.src.cfg.Name, p.key}
		if leaders[k] != i {
			continue // follower
		}
		if inserted[k] {
			create = append(create, p)
			res[i] = result{status: http.StatusAccepted, body: p.answer}
			continue
		}
		s, ok := existing[k]
		if !ok {
			return nil, fmt.Errorf("idempotency key of source %s vanished; retry", k.source)
		}
		res[i] = answerFrom(p, s)
	}
	// Bodies signed alone act once: a body accepted before (or earlier in
	// this batch) under another key, or none, is refused.
	replayed, err := e.claimBodies(ctx, tx, create)
	if err != nil {
		return nil, err
	}
	if len(replayed) > 0 {
		var freeSrcs, freeKeys []string
		kept := create[:0]
		for _, p := range create {
			if _, ok := replayed[p]; !ok {
				kept = append(kept, p)
				continue
			}
			if k := (keyRef{p.src.cfg.Name, p.key}); p.key != "" && inserted[k] {
				freeSrcs, freeKeys = append(freeSrcs, k.source), append(freeKeys, k.key)
			}
		}
		create = kept
		for i, p := range batch {
			if first, ok := replayed[p]; ok {
				res[i] = result{replayed: true, first: first}
			}
		}
		if len(freeSrcs) > 0 {
			// The key's first request is not made: the key stays free.
			if _, err := tx.Exec(ctx, `DELETE FROM webhook_idempotency w USING unnest($1::text[], $2::text[]) AS t(s, k)
				WHERE w.source = t.s AND w.key = t.k`, freeSrcs, freeKeys); err != nil {
				return nil, fmt.Errorf("idempotency keys: %w", err)
			}
		}
	}
	// Alerts act once however often Alertmanager sends them.
	changed, err := e.claimAlerts(ctx, tx, create)
	if err != nil {
		return nil, err
	}
	for _, p := range changed {
		for i, q := range batch {
			if q == p {
				res[i].body = p.answer
			}
		}
		if k := (keyRef{p.src.cfg.Name, p.key}); p.key != "" && inserted[k] {
			if _, err := tx.Exec(ctx, `UPDATE webhook_idempotency SET response = $3 WHERE source = $1 AND key = $2`, k.source, k.key, p.answer); err != nil {
				return nil, fmt.Errorf("idempotency keys: %w", err)
			}
		}
	}
	for _, i := range followers {
		p := batch[i]
		k := keyRef{p.src.cfg.Name, p.key}
		l := batch[leaders[k]]
		if first, ok := replayed[l]; ok {
			res[i] = result{replayed: p.hash == l.hash, conflict: p.hash != l.hash}
			if res[i].replayed {
				res[i].first = first
			}
			continue
		}
		if inserted[k] {
			res[i] = answerFrom(p, storedKey{hash: l.hash[:], status: http.StatusAccepted, body: l.answer})
		} else {
			res[i] = answerFrom(p, existing[k])
		}
	}

	if len(create) > 0 {
		if err := e.create(ctx, tx, create, nil); err != nil {
			return nil, fmt.Errorf("store requests: %w", err)
		}
		for _, p := range create {
			if p.rejectReason == "" {
				continue
			}
			if _, err := e.store.Transition(ctx, tx, p.req.ID, requests.Rejected, "", p.rejectReason, cmp.Or(p.rejectCode, CodeNoInstance)); err != nil {
				return nil, err
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return res, nil
}

type bodyRef struct {
	source string
	hash   [32]byte
}

// claimBodies claims the digests of the bodies signed alone among create
// (pending.bodyOnly) for the idempotency TTL, taking over expired claims.
// It returns those whose body was claimed before, by another transaction
// or by an earlier request of create, each with the request that claim
// made (claims are per source: it is the same source's request).
func (e *Endpoint) claimBodies(ctx context.Context, tx pgx.Tx, create []*pending) (map[*pending]uuid.UUID, error) {
	replayed := map[*pending]uuid.UUID{}
	first := map[bodyRef]*pending{}
	var later []*pending // bodies an earlier request of create holds
	var srcs, keys []string
	var ids [][16]byte
	var hashes [][]byte
	for _, p := range create {
		if !p.bodyOnly {
			continue
		}
		b := bodyRef{p.src.cfg.Name, p.hash}
		if _, ok := first[b]; ok {
			later = append(later, p)
			continue
		}
		first[b] = p
		srcs, keys, ids, hashes = append(srcs, b.source), append(keys, p.key), append(ids, [16]byte(p.req.ID)), append(hashes, p.hash[:])
	}
	if len(srcs) == 0 {
		return replayed, nil
	}
	// ON CONFLICT waits for a concurrent transaction claiming the same
	// body; a live claim is left alone (and locked) and not returned.
	rows, err := tx.Query(ctx, `INSERT INTO webhook_signed_bodies (source, body_sha256, key, request_id, expires_at)
		SELECT s, h, k, id, now() + make_interval(secs => $5)
		FROM unnest($1::text[], $2::bytea[], $3::text[], $4::uuid[]) AS t(s, h, k, id)
		ON CONFLICT (source, body_sha256) DO UPDATE SET key = EXCLUDED.key, request_id = EXCLUDED.request_id,
			expires_at = EXCLUDED.expires_at, created_at = now()
		WHERE webhook_signed_bodies.expires_at < now()
		RETURNING source, body_sha256`, srcs, hashes, keys, ids, e.cfg.IdempotencyTTL.Seconds())
	if err != nil {
		return nil, fmt.Errorf("signed bodies: %w", err)
	}
	claimed := map[bodyRef]bool{}
	for rows.Next() {
		var b bodyRef
		var h []byte
		if err := rows.Scan(&b.source, &h); err != nil {
			rows.Close()
			return nil, err
		}
		copy(b.hash[:], h)
		claimed[b] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("signed bodies: %w", err)
	}
	holder := map[bodyRef]uuid.UUID{}
	var heldSrcs []string
	var heldHashes [][]byte
	for b, p := range first {
		if claimed[b] {
			holder[b] = p.req.ID
			continue
		}
		heldSrcs, heldHashes = append(heldSrcs, b.source), append(heldHashes, b.hash[:])
	}
	if len(heldSrcs) > 0 {
		// The requests of the claims held before.
		rows, err := tx.Query(ctx, `SELECT w.source, w.body_sha256, w.request_id FROM webhook_signed_bodies w
			JOIN unnest($1::text[], $2::bytea[]) AS t(s, h) ON w.source = t.s AND w.body_sha256 = t.h`, heldSrcs, heldHashes)
		if err != nil {
			return nil, fmt.Errorf("signed bodies: %w", err)
		}
		for rows.Next() {
			var b bodyRef
			var h []byte
			var id uuid.UUID
			if err := rows.Scan(&b.source, &h, &id); err != nil {
				rows.Close()
				return nil, err
			}
			copy(b.hash[:], h)
			holder[b] = id
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("signed bodies: %w", err)
		}
	}
	for b, p := range first {
		if !claimed[b] {
			replayed[p] = holder[b]
		}
	}
	for _, p := range later {
		replayed[p] = holder[bodyRef{p.src.cfg.Name, p.hash}]
	}
	return replayed, nil
}

// janitor forgets expired idempotency keys and body digests.
func (e *Endpoint) janitor(ctx context.Context) {
	wake.Every(ctx, 10*time.Minute, func(ctx context.Context) {
		if _, err := e.pool.Exec(ctx, `DELETE FROM webhook_idempotency WHERE expires_at < now()`); err != nil && ctx.Err() == nil {
			e.log.Warn("forget expired idempotency keys", "err", err)
		}
		if _, err := e.pool.Exec(ctx, `DELETE FROM webhook_signed_bodies WHERE expires_at < now()`); err != nil && ctx.Err() == nil {
			e.log.Warn("forget expired signed bodies", "err", err)
		}
		if _, err := e.pool.Exec(ctx, `DELETE FROM webhook_alerts WHERE expires_at < now()`); err != nil && ctx.Err() == nil {
			e.log.Warn("forget expired alerts", "err", err)
		}
	})
}
