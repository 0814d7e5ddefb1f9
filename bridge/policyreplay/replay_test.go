package policyreplay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/policyreplay"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// rulesWith is a policy whose scale-up rule resizes an instance busier
// than threshold percent to its next larger profile.
func rulesWith(threshold string) string {
	return `version: 1
defaults:
  attach_mode: direct-live
rules:
  - name: attach-on-request
    on: [webhook.GPU_REQUEST]
    when: preferred != ""
    then: ['attach(preferred, 1)']
  - name: scale-up-busy
    on: [webhook.GPU_LOAD]
    when: has(metrics.gpu_util) && metrics.gpu_util > ` + threshold + ` && instance.profile != "" && larger(instance.profile) != ""
    then: ['resize(larger(instance.profile))', 'notify("scaling up " + instance.uuid)']
  - name: release-on-request
    on: [webhook.GPU_RELEASE]
    then: ['release()']
`
}

const (
	busy   = "11111111-1111-4111-8111-111111111111" // has a T4-4Q (direct path)
	asking = "22222222-2222-4222-8222-222222222222" // asks for a T4-2Q
)

// utilByHour is the busy instance's GPU load over the recorded day, one
// sample an hour: 80 % from 08:00 to 10:00 (above the candidate's 75,
// below the 90 in force), 95 % at 14:00 and 15:00 (above both).
func utilByHour(h int) float64 {
	switch {
	case h >= 8 && h <= 10:
		return 80
	case h == 14 || h == 15:
		return 95
	}
	return 40
}

type day struct {
	pool         *pgxpool.Pool
	since, until time.Time
	day0         time.Time
	broken       int64 // the event whose payload does not decode
}

func loadPolicy(t *testing.T, cat *catalog.Catalog, doc string) *policy.Policy {
	t.Helper()
	p, err := policy.Load(strings.NewReader(doc), policy.Options{Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func webhookPayload(t *testing.T, id uuid.UUID, typ, vm string, ev requests.WebhookEvent) string {
	t.Helper()
	ev.RequestID, ev.Source, ev.Type, ev.VMID = id, "ops", typ, vm
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// record writes the state (two instances, one with a direct-path T4-4Q)
// and a day of events through the bridge's own store: webhook events as
// the webhook endpoint queues them (requests.CreateWebhook), a Nova
// notification as the ingest writes it (requests.InsertNotifications),
// each closed by requests.MarkProcessed as the pipeline closes them.
// Outside the window: one event received before it, one not processed.
func record(t *testing.T) day {
	ctx := context.Background()
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	store := requests.NewStore(pool, "test")
	d := day{pool: pool, day0: time.Now().UTC().Truncate(24 * time.Hour).Add(-24 * time.Hour)}
	must := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for _, in := range []string{busy, asking} {
		_, err := pool.Exec(ctx, `INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, power_state)
			VALUES ($1, 'p1', 'u1', 'h1', 'h1', 'active', 'running')`, in)
		must(err, "instance")
	}
	busyID := uuid.MustParse(busy)
	req := uuid.New()
	must(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := store.Create(ctx, tx, requests.Request{ID: req, Source: "webhook:ops", Kind: "GPU_REQUEST", InstanceUUID: &busyID,
			Body: json.RawMessage(`{}`)}); err != nil {
			return err
		}
		if err := requests.AddAttachments(ctx, tx, req, []flow.Attachment{{ID: uuid.New(), InstanceUUID: busy, Host: "h1", Node: "h1",
			Provider: uuid.NewString(), Class: "VGPU", Amount: 1, PCIAddress: "0000:3b:00.0", TypeID: "nvidia-232", Profile: "T4-4Q", Mode: string(policy.ModeDirectLive)}}); err != nil {
			return err
		}
		_, err := requests.MarkAttached(ctx, tx, req, time.Now())
		return err
	}), "the busy instance's T4-4Q")

	// queue writes webhook events in one transaction, processed unless
	// open, and returns their ids in order.
	type wh struct {
		typ, vm, payload string
		at               time.Time
	}
	queue := func(evs []wh, open bool) []int64 {
		t.Helper()
		b := &pgx.Batch{} // the inbox rows as the webhook endpoint writes them
		var mids []string
		for _, e := range evs {
			id := uuid.New()
			b.Queue(`INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload, request_id, project_id)
				VALUES ('webhook:ops', $1, $2, $3, $4, $5::json, $6, 'p1')`, id.String(), e.typ, uuid.MustParse(e.vm), e.at, e.payload, id.String())
			mids = append(mids, id.String())
		}
		var ids []int64
		must(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `SELECT id FROM events WHERE message_id = ANY($1) ORDER BY id`, mids)
			if err != nil {
				return err
			}
			if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
				return err
			}
			for _, id := range ids {
				if !open {
					if err := requests.MarkProcessed(ctx, tx, id); err != nil {
						return err
					}
				}
			}
			return nil
		}), "queue webhook events")
		return ids
	}
	load := func(h int, util float64) wh {
		id := uuid.New()
		return wh{"GPU_LOAD", busy, webhookPayload(t, id, "GPU_LOAD", busy, requests.WebhookEvent{Metrics: map[string]any{"gpu_util": util}}),
			d.day0.Add(time.Duration(h) * time.Hour)}
	}

	// Received before the window: busy at 80 %, it would differ.
	queue([]wh{load(0, 80)}, false)
	time.Sleep(10 * time.Millisecond)
	must(pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&d.since), "now")

	var evs []wh
	for h := range 24 {
		evs = append(evs, load(h, utilByHour(h)))
		if h == 6 || h == 12 {
			evs = append(evs, wh{"GPU_REQUEST", asking, webhookPayload(t, uuid.New(), "GPU_REQUEST", asking,
				requests.WebhookEvent{VGPUProfile: "T4-2Q"}), d.day0.Add(time.Duration(h)*time.Hour + time.Minute)})
		}
	}
	evs = append(evs, wh{"GPU_RELEASE", busy, webhookPayload(t, uuid.New(), "GPU_RELEASE", busy, requests.WebhookEvent{}),
		d.day0.Add(23*time.Hour + 30*time.Minute)})
	evs = append(evs, wh{"GPU_LOAD", busy, `"not an event"`, d.day0.Add(23*time.Hour + 40*time.Minute)})
	ids := queue(evs, false)
	d.broken = ids[len(ids)-1]

	// A Nova notification no rule listens to.
	n := &requests.Notifications{Source: "nova", MessageIDs: []string{uuid.NewString()}, Types: []string{"instance.update"},
		Instances: []*string{ptr(busy)}, Occurred: []time.Time{d.day0.Add(12 * time.Hour)}, Publishers: []string{"nova-compute:h1"},
		Priorities: []string{"INFO"}, RequestIDs: []string{""}, GlobalRequestIDs: []string{""}, Projects: []string{"p1"}, Users: []string{"u1"},
		Statuses: []*string{nil}, Details: []*string{nil}}
	n.AddPayload([]byte(`{"nova_object.name": "InstanceActionPayload"}`))
	must(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := requests.InsertNotifications(ctx, tx, n)
		if err != nil {
			return err
		}
		var id int64
		var mid string
		var at time.Time
		if _, err := pgx.ForEachRow(rows, []any{&id, &mid, &at}, func() error { return nil }); err != nil {
			return err
		}
		return requests.MarkProcessed(ctx, tx, id)
	}), "nova notification")

	// Not processed yet: left out.
	queue([]wh{load(9, 85)}, true)
	must(pool.QueryRow(ctx, `SELECT clock_timestamp() + interval '1 second'`).Scan(&d.until), "now")
	return d
}

