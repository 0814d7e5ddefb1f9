package benchkit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestSQLCountMatchesPostgres runs each way the bridge talks to Postgres
// on a traced pool of one connection and checks the statements and
// transactions counted against what the case sends, and the transactions
// (with the pool's pings) against the server's own count in
// pg_stat_database, read from another database once the traced backend
// has reported its statistics.
func TestSQLCountMatchesPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, drop, err := ScratchDB(ctx, AdminURL(), "sqlcount_")
	if err != nil {
		t.Fatal(err)
	}
	defer drop()
	base, _, _ := strings.Cut(url, "?")
	name := base[strings.LastIndex(base, "/")+1:]
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var c SQLCount
	pool, err := TracedPool(ctx, url, "benchkit-test", 1, &c)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE t (v int)`); err != nil {
		t.Fatal(err)
	}
	// serverXacts is the server's count once the traced backend has
	// flushed its statistics (pg_stat_force_next_flush: when it next goes
	// idle, before it answers), read by a backend of another database.
	serverXacts := func() int64 {
		t.Helper()
		if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush(), count(*) FROM t`); err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := admin.QueryRow(ctx, `SELECT pg_stat_clear_snapshot() IS NULL`).Scan(new(bool)); err != nil {
			t.Fatal(err)
		}
		if err := admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	tests := []struct {
		name                 string
		run                  func() error
		stmts, ctl, txs, png int64
	}{
		{"exec outside a transaction", func() error { _, err := pool.Exec(ctx, `INSERT INTO t VALUES (1)`); return err }, 1, 0, 1, 0},
		{"query row after a comment", func() error { return pool.QueryRow(ctx, "-- count\nSELECT count(*) FROM t").Scan(new(int)) }, 1, 0, 1, 0},
		{"transaction of two statements", func() error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO t VALUES (2)`); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE t SET v = v + 1`)
				return err
			})
		}, 2, 2, 1, 0},
		{"rolled back transaction", func() error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `DELETE FROM t`); err != nil {
				return err
			}
			return tx.Rollback(ctx)
		}, 1, 2, 1, 0},
		{"batch outside a transaction", func() error {
			b := &pgx.Batch{}
			b.Queue(`INSERT INTO t VALUES (3)`)
			b.Queue(`INSERT INTO t VALUES (4)`)
			b.Queue(`SELECT count(*) FROM t`)
			return pool.SendBatch(ctx, b).Close()
		}, 3, 0, 1, 0},
		{"batch in a transaction", func() error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				b := &pgx.Batch{}
				b.Queue(`INSERT INTO t VALUES (5)`)
				b.Queue(`INSERT INTO t VALUES (6)`)
				return tx.SendBatch(ctx, b).Close()
			})
		}, 2, 2, 1, 0},
		{"copy outside a transaction", func() error {
			_, err := pool.CopyFrom(ctx, pgx.Identifier{"t"}, []string{"v"}, pgx.CopyFromRows([][]any{{7}, {8}}))
			return err
		}, 1, 0, 1, 0},
		{"exec after the connection idled past a second", func() error {
			time.Sleep(1100 * time.Millisecond)
			_, err := pool.Exec(ctx, `SELECT 1`)
			return err
		}, 1, 0, 1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Postgres also counts the transactions of an autovacuum worker
			// that visits the database meanwhile: a count over the
			// tracer's is tried once more, one under it never is.
			for try := 0; ; try++ {
				s0 := serverXacts()
				before := c.Counts()
				if err := tc.run(); err != nil {
					t.Fatal(err)
				}
				got := c.Counts().Sub(before)
				server := serverXacts() - s0
				g := got
				g.Prepares, g.IdlePrepares, g.Connects = 0, 0, 0
				if want := (SQLCounts{Statements: tc.stmts, Control: tc.ctl, Transactions: tc.txs, Pings: tc.png}); g != want {
					t.Fatalf("counted %+v, want %+v", g, want)
				}
				counted := got.Transactions + got.Pings + got.IdlePrepares + got.Connects + 1 // and the flush request
				if server == counted || server < counted || try == 1 {
					if server != counted {
						t.Errorf("pg_stat_database counted %d transactions; the tracer %d, %d ping(s) and %d preparation(s) outside one, and 1 flush request",
							server, got.Transactions, got.Pings, got.IdlePrepares)
					}
					break
				}
			}
		})
	}
}

func TestKind(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want byte
	}{
		{"begin", 'b'}, {"BEGIN ISOLATION LEVEL SERIALIZABLE", 'b'}, {"start transaction", 'b'},
		{"commit", 'c'}, {" ROLLBACK", 'c'}, {"savepoint sp", 'c'}, {"release savepoint sp", 'c'}, {"end", 'c'},
		{"SELECT 1", 's'}, {"-- a comment\nINSERT INTO t VALUES (1)", 's'}, {"WITH x AS (SELECT 1) SELECT * FROM x", 's'},
		{"committed_at", 's'}, {"", 's'},
	} {
		if got := kind(tc.sql); got != tc.want {
			t.Errorf("kind(%q) = %c, want %c", tc.sql, got, tc.want)
		}
	}
}
