package benchkit

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SQLCount counts, on the client side, what the connections of the pools
// it is installed on (TracedPool) send to Postgres, as a pgx tracer:
//
//   - statements: every Exec, Query and QueryRow, every query of a batch
//     and every CopyFrom, except transaction control (BEGIN, START
//     TRANSACTION, COMMIT, END, ROLLBACK, ABORT, SAVEPOINT, RELEASE),
//     which is counted apart;
//   - transactions: each BEGIN (or START TRANSACTION), and each statement
//     or batch sent while the connection is in no transaction (Postgres
//     runs it in an implicit one of its own);
//   - pings: the pool's liveness checks of a connection idle for more
//     than a second (an empty query: no statement, but Postgres counts
//     a transaction for it).
//
// It costs a few atomic additions per statement; Texts adds a map update
// under a lock.
type SQLCount struct {
	stmts, ctl, txs, pings atomic.Int64
	prepares, idlePrepares atomic.Int64
	connects               atomic.Int64
	keep                   atomic.Bool
	mu                     sync.Mutex
	texts                  map[string]int64
	times                  map[string]time.Duration // per text: from the call to its end (rows read and closed)
	// The statements each connection has prepared, as far as the tracer
	// saw: pgx prepares a batch's new statements without Prepare.
	prepMu sync.Mutex
	known  map[*pgx.Conn]map[string]bool
}

// SQLCounts is a reading of a SQLCount (or the difference of two).
type SQLCounts struct {
	Statements   int64 // not transaction control
	Control      int64 // BEGIN, COMMIT, ROLLBACK, SAVEPOINT, ...
	Transactions int64 // explicit and implicit
	Pings        int64 // the pool's liveness checks
	Prepares     int64 // round trips that prepare statements new to a connection
	IdlePrepares int64 // of those, the ones outside a transaction (Postgres counts a transaction for each)
	Connects     int64 // new connections (Postgres counts a transaction for each backend's start)
}

// Counts reads c.
func (c *SQLCount) Counts() SQLCounts {
	return SQLCounts{Statements: c.stmts.Load(), Control: c.ctl.Load(), Transactions: c.txs.Load(), Pings: c.pings.Load(),
		Prepares: c.prepares.Load(), IdlePrepares: c.idlePrepares.Load(), Connects: c.connects.Load()}
}

// Sub is a − b.
func (a SQLCounts) Sub(b SQLCounts) SQLCounts {
	return SQLCounts{Statements: a.Statements - b.Statements, Control: a.Control - b.Control,
		Transactions: a.Transactions - b.Transactions, Pings: a.Pings - b.Pings,
		Prepares: a.Prepares - b.Prepares, IdlePrepares: a.IdlePrepares - b.IdlePrepares, Connects: a.Connects - b.Connects}
}

// KeepTexts starts (or stops) counting each statement's text, as Texts
// returns it.
func (c *SQLCount) KeepTexts(on bool) { c.keep.Store(on) }

// Texts returns how often each statement text (its whitespace collapsed,
// cut at 160 characters) was counted while KeepTexts was on, and clears
// the counts.
func (c *SQLCount) Texts() map[string]int64 {
	t, _ := c.TextsTimed()
	return t
}

// TextsTimed is Texts with, per text, the time its Exec, Query and
// QueryRow calls took from the call to their end (the round trip, the
// server's work and the reading of the rows; statements of a batch are
// not timed), and clears both.
func (c *SQLCount) TextsTimed() (map[string]int64, map[string]time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, d := c.texts, c.times
	c.texts, c.times = nil, nil
	return t, d
}

