package controls_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestPurge: rows older than the retention ages go, in batches, with
// their dependants; recent rows, unprocessed events and requests still in
// flight stay.
func TestPurge(t *testing.T) {
	ctx := context.Background()
	url := testsvc.MigratedPostgres(t)
	pool := testsvc.Pool(t, url)
	exec := func(q string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, q, args...)
		testsvc.Must(t, err, q)
	}
	old := time.Now().Add(-40 * 24 * time.Hour)
	// Events: 3 old processed (gone), 1 old unprocessed (stays), 1 new.
	for i, e := range []struct {
		at        time.Time
		processed bool
	}{{old, true}, {old, true}, {old, true}, {old, false}, {time.Now(), true}} {
		var processed *time.Time
		if e.processed {
			processed = &e.at
		}
		exec(`INSERT INTO events (source, message_id, event_type, payload, received_at, processed_at) VALUES ('nova', $1, 'x', '{}', $2, $3)`,
			"m-"+string(rune('a'+i)), e.at, processed)
	}
	exec(`INSERT INTO decisions (event_id, decision) SELECT id, '{}' FROM events`)
	// Dead letters and audit rows: 3 old, 1 new each.
	for _, at := range []time.Time{old, old, old, time.Now()} {
		exec(`INSERT INTO dead_letters (source, reason, received_at) VALUES ('nova', 'not_json', $1)`, at)
		exec(`INSERT INTO audit_log (actor, action, object_type, object_id, at) VALUES ('t', 'x', 'y', 'z', $1)`, at)
	}
	// Requests: old final with a command and a decision (gone), old final
	// with an unanswered command (stays), old still dispatched (stays),
	// new final (stays).
	reqs := map[string]uuid.UUID{"old": uuid.New(), "unanswered": uuid.New(), "open": uuid.New(), "new": uuid.New()}
	for k, id := range reqs {
		state, finished := "succeeded", &old
		switch k {
		case "open":
			state, finished = "dispatched", nil
		case "new":
			now := time.Now()
			finished = &now
		}
		exec(`INSERT INTO requests (id, source, kind, state, finished_at) VALUES ($1, 'webhook:t', 'GPU_REQUEST', $2, $3)`, id, state, finished)
	}
	exec(`INSERT INTO commands (id, request_id, host, kind, body, finished_at) VALUES ($1, $2, 'h', 'create_mdev', '{}', now())`, uuid.New(), reqs["old"])
	exec(`INSERT INTO commands (id, request_id, host, kind, body) VALUES ($1, $2, 'h', 'create_mdev', '{}')`, uuid.New(), reqs["unanswered"])
	exec(`INSERT INTO decisions (event_id, request_id, decision) VALUES (-1, $1, '{}')`, reqs["old"])
	// Diagnostics bundles: 2 old (gone with their collect_diagnostics
	// commands, which have no request), 1 new.
	for _, at := range []time.Time{old, old, time.Now()} {
		cmd := uuid.New()
		exec(`INSERT INTO commands (id, host, kind, body, finished_at) VALUES ($1, 'h', 'collect_diagnostics', '{}', $2)`, cmd, at)
		exec(`INSERT INTO diagnostics (id, command_id, host, requested_by, requested_at, expires_at, status, bundle)
			VALUES ($1, $2, 'h', 'ops', $3, $3, 'complete', '\x1f8b')`, uuid.New(), cmd, at)
	}

	reg := prometheus.NewRegistry()
	st := controls.NewStore(pool, reg, nil)
	r := controls.Retention{Events: 720 * time.Hour, DeadLetters: 720 * time.Hour, Requests: 720 * time.Hour, Audit: 720 * time.Hour,
		Diagnostics: 720 * time.Hour, BatchSize: 2}
	purge := func(dry bool) controls.Purged {
		t.Helper()
		p, err := st.Purge(ctx, r, dry)
		testsvc.Must(t, err, "purge")
		return p
	}
	dry := purge(true)
	want := controls.Purged{"events": 3, "dead_letters": 3, "requests": 1, "audit_log": 3, "diagnostics": 2}
	for k, n := range want {
		if dry[k] != n {
			t.Errorf("dry run: %s %d, want %d (%v)", k, dry[k], n, dry)
		}
	}
	count := func(q string, args ...any) int {
		var n int
		testsvc.Must(t, pool.QueryRow(ctx, q, args...).Scan(&n), q)
		return n
	}
	if n := count(`SELECT count(*) FROM events`); n != 5 {
		t.Fatalf("the dry run deleted: %d events left", n)
	}
	got := purge(false)
	for k, n := range want {
		if got[k] != n {
			t.Errorf("purge: %s %d, want %d (%v)", k, got[k], n, got)
		}
	}
	for q, n := range map[string]int{
		`SELECT count(*) FROM events`:                                 2, // the unprocessed old one and the new one
		`SELECT count(*) FROM events WHERE processed_at IS NULL`:      1,
		`SELECT count(*) FROM dead_letters`:                           1,
		`SELECT count(*) FROM audit_log WHERE actor = 't'`:            1,
		`SELECT count(*) FROM requests`:                               3,
		`SELECT count(*) FROM commands`:                               2, // the unanswered one and the new diagnostics' one
		`SELECT count(*) FROM diagnostics`:                            1,
		`SELECT count(*) FROM decisions WHERE request_id IS NULL`:     2,
		`SELECT count(*) FROM decisions WHERE request_id IS NOT NULL`: 0,
	} {
		if got := count(q); got != n {
			t.Errorf("%s = %d, want %d", q, got, n)
		}
	}
	if n := count(`SELECT count(*) FROM requests WHERE id = $1`, reqs["old"]); n != 0 {
		t.Errorf("the old final request is still there")
	}
	if v := counter(t, reg, "vgpu_bridge_purged_rows_total", "events"); v != 3 {
		t.Errorf("vgpu_bridge_purged_rows_total{table=events} = %v, want 3", v)
	}
	// Nothing more to purge.
	if again := purge(false); again.Total() != 0 {
		t.Errorf("second purge deleted %v", again)
	}
}

// counter reads a counter of reg with label table.
func counter(t *testing.T, reg *prometheus.Registry, name, table string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	testsvc.Must(t, err, "gather")
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "table" && l.GetValue() == table {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("%s{table=%q} not gathered", name, table)
	return 0
}
