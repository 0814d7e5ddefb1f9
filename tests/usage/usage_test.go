// Package usage_test checks the accounting's verbs, report and audit
// periods, and the relay of the bridge's own notifications, against the
// real Postgres and RabbitMQ.
package usage_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/usage"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

func db(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return testsvc.Pool(t, testsvc.MigratedPostgres(t))
}

func inTx(t *testing.T, pool *pgxpool.Pool, fn func(tx pgx.Tx) error) {
	t.Helper()
	if err := pgx.BeginFunc(context.Background(), pool, fn); err != nil {
		t.Fatal(err)
	}
}

type interval struct {
	host, profile string
	amount        int
	start         time.Time
	end           *time.Time
}

func flavorIntervals(t *testing.T, pool *pgxpool.Pool, inst string) []interval {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT host, profile, amount, started_at, ended_at FROM vgpu_usage
		WHERE instance_uuid = $1 AND path = 'flavor' ORDER BY started_at, id`, inst)
	if err != nil {
		t.Fatal(err)
	}
	var out []interval
	var iv interval
	if _, err := pgx.ForEachRow(rows, []any{&iv.host, &iv.profile, &iv.amount, &iv.start, &iv.end}, func() error {
		out = append(out, iv)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// The flavor path's intervals follow what each event says, at the event's
// time: a change ends one and begins the next, a repeat changes nothing,
// an older event delivered late is ignored, and nothing held ends all.
func TestSyncFlavorUsage(t *testing.T) {
	pool := db(t)
	ctx := context.Background()
	inst := uuid.NewString()
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	t4 := []requests.FlavorVGPU{{Profile: "T4-4Q", VGPUType: "nvidia-232", ResourceClass: "VGPU", Amount: 1}}
	t8 := []requests.FlavorVGPU{{Profile: "T4-8Q", VGPUType: "nvidia-234", ResourceClass: "VGPU", Amount: 1}}
	h := func(host string, v []requests.FlavorVGPU) requests.FlavorHolding {
		return requests.FlavorHolding{Instance: inst, Project: "p1", User: "u1", Host: host, Flavor: "g1", VGPUs: v}
	}
	steps := []struct {
		name    string
		h       requests.FlavorHolding
		at      time.Time
		changed bool
	}{
		{"launch", h("cmp1", t4), t0, true},
		{"same state again", h("cmp1", t4), t0.Add(time.Minute), false},
		{"resized to another profile", h("cmp1", t8), t0.Add(10 * time.Minute), true},
		{"an older event delivered late", h("cmp1", t4), t0.Add(5 * time.Minute), false},
		{"moved", h("cmp2", t8), t0.Add(20 * time.Minute), true},
		{"deleted", h("cmp2", nil), t0.Add(30 * time.Minute), true},
		{"deleted again", h("", nil), t0.Add(31 * time.Minute), false},
	}
	for _, s := range steps {
		inTx(t, pool, func(tx pgx.Tx) error {
			changed, err := requests.SyncFlavorUsage(ctx, tx, s.h, s.at)
			if err == nil && changed != s.changed {
				t.Errorf("%s: changed = %v, want %v", s.name, changed, s.changed)
			}
			return err
		})
	}
	got := flavorIntervals(t, pool, inst)
	want := []struct {
		host, profile string
		from, to      time.Duration
	}{{"cmp1", "T4-4Q", 0, 10 * time.Minute}, {"cmp1", "T4-8Q", 10 * time.Minute, 20 * time.Minute}, {"cmp2", "T4-8Q", 20 * time.Minute, 30 * time.Minute}}
	if len(got) != len(want) {
		t.Fatalf("intervals = %+v, want %d", got, len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.host != w.host || g.profile != w.profile || !g.start.Equal(t0.Add(w.from)) || g.end == nil || !g.end.Equal(t0.Add(w.to)) {
			t.Errorf("interval %d = %s %s %s–%v, want %s %s %s–%s", i, g.host, g.profile, g.start, g.end, w.host, w.profile, t0.Add(w.from), t0.Add(w.to))
		}
	}
}

// A delete ends the open intervals whatever its time: stamped before they
// began (a host's clock behind), it ends them where they began, never
// before; an older event that is not a delete still changes nothing.
func TestSyncFlavorUsageDeleteStampedEarly(t *testing.T) {
	pool := db(t)
	ctx := context.Background()
	inst := uuid.NewString()
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	t4 := []requests.FlavorVGPU{{Profile: "T4-4Q", VGPUType: "nvidia-232", ResourceClass: "VGPU", Amount: 1}}
	for _, s := range []struct {
		name    string
		h       requests.FlavorHolding
		at      time.Time
		changed bool
	}{
		{"launch", requests.FlavorHolding{Instance: inst, Host: "cmp1", Flavor: "g1", VGPUs: t4}, t0, true},
		{"an older event without vGPUs", requests.FlavorHolding{Instance: inst, Host: "cmp1", Flavor: "g1"}, t0.Add(-time.Minute), false},
		{"deleted, stamped an hour early", requests.FlavorHolding{Instance: inst, Host: "cmp1", Flavor: "g1", Deleted: true}, t0.Add(-time.Hour), true},
		{"deleted again", requests.FlavorHolding{Instance: inst, Deleted: true}, t0.Add(time.Hour), false},
	} {
		inTx(t, pool, func(tx pgx.Tx) error {
			changed, err := requests.SyncFlavorUsage(ctx, tx, s.h, s.at)
			if err == nil && changed != s.changed {
				t.Errorf("%s: changed = %v, want %v", s.name, changed, s.changed)
			}
			return err
		})
	}
	got := flavorIntervals(t, pool, inst)
	if len(got) != 1 || !got[0].start.Equal(t0) || got[0].end == nil || !got[0].end.Equal(t0) {
		t.Fatalf("intervals = %+v; want one from and to %v", got, t0)
	}
}

// seedAttachment records a request created at created and its pending
// attachment, as the pipeline does before the agent answers.
func seedAttachment(t *testing.T, pool *pgxpool.Pool, inst string, created time.Time) (reqID, attID uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	reqID, attID = uuid.New(), uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO instances (uuid, project_id, user_id, host, vm_state) VALUES ($1, 'p1', 'u1', 'cmp1', 'active')
		ON CONFLICT DO NOTHING`, inst); err != nil {
		t.Fatal(err)
	}
	iu := uuid.MustParse(inst)
	inTx(t, pool, func(tx pgx.Tx) error {
		s := requests.NewStore(pool, "test")
		if err := s.Create(ctx, tx, requests.Request{ID: reqID, Source: "operator", Kind: "GPU_REQUEST", InstanceUUID: &iu}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE requests SET created_at = $2 WHERE id = $1`, reqID, created); err != nil {
			return err
		}
		return requests.AddAttachments(ctx, tx, reqID, []flow.Attachment{{ID: attID, InstanceUUID: inst, Host: "cmp1", Class: "VGPU",
			Amount: 1, Profile: "T4-4Q", TypeID: "nvidia-232", Mode: "live", Provider: uuid.NewString()}})
	})
	return reqID, attID
}

func directInterval(t *testing.T, pool *pgxpool.Pool, att uuid.UUID) (start time.Time, end *time.Time, n int) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT count(*) OVER (), started_at, ended_at FROM vgpu_usage WHERE attachment_id = $1`, att).
		Scan(&n, &start, &end)
	if errors.Is(err, pgx.ErrNoRows) {
		return start, nil, 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return start, end, n
}

// A direct-path vGPU counts from the agent's time of its attach to the
// agent's time of its release, kept within the request's life: a host
// clock behind or ahead moves nothing outside it. A rolled-back attach
// accounts nothing; a second MarkAttached opens nothing more.
func TestDirectUsage(t *testing.T) {
	pool := db(t)
	ctx := context.Background()
	inst := uuid.NewString()

	t.Run("agent time", func(t *testing.T) {
		created := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
		req, att := seedAttachment(t, pool, inst, created)
		agent := created.Add(20 * time.Second)
		inTx(t, pool, func(tx pgx.Tx) error { _, err := requests.MarkAttached(ctx, tx, req, agent); return err })
		inTx(t, pool, func(tx pgx.Tx) error { _, err := requests.MarkAttached(ctx, tx, req, agent); return err })
		start, end, n := directInterval(t, pool, att)
		if n != 1 || !start.Equal(agent) || end != nil {
			t.Fatalf("after attach: %d rows, start %s (want %s), end %v", n, start, agent, end)
		}
		rel := agent.Add(30 * time.Second)
		inTx(t, pool, func(tx pgx.Tx) error { return requests.MarkReleased(ctx, tx, att, rel) })
		if _, end, _ := directInterval(t, pool, att); end == nil || !end.Equal(rel) {
			t.Fatalf("after release: end %v, want %s", end, rel)
		}
	})
	t.Run("clock behind and ahead", func(t *testing.T) {
		created := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
		req, att := seedAttachment(t, pool, inst, created)
		inTx(t, pool, func(tx pgx.Tx) error {
			_, err := requests.MarkAttached(ctx, tx, req, created.Add(-time.Hour))
			return err
		})
		start, _, _ := directInterval(t, pool, att)
		if !start.Equal(created) {
			t.Errorf("an agent time before the request: start %s, want the request's creation %s", start, created)
		}
		before := time.Now()
		inTx(t, pool, func(tx pgx.Tx) error { return requests.MarkReleased(ctx, tx, att, time.Now().Add(time.Hour)) })
		if _, end, _ := directInterval(t, pool, att); end == nil || end.Before(before.Add(-time.Second)) || end.After(time.Now().Add(time.Second)) {
			t.Errorf("an agent time in the future: end %v, want about now", end)
		}
	})
	t.Run("rolled back", func(t *testing.T) {
		req, att := seedAttachment(t, pool, inst, time.Now())
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := requests.MarkAttached(ctx, tx, req, time.Now()); err != nil {
				return err
			}
			return errors.New("roll back")
		})
		if err == nil {
			t.Fatal("the transaction committed")
		}
		if _, _, n := directInterval(t, pool, att); n != 0 {
			t.Errorf("a rolled-back attach left %d usage rows", n)
		}
	})
	t.Run("failed while pending", func(t *testing.T) {
		_, att := seedAttachment(t, pool, inst, time.Now())
		inTx(t, pool, func(tx pgx.Tx) error { return requests.MarkFailed(ctx, tx, att, "agent refused") })
		if _, _, n := directInterval(t, pool, att); n != 0 {
			t.Errorf("an attach that never succeeded accounted %d rows", n)
		}
	})
	t.Run("stale release", func(t *testing.T) {
		req, att := seedAttachment(t, pool, inst, time.Now().Add(-time.Minute))
		inTx(t, pool, func(tx pgx.Tx) error { _, err := requests.MarkAttached(ctx, tx, req, time.Time{}); return err })
		inTx(t, pool, func(tx pgx.Tx) error { return requests.ReleaseStale(ctx, tx, []string{att.String()}, "gone") })
		if _, end, n := directInterval(t, pool, att); n != 1 || end == nil {
			t.Errorf("the drift reconciler's release did not end the usage (%d rows, end %v)", n, end)
		}
	})
}