// TopTextsTimed is TopTexts with each text's mean time per call
// (TextsTimed), where it was timed.
func TopTextsTimed(texts map[string]int64, times map[string]time.Duration, n int) []string {
	out := TopTexts(texts, n)
	for i, l := range out {
		// TopTexts's line: "%6.2f  text".
		sql := l[8:]
		if d, ok := times[sql]; ok && texts[sql] > 0 {
			out[i] = fmt.Sprintf("%s %7.3f ms  %s", l[:6], float64(d)/float64(texts[sql])/1e6, sql)
		} else {
			out[i] = fmt.Sprintf("%s %7s     %s", l[:6], "", sql)
		}
	}
	return out
}

// TopTexts formats texts as lines "count/per  text", most frequent first,
// per being count divided by n.
func TopTexts(texts map[string]int64, n int) []string {
	type kv struct {
		sql string
		n   int64
	}
	var all []kv
	for s, k := range texts {
		all = append(all, kv{s, k})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n || all[i].n == all[j].n && all[i].sql < all[j].sql })
	out := make([]string, 0, len(all))
	for _, e := range all {
		out = append(out, fmt.Sprintf("%6.2f  %s", float64(e.n)/float64(max(n, 1)), e.sql))
	}
	return out
}

// text counts sql's text while KeepTexts is on and returns it as
// counted ("" when off).
func (c *SQLCount) text(sql string) string {
	if !c.keep.Load() {
		return ""
	}
	s := strings.Join(strings.Fields(sql), " ")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	c.mu.Lock()
	if c.texts == nil {
		c.texts = map[string]int64{}
	}
	c.texts[s]++
	c.mu.Unlock()
	return s
}

// kind classifies sql by its first keyword (after blanks and -- comments):
// 'b' begins a transaction, 'c' is other transaction control, 's' any
// other statement.
func kind(sql string) byte {
	s := strings.TrimSpace(sql)
	for strings.HasPrefix(s, "--") {
		_, rest, _ := strings.Cut(s, "\n")
		s = strings.TrimSpace(rest)
	}
	end := strings.IndexFunc(s, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') })
	if end >= 0 {
		s = s[:end]
	}
	switch strings.ToLower(s) {
	case "begin", "start":
		return 'b'
	case "commit", "end", "rollback", "abort", "savepoint", "release":
		return 'c'
	}
	return 's'
}

// idle is whether conn is in no transaction: a statement sent now runs in
// an implicit one.
func idle(conn *pgx.Conn) bool { return conn.PgConn().TxStatus() == 'I' }

func (c *SQLCount) one(sql string, implicit bool) string {
	switch kind(sql) {
	case 'b':
		c.txs.Add(1)
		c.ctl.Add(1)
	case 'c':
		c.ctl.Add(1)
	default:
		c.stmts.Add(1)
		if implicit {
			c.txs.Add(1)
		}
	}
	return c.text(sql)
}

type timedKey struct{}

type timed struct {
	text  string
	start time.Time
}

// TraceQueryStart counts an Exec, Query or QueryRow (pgx.QueryTracer).
func (c *SQLCount) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if s := c.one(d.SQL, idle(conn)); s != "" {
		return context.WithValue(ctx, timedKey{}, timed{s, time.Now()})
	}
	return ctx
}

// TraceQueryEnd times the call while KeepTexts is on.
func (c *SQLCount) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	t, ok := ctx.Value(timedKey{}).(timed)
	if !ok {
		return
	}
	d := time.Since(t.start)
	c.mu.Lock()
	if c.times == nil {
		c.times = map[string]time.Duration{}
	}
	c.times[t.text] += d
	c.mu.Unlock()
}

// TraceBatchStart counts each query of a batch; a batch sent outside a
// transaction that does not begin one is one implicit transaction
// (pgx.BatchTracer).
func (c *SQLCount) TraceBatchStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	qs := d.Batch.QueuedQueries
	if len(qs) > 0 && idle(conn) && kind(qs[0].SQL) != 'b' {
		c.txs.Add(1)
	}
	for _, q := range qs {
		_ = c.one(q.SQL, false)
	}
	if conn.Config().DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		c.prepMu.Lock()
		fresh := false
		for _, q := range qs {
			fresh = c.learn(conn, q.SQL) || fresh
		}
		c.prepMu.Unlock()
		if fresh { // pgx prepares them first, in one round trip of their own
			c.prepared(conn)
		}
	}
	return ctx
}

