package webhook

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// writeTracer records the statements that write the tables of an accept.
type writeTracer struct {
	mu    sync.Mutex
	stmts []string
}

var acceptWrite = regexp.MustCompile(`(?i)insert\s+into\s+(requests|events|audit_log|webhook_idempotency|webhook_signed_bodies)\b`)

func (w *writeTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if acceptWrite.MatchString(d.SQL) {
		w.mu.Lock()
		w.stmts = append(w.stmts, d.SQL)
		w.mu.Unlock()
	}
	return ctx
}

func (w *writeTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (w *writeTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (w *writeTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if acceptWrite.MatchString(d.SQL) {
		w.mu.Lock()
		w.stmts = append(w.stmts, d.SQL)
		w.mu.Unlock()
	}
}

func (w *writeTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestAcceptOneStatement: a new signed request with an idempotency key is
// written in one statement (requests.CreateWebhook): its request, audit
// row, inbox event, key and body digest; the rows are all there.
func TestAcceptOneStatement(t *testing.T) {
	db := testsvc.MigratedPostgres(t)
	cfg, err := pgxpool.ParseConfig(db)
	testsvc.Must(t, err, "pool config")
	tr := &writeTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	testsvc.Must(t, err, "pool")
	t.Cleanup(pool.Close)
	e := newEnvDB(t, db, []webhook.Source{batchSource()}, func(wc *webhook.Config, _ *api.Config) {
		wc.Pool, wc.Store = pool, requests.NewStore(pool, "test")
	})
	id := e.want202(e.postHub("batch", secretNew, nativeBody(`"metrics":{"util":0.5}`), "one-statement"))
	tr.mu.Lock()
	stmts := append([]string(nil), tr.stmts...)
	tr.mu.Unlock()
	if len(stmts) != 1 {
		t.Fatalf("%d statements wrote the accept, want 1:\n%s", len(stmts), strings.Join(stmts, "\n---\n"))
	}
	for _, table := range []string{"requests", "events", "audit_log", "webhook_idempotency", "webhook_signed_bodies"} {
		if !regexp.MustCompile(`(?i)insert\s+into\s+` + table + `\b`).MatchString(stmts[0]) {
			t.Errorf("the statement does not write %s", table)
		}
	}
	for q, want := range map[string]int{
		`SELECT count(*) FROM requests WHERE id = $1 AND idempotency_key = 'one-statement' AND state = 'accepted'`:  1,
		`SELECT count(*) FROM events WHERE request_id = $1::text AND message_id = $1::text`:                         1,
		`SELECT count(*) FROM audit_log WHERE object_id = $1::text AND action = 'create'`:                           1,
		`SELECT count(*) FROM webhook_idempotency WHERE request_id = $1 AND key = 'one-statement' AND status = 202`: 1,
		`SELECT count(*) FROM webhook_signed_bodies WHERE request_id = $1 AND key = 'one-statement'`:                1,
	} {
		if n := e.count(q, id); n != want {
			t.Errorf("%s: %d, want %d", q, n, want)
		}
	}
}

// TestAcceptBatchRows: requests accepted together (concurrent senders,
// group commits of several) each get their own rows: the key, the body
// digest, the inbox event and the stored answer name the request that
// made them.
func TestAcceptBatchRows(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	const n = 40
	ids := make([]uuid.UUID, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ids[i] = e.want202(e.postHub("batch", secretNew, nativeBody(`"metrics":{"i":`+strconv.Itoa(i)+`}`), "batch-rows-"+strconv.Itoa(i)))
		})
	}
	wg.Wait()
	for q, what := range map[string]string{
		`SELECT count(*) FROM requests r JOIN webhook_idempotency w ON w.source = 'batch' AND w.key = r.idempotency_key AND w.request_id = r.id
			WHERE r.id = ANY($1) AND position(r.id::text IN convert_from(w.response, 'UTF8')) > 0`: "keys",
		`SELECT count(*) FROM requests r JOIN webhook_signed_bodies b ON b.source = 'batch' AND b.key = r.idempotency_key AND b.request_id = r.id
			WHERE r.id = ANY($1)`: "signed bodies",
		`SELECT count(*) FROM requests r JOIN events ev ON ev.source = 'webhook:batch' AND ev.message_id = r.id::text AND ev.request_id = r.id::text
			WHERE r.id = ANY($1) AND ev.payload->>'request_id' = r.id::text AND ev.payload->'metrics'->>'i' = substr(r.idempotency_key, 12)
			  AND r.body->'metrics'->>'i' = substr(r.idempotency_key, 12)`: "events",
		`SELECT count(*) FROM audit_log WHERE action = 'create' AND object_id = ANY($1::uuid[]::text[])`: "audit rows",
	} {
		if got := e.count(q, ids); got != n {
			t.Errorf("%s: %d of %d requests", what, got, n)
		}
	}
}