func seedUsage(t *testing.T, pool *pgxpool.Pool, project, profile, inst string, amount int, start time.Time, end *time.Time) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO vgpu_usage (path, instance_uuid, project_id, host, profile, resource_class, amount, started_at, ended_at)
		VALUES ('flavor', $1, $2, 'cmp1', $3, 'VGPU', $4, $5, $6)`, inst, project, profile, amount, start, end); err != nil {
		t.Fatal(err)
	}
}

func ptr(t time.Time) *time.Time { return &t }

// The report clips each interval to the window, multiplies by its vGPUs,
// counts an open one up to now, and groups as asked.
func TestReport(t *testing.T) {
	pool := db(t)
	ctx := context.Background()
	w0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	a, b, c := uuid.NewString(), uuid.NewString(), uuid.NewString()
	seedUsage(t, pool, "p1", "T4-4Q", a, 1, w0.Add(-time.Hour), ptr(w0.Add(2*time.Hour)))    // 2h inside
	seedUsage(t, pool, "p1", "T4-8Q", a, 2, w0.Add(3*time.Hour), ptr(w0.Add(4*time.Hour)))   // 1h × 2
	seedUsage(t, pool, "p2", "T4-4Q", b, 1, w0.Add(23*time.Hour), nil)                       // open: 1h inside a 24h window
	seedUsage(t, pool, "p2", "T4-4Q", c, 1, w0.Add(25*time.Hour), ptr(w0.Add(26*time.Hour))) // outside
	now := time.Now()
	seedUsage(t, pool, "p3", "T4-4Q", c, 1, now.Add(-10*time.Second), nil) // open, recent

	api := &usage.API{Pool: pool, Period: mustPeriod(t, "day")}
	rep, err := api.Report(ctx, usage.Query{Start: w0, End: w0.Add(24 * time.Hour), GroupBy: []string{"project", "profile"}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[[2]string]int64{{"p1", "T4-4Q"}: 7200, {"p1", "T4-8Q"}: 7200, {"p2", "T4-4Q"}: 3600}
	if len(rep.Usage) != len(want) {
		t.Fatalf("usage = %+v", rep.Usage)
	}
	for _, r := range rep.Usage {
		if want[[2]string{r.ProjectID, r.Profile}] != r.VGPUSeconds {
			t.Errorf("%s %s = %d, want %d", r.ProjectID, r.Profile, r.VGPUSeconds, want[[2]string{r.ProjectID, r.Profile}])
		}
	}
	if rep.Total != 18000 {
		t.Errorf("total = %d, want 18000", rep.Total)
	}

	rep, err = api.Report(ctx, usage.Query{Start: now.Add(-time.Hour), End: now.Add(time.Hour), Project: "p3", GroupBy: []string{"instance"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Usage) != 1 || rep.Usage[0].VGPUSeconds < 9 || rep.Usage[0].VGPUSeconds > 12 || rep.Usage[0].InstanceUUID != c {
		t.Errorf("an open interval counts up to now: %+v", rep.Usage)
	}
}

func mustPeriod(t *testing.T, s string) usage.Period {
	t.Helper()
	p, err := usage.ParsePeriod(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Audit periods close in order once ended, each once, freezing each
// interval's seconds within it, with one vgpu.exists per interval.
func TestCloser(t *testing.T) {
	pool := db(t)
	ctx := context.Background()
	h0 := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	a, b := uuid.NewString(), uuid.NewString()
	seedUsage(t, pool, "p1", "T4-4Q", a, 1, h0.Add(30*time.Minute), ptr(h0.Add(90*time.Minute)))
	seedUsage(t, pool, "p2", "T4-8Q", b, 2, h0.Add(75*time.Minute), nil)

	c := &usage.Closer{Pool: pool, Period: mustPeriod(t, "hour"), Exists: true, Replica: "test", Delay: 5 * time.Minute}
	if n, err := c.CloseDue(ctx, h0.Add(64*time.Minute)); err != nil || n != 0 {
		t.Fatalf("CloseDue within the delay = %d, %v; want 0", n, err)
	}
	now := h0.Add(125 * time.Minute) // 10:05: 08:00–09:00 and 09:00–10:00 have ended, and the delay with them
	n, err := c.CloseDue(ctx, now)
	if err != nil || n != 2 {
		t.Fatalf("CloseDue = %d, %v; want 2 periods", n, err)
	}
	if n, err := c.CloseDue(ctx, now); err != nil || n != 0 {
		t.Fatalf("CloseDue again = %d, %v; want 0", n, err)
	}
	rows, err := pool.Query(ctx, `SELECT period_start, instance_uuid::text, seconds, amount FROM vgpu_usage_exists ORDER BY period_start, instance_uuid`)
	if err != nil {
		t.Fatal(err)
	}
	type ex struct {
		at     time.Time
		inst   string
		secs   int64
		amount int
	}
	var got []ex
	var e ex
	if _, err := pgx.ForEachRow(rows, []any{&e.at, &e.inst, &e.secs, &e.amount}, func() error { got = append(got, e); return nil }); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{h0.Format(time.RFC3339) + a: 1800, h0.Add(time.Hour).Format(time.RFC3339) + a: 1800,
		h0.Add(time.Hour).Format(time.RFC3339) + b: 2700}
	if len(got) != len(want) {
		t.Fatalf("exists rows = %+v", got)
	}
	for _, g := range got {
		if want[g.at.UTC().Format(time.RFC3339)+g.inst] != g.secs {
			t.Errorf("%s %s: %d s, want %d", g.at, g.inst, g.secs, want[g.at.UTC().Format(time.RFC3339)+g.inst])
		}
	}
	// One vgpu.exists per row, with the period and vGPU-seconds.
	nrows, err := pool.Query(ctx, `SELECT payload FROM bridge_notifications WHERE event_type = 'vgpu.exists' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	payloads, err := pgx.CollectRows(nrows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	if len(payloads) != 3 {
		t.Fatalf("%d vgpu.exists, want 3", len(payloads))
	}
	var last struct {
		Data struct {
			InstanceUUID string `json:"instance_uuid"`
			Seconds      int64  `json:"seconds"`
			VGPUSeconds  int64  `json:"vgpu_seconds"`
			Profile      string `json:"profile"`
			AuditPeriod  struct {
				Data map[string]string `json:"versioned_object.data"`
			} `json:"audit_period"`
		} `json:"versioned_object.data"`
	}
	if err := json.Unmarshal(payloads[2], &last); err != nil {
		t.Fatal(err)
	}
	if last.Data.InstanceUUID != b || last.Data.Seconds != 2700 || last.Data.VGPUSeconds != 5400 || last.Data.Profile != "T4-8Q" ||
		last.Data.AuditPeriod.Data["audit_period_beginning"] != "2026-12-05T09:00:00Z" ||
		last.Data.AuditPeriod.Data["audit_period_ending"] != "2026-12-05T10:00:00Z" {
		t.Errorf("last vgpu.exists = %s", payloads[2])
	}
	// Without exists notifications, periods still close.
	c.Exists = false
	if n, err := c.CloseDue(ctx, now.Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("CloseDue = %d, %v; want 1", n, err)
	}
	var count int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM bridge_notifications`).Scan(&count); err != nil || count != 3 {
		t.Errorf("%d notifications (%v), want still 3", count, err)
	}
}

// notify.Queue is part of its transaction: a rollback leaves nothing to
// send.
func TestQueueRollsBack(t *testing.T) {
	pool := db(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := notify.Queue(ctx, tx, notify.AttachStart, notify.Info, notify.Action(notify.ActionPayload{RequestID: "x"})); err != nil {
			return err
		}
		return errors.New("roll back")
	})
	if err == nil {
		t.Fatal("committed")
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM bridge_notifications`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d notifications after a rollback (%v)", n, err)
	}
}