// learn records that conn has sql prepared and reports whether it was
// new; c.prepMu is held.
func (c *SQLCount) learn(conn *pgx.Conn, sql string) bool {
	if c.known == nil {
		c.known = map[*pgx.Conn]map[string]bool{}
	}
	m := c.known[conn]
	if m == nil {
		m = map[string]bool{}
		c.known[conn] = m
	}
	if m[sql] {
		return false
	}
	m[sql] = true
	return true
}

// TraceBatchQuery is a no-op.
func (c *SQLCount) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd is a no-op.
func (c *SQLCount) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

type prepKey struct{}

// TracePrepareStart passes the statement on to TracePrepareEnd
// (pgx.PrepareTracer).
func (c *SQLCount) TracePrepareStart(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	return context.WithValue(ctx, prepKey{}, d.SQL)
}

// TracePrepareEnd counts a statement's preparation: pgx prepares a
// statement the first time a connection sends it with arguments.
func (c *SQLCount) TracePrepareEnd(ctx context.Context, conn *pgx.Conn, d pgx.TracePrepareEndData) {
	if !d.AlreadyPrepared {
		c.prepared(conn)
		sql, _ := ctx.Value(prepKey{}).(string)
		c.prepMu.Lock()
		c.learn(conn, sql)
		c.prepMu.Unlock()
	}
}

func (c *SQLCount) prepared(conn *pgx.Conn) {
	c.prepares.Add(1)
	if idle(conn) {
		c.idlePrepares.Add(1)
	}
}

// TraceConnectStart is a no-op (pgx.ConnectTracer).
func (c *SQLCount) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	return ctx
}

// TraceConnectEnd counts a new connection.
func (c *SQLCount) TraceConnectEnd(_ context.Context, d pgx.TraceConnectEndData) {
	if d.Err == nil {
		c.connects.Add(1)
	}
}

// TraceCopyFromStart counts a CopyFrom (pgx.CopyFromTracer).
func (c *SQLCount) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	_ = c.one("COPY "+d.TableName.Sanitize(), idle(conn))
	return ctx
}

// TraceCopyFromEnd is a no-op.
func (c *SQLCount) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

// TracedPool opens a pool on url of at most maxConns connections (0: pgx's
// default), as the bridge's store.Open does, whose connections report
// application_name app (for AppBackendCPU) and are counted by c.
func TracedPool(ctx context.Context, url, app string, maxConns int32, c *SQLCount) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	if maxConns > 0 {
		pc.MaxConns = maxConns
	}
	pc.ConnConfig.RuntimeParams["application_name"] = app
	pc.ConnConfig.Tracer = c
	pc.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool {
		if p.IdleDuration > time.Second { // pgxpool's default
			c.pings.Add(1)
			return true
		}
		return false
	}
	return pgxpool.NewWithConfig(ctx, pc)
}

// AppBackendCPU is the CPU time the Postgres backends serving pool's
// database with application_name app used so far (read from /proc:
// Postgres runs on this machine).
func AppBackendCPU(ctx context.Context, pool *pgxpool.Pool, app string) time.Duration {
	return backendCPU(ctx, pool, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1", app)
}

// DBTransactions is the count of transactions Postgres has committed and
// rolled back in pool's database (pg_stat_database), as its cumulative
// statistics hold it: a backend reports its counts when idle, at most
// once a second, and one left idle within 10 s.
func DBTransactions(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n, err
}

// AutovacuumRuns is how many times autovacuum has vacuumed or analyzed a
// table of pool's database (each is one transaction or more that
// pg_stat_database counts and no client sent).
func AutovacuumRuns(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_all_tables`).Scan(&n)
	return n, err
}
