// Package benchkit holds what the load harnesses under tests/bench share:
// a scratch database on the test Postgres, the CPU time of this process,
// of other processes and of a database's Postgres backends, and a count
// of the statements and transactions a pool sends (SQLCount).
package benchkit

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
)

// AdminURL is the test Postgres to make scratch databases on:
// VGPU_TEST_POSTGRES_URL, or the local one.
func AdminURL() string {
	if u := os.Getenv("VGPU_TEST_POSTGRES_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// ScratchDB creates an empty database named vgpu_bench_<prefix><random>
// on admin's server and returns its URL (admin's, with the database
// name replaced) and a func that drops it.
func ScratchDB(ctx context.Context, admin, prefix string) (string, func(), error) {
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", nil, fmt.Errorf("postgres at %s: %w (start it with `make services`)", admin, err)
	}
	defer c.Close(ctx)
	b := make([]byte, 6)
	rand.Read(b)
	name := "vgpu_bench_" + prefix + hex.EncodeToString(b)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, err
	}
	drop := func() {
		c, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") //nolint:errcheck
	}
	base, query, _ := strings.Cut(admin, "?")
	u := base[:strings.LastIndex(base, "/")+1] + name
	if query != "" {
		u += "?" + query
	}
	return u, drop, nil
}

// MigratedDB is ScratchDB with the bridge's migrations applied and a pool
// of maxConns connections on it (0: the store's default). done closes the
// pool and drops the database.
func MigratedDB(ctx context.Context, admin, prefix string, maxConns int32) (url string, pool *pgxpool.Pool, done func(), err error) {
	url, drop, err := ScratchDB(ctx, admin, prefix)
	if err != nil {
		return "", nil, nil, err
	}
	pool, err = store.Open(ctx, store.Config{URL: url, MaxConns: maxConns})
	if err != nil {
		drop()
		return "", nil, nil, err
	}
	done = func() {
		pool.Close()
		drop()
	}
	if _, err := store.Migrate(ctx, pool, nil); err != nil {
		done()
		return "", nil, nil, err
	}
	return url, pool, done, nil
}

// ProcessCPU is the CPU time this process used so far.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BackendCPU is the CPU time the Postgres backends serving pool's
// database used so far (read from /proc: Postgres runs on this machine).
func BackendCPU(ctx context.Context, pool *pgxpool.Pool) time.Duration {
	return backendCPU(ctx, pool, "SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
}

// backendCPU is the CPU time of the backends whose pids query returns.
func backendCPU(ctx context.Context, pool *pgxpool.Pool, query string, args ...any) time.Duration {
	rows, err := pool.Query(ctx, query, args...)
	if err != nil {
		return 0
	}
	defer rows.Close()
	var cpu time.Duration
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) != nil {
			return 0
		}
		cpu += procCPU(strconv.Itoa(pid))
	}
	return cpu
}

// Median is the median of get over runs (the upper one of an even count).
func Median[T any](runs []T, get func(T) float64) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = get(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// ProcsCPU is the CPU time used so far by the processes of this machine
// whose command line (arguments joined by spaces) match accepts: other
// services measured beside the bridge, e.g. Placement's uwsgi and its
// Postgres backends.
func ProcsCPU(match func(cmdline string) bool) time.Duration {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var cpu time.Duration
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !match(string(bytes.ReplaceAll(cl, []byte{0}, []byte{' '}))) {
			continue
		}
		cpu += procCPU(e.Name())
	}
	return cpu
}

// PidCPU is the CPU time process pid used so far (0 when it is gone).
func PidCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	return procCPU(strconv.Itoa(pid))
}

// procCPU is the CPU time process pid used so far (0 when it is gone):
// the sum of its threads' run time in /proc/PID/task/*/schedstat, in
// nanoseconds (a thread that ended is no longer counted), else, without
// schedstat, its user and system time in clock ticks (10 ms).
func procCPU(pid string) time.Duration {
	tasks, err := os.ReadDir("/proc/" + pid + "/task")
	if err == nil {
		var ns int64
		ok := false
		for _, t := range tasks {
			b, err := os.ReadFile("/proc/" + pid + "/task/" + t.Name() + "/schedstat")
			if err != nil {
				continue
			}
			f := strings.Fields(string(b))
			if len(f) == 0 {
				continue
			}
			if v, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				ns += v
				ok = true
			}
		}
		if ok {
			return time.Duration(ns)
		}
	}
	return time.Duration(procTicks(pid)) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// procTicks is the user and system CPU time of process pid so far, in
// clock ticks (0 when it is gone).
func procTicks(pid string) int64 {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	// Fields after "(comm)": utime and stime are the 12th and 13th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) <= 12 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return ut + st
}