// [retention] usage purges only intervals that ended within a closed
// audit period, and the closed periods before the cutoff.
func TestPurgeUsage(t *testing.T) {
	pool := db(t)
	ctx := context.Background()
	h0 := time.Date(2026, 1, 5, 8, 0, 0, 0, time.UTC)
	old, open, unclosed := uuid.NewString(), uuid.NewString(), uuid.NewString()
	seedUsage(t, pool, "p1", "T4-4Q", old, 1, h0, ptr(h0.Add(30*time.Minute)))
	seedUsage(t, pool, "p1", "T4-4Q", open, 1, h0, nil)
	c := &usage.Closer{Pool: pool, Period: mustPeriod(t, "hour"), Replica: "test"}
	if n, err := c.CloseDue(ctx, h0.Add(121*time.Minute)); err != nil || n != 2 {
		t.Fatalf("CloseDue = %d, %v", n, err)
	}
	// Ended before the cutoff, but after the last closed period.
	seedUsage(t, pool, "p1", "T4-4Q", unclosed, 1, h0.Add(130*time.Minute), ptr(h0.Add(140*time.Minute)))

	st := controls.NewStore(pool, prometheus.NewRegistry(), nil)
	got, err := st.Purge(ctx, controls.Retention{Usage: time.Hour}, false)
	if err != nil {
		t.Fatal(err)
	}
	if got["vgpu_usage"] != 1 || got["vgpu_usage_periods"] != 1 {
		t.Errorf("purged %v, want 1 interval and 1 period (the last closed one stays)", got)
	}
	// The next period to close follows the last closed one: none is
	// closed twice.
	if n, err := c.CloseDue(ctx, h0.Add(181*time.Minute)); err != nil || n != 1 {
		t.Errorf("CloseDue after the purge = %d, %v; want 1 (09:00–10:00 only)", n, err)
	}
	var left []string
	rows, _ := pool.Query(ctx, `SELECT instance_uuid::text FROM vgpu_usage ORDER BY started_at`)
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(left) != 2 || left[0] != open || left[1] != unclosed {
		t.Errorf("left %v (%v), want the open and the unclosed intervals", left, err)
	}
}
