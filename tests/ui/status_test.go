package ui

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/ui"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestStatusFigures checks each figure of GET /v1/status against rows
// written straight into a migrated database, where nothing processes them
// (the dashboard test sees them only after the pipeline has run).
func TestStatusFigures(t *testing.T) {
	ctx := context.Background()
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		testsvc.Must(t, err, sql)
	}
	h := ui.New(ui.Config{Pool: pool, StaleReportAge: 5 * time.Minute, Version: "test"})

	empty, err := h.Status(ctx)
	testsvc.Must(t, err, "status of an empty database")
	in := empty.Ingest
	if in.LastNotificationAt != nil || in.LastEventAt != nil || in.PendingEvents != 0 || in.OldestPendingAt != nil ||
		in.ProcessingLagSeconds != nil || in.DeadLetters24h != 0 || len(empty.Hosts) != 0 || empty.Version != "test" {
		t.Fatalf("status of an empty database = %+v", empty)
	}

	start := time.Now()
	// Inbox: Nova notifications (received 30 s and 20 s ago, emitted 0.5 s
	// before), processed 1, 2 and 3 s after arrival; a newer webhook event;
	// two pending events, the older received 40 s ago.
	exec(`INSERT INTO events (source, message_id, event_type, occurred_at, received_at, processed_at, payload) VALUES
		('nova', 'n1', 'instance.create.end', now() - interval '30.5 s', now() - interval '30 s', now() - interval '29 s', '{}'),
		('nova', 'n2', 'instance.create.end', now() - interval '20.5 s', now() - interval '20 s', now() - interval '18 s', '{}'),
		('webhook:lab', 'w1', 'GPU_REQUEST', now() - interval '10 s', now() - interval '10 s', now() - interval '7 s', '{}'),
		('webhook:lab', 'w2', 'GPU_REQUEST', now() - interval '40 s', now() - interval '40 s', NULL, '{}'),
		('webhook:lab', 'w3', 'GPU_REQUEST', now() - interval '5 s', now() - interval '5 s', NULL, '{}')`)
	exec(`INSERT INTO dead_letters (source, reason, received_at) VALUES
		('nova', 'not_json', now() - interval '1 h'), ('nova', 'schema', now() - interval '25 h')`)
	// Hosts: one fresh report with an error and GPUs out of order, one
	// report older than stale_report_age, one host never reported.
	exec(`INSERT INTO hosts (name, node, agent_version, driver_version, last_report_at, report_errors, report) VALUES
		('cn1', 'cn1.example.org', '1.0', '550.54.16', now() - interval '10 s', '["nvml: unavailable"]',
		 '{"gpus": [{"pci": "0000:d8:00.0", "health": "degraded", "util_percent": 12.5, "types": [], "active": []},
		            {"pci": "0000:3b:00.0", "name": "Tesla T4", "health": "ok", "temperature_c": 51, "types": [], "active": []}]}'),
		('cn2', 'cn2.example.org', '1.0', NULL, now() - interval '10 min', NULL, '{"gpus": []}'),
		('cn3', NULL, NULL, NULL, NULL, NULL, NULL)`)

	st, err := h.Status(ctx)
	testsvc.Must(t, err, "status")
	elapsed := time.Since(start).Seconds()
	in = st.Ingest
	approx := func(name string, got *float64, want float64) {
		t.Helper()
		// The rows are written relative to now() of their statement and
		// read in a later one: ages grow by at most the time in between.
		if got == nil || *got < want-0.001 || *got > want+elapsed+0.001 {
			t.Errorf("%s = %v, want %v plus at most %.3f s", name, deref(got), want, elapsed)
		}
	}
	approx("notification_age_seconds", in.NotificationAgeSeconds, 20)
	approx("event_age_seconds", in.EventAgeSeconds, 5)
	approx("oldest_pending_age_seconds", in.OldestPendingAgeSeconds, 40)
	if in.NotificationDelaySeconds == nil || *in.NotificationDelaySeconds != 0.5 {
		t.Errorf("notification_delay_seconds = %v, want 0.5", deref(in.NotificationDelaySeconds))
	}
	if in.ProcessingLagSeconds == nil || *in.ProcessingLagSeconds != 2 { // median of 1, 2, 3
		t.Errorf("processing_lag_seconds = %v, want 2", deref(in.ProcessingLagSeconds))
	}
	if in.PendingEvents != 2 || in.DeadLetters24h != 1 {
		t.Errorf("pending_events = %d (want 2), dead_letters_24h = %d (want 1)", in.PendingEvents, in.DeadLetters24h)
	}

	if len(st.Hosts) != 3 {
		t.Fatalf("hosts = %+v, want cn1, cn2, cn3", st.Hosts)
	}
	cn1, cn2, cn3 := st.Hosts[0], st.Hosts[1], st.Hosts[2]
	var gpus []string
	for _, g := range cn1.GPUs {
		gpus = append(gpus, g.PCI+" "+g.Health)
	}
	if cn1.Name != "cn1" || cn1.Node != "cn1.example.org" || cn1.Stale || cn1.DriverVersion != "550.54.16" ||
		strings.Join(cn1.Errors, ";") != "nvml: unavailable" || strings.Join(gpus, ", ") != "0000:3b:00.0 ok, 0000:d8:00.0 degraded" ||
		cn1.GPUs[0].TemperatureC == nil || *cn1.GPUs[0].TemperatureC != 51 || cn1.GPUs[1].UtilPercent == nil || *cn1.GPUs[1].UtilPercent != 12.5 {
		t.Errorf("cn1 = %+v", cn1)
	}
	approx("cn1 report_age_seconds", cn1.ReportAgeSeconds, 10)
	if cn2.Name != "cn2" || !cn2.Stale || len(cn2.Errors) != 0 || len(cn2.GPUs) != 0 {
		t.Errorf("cn2 (report 10 min old, stale after 5) = %+v", cn2)
	}
	if cn3.Name != "cn3" || cn3.Stale || cn3.LastReportAt != nil || cn3.ReportAgeSeconds != nil || cn3.Errors == nil || cn3.GPUs == nil {
		t.Errorf("cn3 (never reported) = %+v; want no report time, not stale, empty lists", cn3)
	}
}

