package usage_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// clockRig is a whole bridge reading Nova's notifications from an
// exchange of the test's own, and a publisher playing nova-compute.
type clockRig struct {
	t        *testing.T
	exchange string
	pub      *amqp.Channel
	samples  map[string]novatest.Sample
	db       string
}

func newClockRig(t *testing.T) *clockRig {
	t.Helper()
	r := &clockRig{t: t, exchange: testsvc.Name("nova-clock"), db: testsvc.MigratedPostgres(t), samples: map[string]novatest.Sample{}}
	out := testsvc.Name("vgpu-bridge-clock-out")
	v := testbridge.Config(t, r.db, "notifications.exchange="+r.exchange, "oslo_messaging_notifications.exchange="+out,
		"notifications.silence_warning=0")
	conn, err := amqp.Dial(testsvc.RabbitURL(t))
	testsvc.Must(t, err, "dial broker")
	t.Cleanup(func() {
		if c, err := conn.Channel(); err == nil {
			c.ExchangeDelete(r.exchange, false, false) //nolint:errcheck
			c.ExchangeDelete(out, false, false)        //nolint:errcheck
		}
		conn.Close()
	})
	r.pub, err = conn.Channel()
	testsvc.Must(t, err, "channel")
	testsvc.Must(t, r.pub.Confirm(false), "confirm mode")
	testbridge.Start(t, v) // ready: its queue is bound to the exchange

	_, file, _, _ := runtime.Caller(0)
	all, err := novatest.Samples(filepath.Join(filepath.Dir(file), "..", "..", novatest.SamplesDir))
	testsvc.Must(t, err, "samples")
	for _, s := range all {
		r.samples[s.Name] = s
	}
	return r
}

// notify publishes Nova's sample name about instance on host, with a
// flavor that gives one VGPU, stamped at (the envelope's timestamp and,
// for a delete, deleted_at: the sending host's clock).
func (r *clockRig) notify(name, instance, state string, at time.Time) {
	t := r.t
	t.Helper()
	s, ok := r.samples[name]
	if !ok {
		t.Fatalf("no corpus sample %s", name)
	}
	var msg map[string]any
	testsvc.Must(t, json.Unmarshal(s.JSON, &msg), "sample")
	data := msg["payload"].(map[string]any)["nova_object.data"].(map[string]any)
	data["uuid"], data["tenant_id"], data["user_id"], data["state"], data["task_state"] = instance, "p-clock", "u-clock", state, nil
	data["host"], data["node"], data["power_state"] = "clock-host", "clock-node", "running"
	if state == "deleted" {
		data["deleted_at"] = at.UTC().Format(time.RFC3339Nano)
	}
	flavor := data["flavor"].(map[string]any)["nova_object.data"].(map[string]any)
	flavor["extra_specs"] = map[string]string{"resources:VGPU": "1"}
	b, err := json.Marshal(msg)
	testsvc.Must(t, err, "marshal")
	wire, err := nova.WireMessage(b, uuid.NewString(), at.UTC())
	testsvc.Must(t, err, "wire")
	dc, err := r.pub.PublishWithDeferredConfirmWithContext(context.Background(), r.exchange, "versioned_notifications.info", false, false,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: wire})
	testsvc.Must(t, err, "publish")
	if ok, err := dc.WaitContext(context.Background()); err != nil || !ok {
		t.Fatalf("broker did not confirm %s: %v", name, err)
	}
}

// TestClockSkew replays Nova's notifications of a short-lived vGPU
// instance with its create or delete stamped by a clock 30 days or 5
// seconds ahead or behind the bridge's. Whatever the stamps, the
// instance ends deleted and its usage is one closed interval no longer
// than the bridge itself saw it live (plus, for a create stamped early,
// at most the tolerance): never days, never for ever.
func TestClockSkew(t *testing.T) {
	r := newClockRig(t)
	pool := testsvc.Pool(t, r.db)
	ctx := context.Background()
	const tolerance = 5 * time.Minute // [notifications] clock_skew_tolerance's default
	day := 24 * time.Hour
	for _, c := range []struct {
		name                   string
		createSkew, deleteSkew time.Duration
		lateUpdate             bool          // then an update stamped 30 days ahead says the instance is active
		extra                  time.Duration // seconds the bound allows beyond what the bridge saw
	}{
		{name: "delete 30 days ahead", deleteSkew: 30 * day},
		{name: "delete 30 days behind", deleteSkew: -30 * day},
		{name: "create 30 days ahead", createSkew: 30 * day},
		{name: "create 30 days behind", createSkew: -30 * day, extra: tolerance},
		{name: "delete 5s behind the create's host", deleteSkew: -5 * time.Second},
		{name: "delete an hour behind", deleteSkew: -time.Hour},
		{name: "delete 5s ahead", deleteSkew: 5 * time.Second},
		{name: "create 5s ahead", createSkew: 5 * time.Second},
		{name: "an update 30 days ahead after the delete", lateUpdate: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			inst := uuid.NewString()
			began := time.Now()
			r.notify("instance-create-end", inst, "active", time.Now().Add(c.createSkew))
			r.notify("instance-delete-end", inst, "deleted", time.Now().Add(c.deleteSkew))
			events := 2
			if c.lateUpdate {
				r.notify("instance-power_on-end", inst, "active", time.Now().Add(30*day))
				events++
			}
			waitProcessed(t, pool, inst, events)
			seen := time.Since(began) // the most the bridge can have seen it live

			var state string
			var deleted *time.Time
			testsvc.Must(t, pool.QueryRow(ctx, `SELECT vm_state, deleted_at FROM instances WHERE uuid = $1`, inst).Scan(&state, &deleted), "instance")
			if state != "deleted" || deleted == nil {
				t.Errorf("instance vm_state %q, deleted_at %v; want deleted", state, deleted)
			}
			ivs := flavorIntervals(t, pool, inst)
			if len(ivs) != 1 {
				t.Fatalf("usage intervals %+v; want one", ivs)
			}
			iv := ivs[0]
			if iv.end == nil {
				t.Fatalf("usage interval from %v still open: the deleted instance is billed for ever", iv.start)
			}
			if got, most := iv.end.Sub(iv.start), seen+c.extra; got < 0 || got > most {
				t.Errorf("usage %v (from %v to %v); want at most %v", got, iv.start, *iv.end, most)
			}
			var late bool
			testsvc.Must(t, pool.QueryRow(ctx, `SELECT $1 > (SELECT max(received_at) FROM events WHERE instance_uuid = $2)`,
				*iv.end, inst).Scan(&late), "received")
			if late {
				t.Errorf("usage ends at %v, after the bridge received the instance's last event", *iv.end)
			}
		})
	}
}

// waitProcessed waits until the pipeline has processed n events of
// instance.
func waitProcessed(t *testing.T, pool *pgxpool.Pool, instance string, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var done int
		testsvc.Must(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE instance_uuid = $1 AND processed_at IS NOT NULL`,
			instance).Scan(&done), "processed events")
		if done >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events of %s processed after 60s", done, n, instance)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