func ptr[T any](v T) *T { return &v }

// counts are the rows of every table a decision writes.
func counts(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"events", "requests", "decisions", "vgpu_attachments", "commands", "audit_log", "planned_claims",
		"policy_load_since", "policy_last_change", "bridge_notifications", "request_callbacks", "vgpu_usage", "nova_resizes"} {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatalf("count %s: %v", table, err)
		}
		out[table] = n
	}
	var processed int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE processed_at IS NOT NULL`).Scan(&processed); err != nil {
		t.Fatal(err)
	}
	out["events processed"] = processed
	return out
}

// TestReplayDayWithChangedThreshold records a day of events, replays it
// with a candidate whose scale-up threshold is 75 % instead of 90 %, and
// checks that exactly the three hours at 80 % differ (a resize and a
// notify each), that the broken event is reported with its reason, and
// that nothing was written.
func TestReplayDayWithChangedThreshold(t *testing.T) {
	t.Parallel()
	d := record(t)
	cat, err := catalog.LoadFile("../../etc/vgpu-bridge/profiles.yaml")
	if err != nil {
		t.Fatal(err)
	}
	active, candidate := loadPolicy(t, cat, rulesWith("90.0")), loadPolicy(t, cat, rulesWith("75.0"))
	before := counts(t, d.pool)
	o := policyreplay.Options{Since: d.since, Until: d.until, Active: active, Candidate: candidate, Catalog: cat}

	var got []policyreplay.Event
	sum, err := policyreplay.Run(context.Background(), d.pool, o, func(ev policyreplay.Event) error {
		got = append(got, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// 24 loads, 2 requests, 1 release, 1 broken, 1 notification.
	if sum.Events != 29 || sum.Evaluated != 28 || sum.Failed != 1 || sum.Differing != 3 || sum.Truncated {
		t.Errorf("summary = %+v, want 29 events, 28 evaluated, 1 failed, 3 differing", sum)
	}
	want := map[string]int{"attach": 0, "release": 0, "resize": 3, "move": 0, "tune": 0, "set_limits": 0, "notify": 3, "reject": 0}
	for k, n := range want {
		if sum.Differ[k] != n {
			t.Errorf("differ[%s] = %d, want %d (all: %v)", k, sum.Differ[k], n, sum.Differ)
		}
	}
	if len(sum.Failures) != 1 || sum.Failures[0].ID != d.broken || !strings.Contains(sum.Failures[0].Reason, "webhook payload") {
		t.Errorf("failures = %+v, want event %d's payload", sum.Failures, d.broken)
	}
	if len(got) != 29 {
		t.Fatalf("emitted %d events, want 29", len(got))
	}
	var differingHours []int
	resizesInForce := 0
	for i, ev := range got {
		if i > 0 && ev.ReceivedAt.Before(got[i-1].ReceivedAt) {
			t.Errorf("event %d emitted after a later one", ev.ID)
		}
		if ev.Error != "" {
			continue
		}
		for _, in := range ev.Active.Intents {
			if in.Kind == policy.IntentResize {
				resizesInForce++
				if in.Profile != "T4-8Q" {
					t.Errorf("event %d: resize to %s, want T4-8Q", ev.ID, in.Profile)
				}
			}
		}
		if len(ev.Differs) == 0 {
			continue
		}
		differingHours = append(differingHours, int(ev.Time.Sub(d.day0).Hours()))
		if ev.Kind != "webhook.GPU_LOAD" || ev.Instance != busy || len(ev.Active.Intents) != 0 ||
			len(ev.Candidate.Intents) != 2 || ev.Candidate.Intents[0].Kind != policy.IntentResize || ev.Candidate.Intents[0].Profile != "T4-8Q" ||
			ev.Candidate.Intents[1].Kind != policy.IntentNotify || fmt.Sprint(ev.Differs) != "[resize notify]" {
			t.Errorf("differing event = %+v\nin force %+v\ncandidate %+v", ev, ev.Active, ev.Candidate)
		}
	}
	if fmt.Sprint(differingHours) != "[8 9 10]" {
		t.Errorf("differing hours = %v, want [8 9 10]", differingHours)
	}
	if resizesInForce != 2 {
		t.Errorf("the rules in force resize %d times, want 2 (14:00 and 15:00)", resizesInForce)
	}
	if after := counts(t, d.pool); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the replay wrote: rows before %v, after %v", before, after)
	}

	// Bounded: the first 5 events, and the summary says there were more.
	o.MaxEvents = 5
	n := 0
	sum, err = policyreplay.Run(context.Background(), d.pool, o, func(policyreplay.Event) error { n++; return nil })
	if err != nil || n != 5 || sum.Events != 5 || !sum.Truncated {
		t.Errorf("max 5: emitted %d, summary %+v, err %v", n, sum, err)
	}

	// The JSON document streams the same events and summary.
	var buf bytes.Buffer
	jw := policyreplay.NewJSONWriter(&buf)
	o.MaxEvents = 0
	sum, err = policyreplay.Run(context.Background(), d.pool, o, jw.Event)
	if err := jw.Close(sum, err); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Events  []policyreplay.Event `json:"events"`
		Summary policyreplay.Summary `json:"summary"`
		Error   string               `json:"error"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("JSON output: %v\n%s", err, buf.String())
	}
	if len(doc.Events) != 29 || doc.Summary.Differ["resize"] != 3 || doc.Error != "" {
		t.Errorf("JSON: %d events, summary %+v, error %q", len(doc.Events), doc.Summary, doc.Error)
	}

	// The table: one line per differing event, then the summary.
	buf.Reset()
	tw := policyreplay.NewTableWriter(&buf)
	tw.OnlyDiffering = true
	sum, err = policyreplay.Run(context.Background(), d.pool, o, tw.Event)
	if err := tw.Close(sum, err); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, w := range []string{"resize(T4-8Q) notify(", "resize,notify", "events: 29 read, 28 evaluated, 1 failed, 3 differ",
		"would differ: attach 0, release 0, resize 3, move 0, tune 0, set_limits 0, notify 3, reject 0", fmt.Sprintf("failed event %d:", d.broken)} {
		if !strings.Contains(out, w) {
			t.Errorf("table lacks %q:\n%s", w, out)
		}
	}
	if lines := strings.Count(out, "webhook.GPU_LOAD"); lines != 4 { // 3 differing, 1 failed
		t.Errorf("table shows %d GPU_LOAD lines, want 4:\n%s", lines, out)
	}
}

// TestReplayRefusesBadOptions: the window and the bound are checked
// before anything is read.
func TestReplayRefusesBadOptions(t *testing.T) {
	t.Parallel()
	p := loadPolicy(t, catalog.New(), "version: 1\nrules: []\n")
	now := time.Now()
	for _, tc := range []struct {
		name string
		o    policyreplay.Options
		want string
	}{
		{"no candidate", policyreplay.Options{Active: p, Since: now.Add(-time.Hour), Until: now}, "candidate are required"},
		{"no since", policyreplay.Options{Active: p, Candidate: p, Until: now}, "since and until are required"},
		{"reversed", policyreplay.Options{Active: p, Candidate: p, Since: now, Until: now.Add(-time.Hour)}, "is not before until"},
		{"too many", policyreplay.Options{Active: p, Candidate: p, Since: now.Add(-time.Hour), Until: now, MaxEvents: policyreplay.MaxEvents + 1}, "max events"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policyreplay.Run(context.Background(), nil, tc.o, nil)
			if !errors.Is(err, policyreplay.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid with %q", err, tc.want)
			}
		})
	}
}
