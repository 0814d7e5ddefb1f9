// Package store opens the bridge's Postgres database and applies its
// migrations.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/vgpu-bridge/vgpu-bridge/migrations"
)

// Config configures the connection pool.
type Config struct {
	URL             string // postgres://user@host:5432/db?sslmode=...
	MaxConns        int32
	ConnectTimeout  time.Duration
	MaxConnLifetime time.Duration
	// Tracer, when set, sees every statement of the pool's connections
	// (benchmarks and tests count them).
	Tracer pgx.QueryTracer
}

// Open returns a pool; it does not wait for the database to answer.
func Open(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("database connection URL: %w", redact(err))
	}
	if cfg.MaxConns > 0 {
		pc.MaxConns = cfg.MaxConns
	}
	if cfg.ConnectTimeout > 0 {
		pc.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	}
	if cfg.MaxConnLifetime > 0 {
		pc.MaxConnLifetime = cfg.MaxConnLifetime
	}
	if cfg.Tracer != nil {
		pc.ConnConfig.Tracer = cfg.Tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	return pool, nil
}

func redact(err error) error {
	// pgx's parse errors can quote the connection string; keep only the
	// kind of problem so a password never reaches a log.
	return errors.New("cannot parse (check the URL's form: postgres://user:pass@host:5432/db)")
}

// MigrationStatus is one migration and whether it is applied.
type MigrationStatus struct {
	Version   int64
	Name      string
	AppliedAt time.Time
	Applied   bool
}

func provider(pool *pgxpool.Pool, log *slog.Logger) (*goose.Provider, *sql.DB, error) {
	db := stdlib.OpenDBFromPool(pool)
	sub, err := fs.Sub(migrations.FS, ".")
	if err != nil {
		return nil, nil, err
	}
	opts := []goose.ProviderOption{}
	if log != nil {
		opts = append(opts, goose.WithSlog(log))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, opts...)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("migrations: %w", err)
	}
	return p, db, nil
}

// Migrate applies every pending migration, holding a session advisory lock
// so concurrent replicas do not race. It returns the versions applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) ([]int64, error) {
	return MigrateTo(ctx, pool, 0, log)
}

// MigrateTo is Migrate up to and including version (0: every one); the
// upgrade tests use it to stand a database at an earlier release's schema.
func MigrateTo(ctx context.Context, pool *pgxpool.Pool, version int64, log *slog.Logger) ([]int64, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	defer conn.Release()
	const lockID = 0x76677075 // "vgpu"
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockID); err != nil {
		return nil, fmt.Errorf("migrate: lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockID) //nolint:errcheck
	p, db, err := provider(pool, nil)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var res []*goose.MigrationResult
	if version > 0 {
		res, err = p.UpTo(ctx, version)
	} else {
		res, err = p.Up(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	var applied []int64
	for _, r := range res {
		applied = append(applied, r.Source.Version)
		if log != nil {
			log.Info("migration applied", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
		}
	}
	return applied, nil
}

// Status lists every known migration and whether it is applied.
func Status(ctx context.Context, pool *pgxpool.Pool) ([]MigrationStatus, error) {
	p, db, err := provider(pool, nil)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	out := make([]MigrationStatus, len(st))
	for i, s := range st {
		out[i] = MigrationStatus{Version: s.Source.Version, Name: s.Source.Path,
			AppliedAt: s.AppliedAt, Applied: s.State == goose.StateApplied}
	}
	return out, nil
}

// Pending reports how many migrations are not yet applied.
func Pending(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	st, err := Status(ctx, pool)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range st {
		if !s.Applied {
			n++
		}
	}
	return n, nil
}

// TryLock takes the session advisory lock named key (hashed as
// hashtextextended(key, 0), the form transaction locks of the same name
// use) on conn. It reports false when another session holds it. release
// gives the lock back; should that fail, it closes the connection rather
// than hand one that may still hold the lock back to the pool.
func TryLock(ctx context.Context, conn *pgxpool.Conn, key string) (release func(), ok bool, err error) {
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, key).Scan(&ok); err != nil || !ok {
		return func() {}, false, err
	}
	return Unlocker(ctx, conn, key), true, nil
}

// Unlocker is TryLock's release of the session advisory lock named key,
// for a lock conn took otherwise (pg_try_advisory_lock in a statement
// of its own, LockKey).
func Unlocker(ctx context.Context, conn *pgxpool.Conn, key string) func() {
	return func() {
		ctx := context.WithoutCancel(ctx)
		var unlocked bool
		if err := conn.QueryRow(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, key).Scan(&unlocked); err != nil || !unlocked {
			conn.Hijack().Close(ctx) //nolint:errcheck
		}
	}
}