func deref(f *float64) any {
	if f == nil {
		return nil
	}
	return *f
}

// BenchmarkStatus measures GET /v1/status's queries on a large inbox:
// 200,000 events (1,000 pending, every tenth from Nova), 1,000 dead
// letters and 1,000 hosts with a report of 8 GPUs each.
func BenchmarkStatus(b *testing.B) {
	ctx := context.Background()
	pool := testsvc.Pool(b, testsvc.MigratedPostgres(b))
	for _, sql := range []string{
		`INSERT INTO events (source, message_id, event_type, occurred_at, received_at, processed_at, payload)
			SELECT CASE WHEN i % 10 = 0 THEN 'nova' ELSE 'webhook:lab' END, 'm' || i, 'x',
				now() - (200000 - i) * interval '10 ms', now() - (200000 - i) * interval '10 ms',
				CASE WHEN i > 199000 THEN NULL ELSE now() - (200000 - i) * interval '10 ms' + interval '50 ms' END, '{}'
			FROM generate_series(1, 200000) i`,
		`INSERT INTO dead_letters (source, reason, received_at) SELECT 'nova', 'schema', now() - i * interval '1 min' FROM generate_series(1, 1000) i`,
		`INSERT INTO hosts (name, node, agent_version, last_report_at, report)
			SELECT 'cn' || i, 'cn' || i || '.example.org', '1.0', now() - (i % 600) * interval '1 s',
				jsonb_build_object('gpus', (SELECT jsonb_agg(jsonb_build_object('pci', '0000:' || to_hex(16 + g) || ':00.0', 'health', 'ok',
					'util_percent', g * 10, 'types', '[{"id": "nvidia-232", "name": "GRID T4-4Q", "max_instances": 4, "available_instances": 4}]'::jsonb,
					'active', '[]'::jsonb)) FROM generate_series(1, 8) g))
			FROM generate_series(1, 1000) i`,
		`ANALYZE events; ANALYZE hosts; ANALYZE dead_letters`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	h := ui.New(ui.Config{Pool: pool, StaleReportAge: 5 * time.Minute})
	b.ResetTimer()
	for b.Loop() {
		st, err := h.Status(ctx)
		if err != nil || st.Ingest.PendingEvents != 1000 || len(st.Hosts) != 1000 {
			b.Fatalf("status: %v, %d pending, %d hosts", err, st.Ingest.PendingEvents, len(st.Hosts))
		}
	}
}
