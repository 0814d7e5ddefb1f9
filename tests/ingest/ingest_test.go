package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const infoKey = "versioned_notifications.info"

// TestCorpusSamples publishes every Nova sample raw (oslo 2.0 envelope,
// message_id and timestamp added), some twice, plus poison messages: every
// sample lands once in the inbox, the poison in dead_letters, and the
// instance state is the newest event's.
func TestCorpusSamples(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	cfg.MaxMessageBytes = 64 << 10
	r.declare(cfg)

	ss := samples(t)
	base := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	var bodies [][]byte
	for i, s := range ss {
		bodies = append(bodies, s.Wire(fmt.Sprintf("sample-%03d", i), base.Add(time.Duration(i)*time.Millisecond)))
	}
	// Redelivered/republished: no second effect.
	bodies = append(bodies, bodies[0], bodies[1], bodies[len(bodies)-1])
	// Legacy (messaging driver) form of one sample, under a new id.
	var env map[string]string
	testsvc.Must(t, json.Unmarshal(ss[0].Wire("legacy-1", base), &env), "envelope")
	bodies = append(bodies, []byte(env["oslo.message"]))
	var inst novatest.Sample
	for _, s := range ss {
		if s.Name == "instance-create-end" {
			inst = s
		}
	}
	poison := map[string][]byte{
		ingest.ReasonNotJSON:        []byte("this is not json"),
		ingest.ReasonBrokenEnvelope: []byte(`{"oslo.version":"2.0","oslo.message":{"not":"a string"}}`),
		ingest.ReasonNoMessageID:    []byte(strings.Replace(string(ss[0].Wire("x", base)), `\"message_id\":\"x\",`, "", 1)),
		ingest.ReasonSchema:         ss[0].Wire("bad-ts", base)[:0],
		ingest.ReasonOversize:       []byte(`{"pad":"` + strings.Repeat("x", 70<<10) + `"}`),
	}
	// A schema violation: the instance uuid is not a UUID.
	poison[ingest.ReasonSchema] = []byte(strings.Replace(string(inst.Wire("bad-uuid", base)), "178b0921-8f85-4257-88b6-2e743b5a975c", "not-a-uuid", 1))
	for reason, b := range poison {
		if reason == ingest.ReasonNoMessageID && strings.Contains(string(b), "message_id") {
			t.Fatal("test bug: message_id still in the no_message_id case")
		}
		if reason == ingest.ReasonSchema && !strings.Contains(string(b), "not-a-uuid") {
			t.Fatal("test bug: uuid not replaced")
		}
		bodies = append(bodies, b)
	}
	// An unknown major version is recorded, not dead.
	unknown := string(inst.Wire("future", base))
	i := strings.LastIndex(unknown, `\"nova_object.version\":\"1.`)
	if i < 0 {
		t.Fatal("test bug: no payload version")
	}
	unknown = unknown[:i] + `\"nova_object.version\":\"9.` + unknown[i+len(`\"nova_object.version\":\"1.`):]
	bodies = append(bodies, []byte(unknown))
	r.publish(infoKey, bodies...)

	run := r.start(cfg)
	want := len(ss) + 2
	r.waitCount(want, 60*time.Second, `SELECT count(*) FROM events`)
	r.waitCount(len(poison), 30*time.Second, `SELECT count(*) FROM dead_letters`)
	for reason := range poison {
		if n := r.count(`SELECT count(*) FROM dead_letters WHERE reason = $1 AND raw IS NOT NULL AND detail <> ''`, reason); n != 1 {
			t.Errorf("dead letters with reason %s: %d, want 1", reason, n)
		}
	}
	if n := r.count(`SELECT count(*) FROM dead_letters WHERE reason = 'schema' AND message_id = 'bad-uuid' AND detail LIKE '%payload.uuid%'`); n != 1 {
		t.Errorf("schema dead letter does not name its message_id and field")
	}
	if n := r.count(`SELECT count(*) FROM dead_letters WHERE reason = 'oversize' AND raw_truncated AND length(raw) = 65536`); n != 1 {
		t.Errorf("oversize body not capped at 64 KiB")
	}
	if n := r.count(`SELECT count(*) FROM events WHERE status = 'unrecognized'`); n != 1 {
		t.Errorf("unrecognized events: %d, want 1", n)
	}
	if n := r.count(`SELECT count(*) FROM events WHERE request_id LIKE 'req-%' AND project_id IS NOT NULL AND user_id = 'fake'`); n != want {
		t.Errorf("events with request context: %d, want %d", n, want)
	}
	// All instance samples share one uuid; the newest event wins.
	var lastType string
	testsvc.Must(t, r.pool.QueryRow(context.Background(),
		`SELECT last_event_type FROM instances WHERE uuid = '178b0921-8f85-4257-88b6-2e743b5a975c'`).Scan(&lastType), "instance")
	var newest string
	testsvc.Must(t, r.pool.QueryRow(context.Background(), `SELECT event_type FROM events
		WHERE instance_uuid = '178b0921-8f85-4257-88b6-2e743b5a975c' AND status IS NULL ORDER BY occurred_at DESC LIMIT 1`).Scan(&newest), "newest")
	if lastType != newest {
		t.Errorf("instance last_event_type %q, want the newest event %q", lastType, newest)
	}
	if n := r.count(`SELECT count(*) FROM flavors WHERE flavorid = 'a22d5517-147c-4147-a0d1-e698df5cd4e3'`); n != 1 {
		t.Errorf("flavor rows: %d", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for run.metric("vgpu_bridge_notifications_duplicates_total") < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := run.metric("vgpu_bridge_notifications_duplicates_total"); got != 3 {
		t.Errorf("duplicates metric %v, want 3", got)
	}
	if got := run.metric("vgpu_bridge_notifications_dead_letters_total"); got != float64(len(poison)) {
		t.Errorf("dead letters metric %v, want %d", got, len(poison))
	}
}

// instanceMsg builds an instance notification for uuid at ts.
func instanceMsg(t *testing.T, id, eventType, uuid, vmState, host string, specs map[string]string, ts time.Time) []byte {
	return instanceMsgMeta(t, id, eventType, uuid, vmState, host, specs, nil, ts)
}

// instanceMsgMeta is instanceMsg with the server's metadata (none when nil).
func instanceMsgMeta(t *testing.T, id, eventType, uuid, vmState, host string, specs map[string]string, md map[string]any, ts time.Time) []byte {
	flavor := map[string]any{"nova_object.name": "FlavorPayload", "nova_object.namespace": "nova", "nova_object.version": "1.4",
		"nova_object.data": map[string]any{"flavorid": "f-" + host, "name": "gpu", "vcpus": 4, "memory_mb": 8192, "extra_specs": specs}}
	sample := map[string]any{
		"event_type": eventType, "priority": "INFO", "publisher_id": "nova-compute:" + host,
		"payload": map[string]any{"nova_object.name": "InstanceActionPayload", "nova_object.namespace": "nova", "nova_object.version": "1.9",
			"nova_object.data": map[string]any{"uuid": uuid, "tenant_id": "p1", "user_id": "u1", "host": host, "node": host + "-node",
				"state": vmState, "task_state": nil, "power_state": "running", "flavor": flavor}},
	}
	if md != nil {
		sample["payload"].(map[string]any)["nova_object.data"].(map[string]any)["metadata"] = md
	}
	b, err := json.Marshal(sample)
	testsvc.Must(t, err, "marshal")
	w, err := nova.WireMessage(b, id, ts)
	testsvc.Must(t, err, "wire")
	return w
}

// TestOutOfOrder: an older event never overwrites newer state, also when
// both arrive in one batch or in later batches; start < end at the same
// timestamp.
func TestOutOfOrder(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	r.declare(cfg)
	const uuid = "6f0a4b6c-6a6e-4b1e-9c3a-0d1b2c3d4e5f"
	t0 := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	vgpu := map[string]string{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "required"}
	r.publish(infoKey,
		instanceMsg(t, "m3", "instance.resize_finish.end", uuid, "resized", "hostB", vgpu, t0.Add(3*time.Second)),
		instanceMsg(t, "m1", "instance.create.end", uuid, "active", "hostA", nil, t0.Add(time.Second)),
		instanceMsg(t, "m3s", "instance.resize_finish.start", uuid, "active", "hostA", nil, t0.Add(3*time.Second)),
	)
	run := r.start(cfg)
	r.waitCount(3, 30*time.Second, `SELECT count(*) FROM events`)
	run.stop()
	r.publish(infoKey, instanceMsg(t, "m2", "instance.power_off.end", uuid, "stopped", "hostA", nil, t0.Add(2*time.Second)))
	r.start(cfg)
	r.waitCount(4, 30*time.Second, `SELECT count(*) FROM events`)
	var host, state, last string
	var vgpus int
	testsvc.Must(t, r.pool.QueryRow(context.Background(),
		`SELECT host, vm_state, last_event_type, vgpus FROM instances WHERE uuid = $1`, uuid).Scan(&host, &state, &last, &vgpus), "instance")
	if host != "hostB" || state != "resized" || last != "instance.resize_finish.end" || vgpus != 1 {
		t.Errorf("got host=%s state=%s last=%s vgpus=%d; want the resize_finish.end state", host, state, last, vgpus)
	}
}

// TestClockSkewState: Nova's timestamps order an instance's state only
// within the bridge's clock. An event stamped 30 days ahead holds the state
// for no longer than the tolerance after the bridge received it, and a
// delete stamped before the instance's newest event (its host's clock
// behind) still deletes it, in a batch of its own or with the others.
func TestClockSkewState(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	cfg.ClockSkewTolerance = time.Second
	r.declare(cfg)
	r.start(cfg)
	state := func(uuid string) (vm string, deleted bool) {
		t.Helper()
		testsvc.Must(t, r.pool.QueryRow(context.Background(), `SELECT vm_state, deleted_at IS NOT NULL FROM instances WHERE uuid = $1`,
			uuid).Scan(&vm, &deleted), "instance "+uuid)
		return vm, deleted
	}
	events := `SELECT count(*) FROM events WHERE instance_uuid = $1`

	ahead := "8f0a4b6c-6a6e-4b1e-9c3a-0d1b2c3d4e5f"
	r.publish(infoKey, instanceMsg(t, "a1", "instance.power_on.end", ahead, "active", "hostA", nil, time.Now().AddDate(0, 0, 30)))
	r.waitCount(1, 30*time.Second, events, ahead)
	// Published once the first is stored, stamped past its receipt plus
	// the tolerance: newer, whatever the first one's stamp says.
	r.publish(infoKey, instanceMsg(t, "a2", "instance.power_off.end", ahead, "stopped", "hostA", nil, time.Now().Add(2*time.Second)))
	r.waitCount(2, 30*time.Second, events, ahead)
	if vm, _ := state(ahead); vm != "stopped" {
		t.Errorf("after an event stamped 30 days ahead and a later one: vm_state %q, want stopped", vm)
	}

	for _, c := range []struct {
		name, uuid string
		skew       time.Duration
		together   bool
	}{
		{"an hour behind, alone", "9f0a4b6c-6a6e-4b1e-9c3a-0d1b2c3d4e51", -time.Hour, false},
		{"5s behind, alone", "9f0a4b6c-6a6e-4b1e-9c3a-0d1b2c3d4e52", -5 * time.Second, false},
		{"an hour behind, with the create", "9f0a4b6c-6a6e-4b1e-9c3a-0d1b2c3d4e53", -time.Hour, true},
		{"30 days behind, with the create", "9f0a4b6c-6a6e-4b1e-9c3a-0d1b2c3d4e54", -30 * 24 * time.Hour, true},
	} {
		create := instanceMsg(t, c.uuid+"-c", "instance.create.end", c.uuid, "active", "hostA", nil, time.Now())
		del := instanceMsg(t, c.uuid+"-d", "instance.delete.end", c.uuid, "deleted", "hostB", nil, time.Now().Add(c.skew))
		if c.together {
			r.publish(infoKey, create, del)
		} else {
			r.publish(infoKey, create)
			r.waitCount(1, 30*time.Second, events, c.uuid)
			r.publish(infoKey, del)
		}
		r.waitCount(2, 30*time.Second, events, c.uuid)
		// A later event of the instance (stamped ahead) does not undo it.
		r.publish(infoKey, instanceMsg(t, c.uuid+"-u", "instance.power_on.end", c.uuid, "active", "hostA", nil, time.Now().Add(time.Hour)))
		r.waitCount(3, 30*time.Second, events, c.uuid)
		if vm, deleted := state(c.uuid); vm != "deleted" || !deleted {
			t.Errorf("delete %s: vm_state %q, deleted %v; want deleted", c.name, vm, deleted)
		}
	}
}

// TestGuestDriverMetadata: the guest driver declared in the server's
// metadata follows the newest notification; a payload without metadata
// keeps it, an older notification does not overwrite it, and a value that
// is not a driver version is not taken.
func TestGuestDriverMetadata(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	r.declare(cfg)
	run := r.start(cfg)
	defer run.stop()
	const uuid = "7f0a4b6c-6a6e-4b1e-9c3a-0d1b2c3d4e5f"
	t0 := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	md := func(v any) map[string]any { return map[string]any{"color": "blue", nova.GuestDriverKey: v} }
	steps := []struct {
		name string
		msg  []byte
		want string // "" is NULL
	}{
		{"declared", instanceMsgMeta(t, "g1", "instance.create.end", uuid, "active", "hostA", nil, md("550.54.15"), t0.Add(time.Second)), "550.54.15"},
		{"no metadata keeps it", instanceMsgMeta(t, "g2", "instance.power_off.end", uuid, "stopped", "hostA", nil, nil, t0.Add(2*time.Second)), "550.54.15"},
		{"older does not overwrite", instanceMsgMeta(t, "g0", "instance.update", uuid, "active", "hostA", nil, md("470.82.01"), t0), "550.54.15"},
		{"changed", instanceMsgMeta(t, "g3", "instance.power_on.end", uuid, "active", "hostA", nil, md("535.104.05"), t0.Add(3*time.Second)), "535.104.05"},
		{"not a version", instanceMsgMeta(t, "g4", "instance.reboot.end", uuid, "active", "hostA", nil, md("latest; DROP"), t0.Add(4*time.Second)), ""},
		{"redeclared", instanceMsgMeta(t, "g5", "instance.reboot.end", uuid, "active", "hostA", nil, md("550.90.07"), t0.Add(5*time.Second)), "550.90.07"},
		{"removed", instanceMsgMeta(t, "g6", "instance.reboot.end", uuid, "active", "hostA", nil, map[string]any{}, t0.Add(6*time.Second)), ""},
	}
	for i, st := range steps {
		r.publish(infoKey, st.msg)
		r.waitCount(i+1, 30*time.Second, `SELECT count(*) FROM events`)
		var got string
		testsvc.Must(t, r.pool.QueryRow(context.Background(),
			`SELECT coalesce(guest_driver, '') FROM instances WHERE uuid = $1`, uuid).Scan(&got), "instance")
		if got != st.want {
			t.Errorf("%s: guest_driver = %q, want %q", st.name, got, st.want)
		}
	}
}

// TestTopologyMismatch: oslo declared the exchange durable (as with
// amqp_durable_queues = true) and the bridge is configured otherwise: the
// error is a clear 406 naming the setting.
func TestTopologyMismatch(t *testing.T) {
	r := newRig(t)
	testsvc.Must(t, r.pub.ExchangeDeclare(r.exchange, "topic", true, false, false, false, nil), "declare durable exchange")
	cfg := r.config(r.amqpURL)
	c, err := ingest.New(cfg, r.pool, nil, nil)
	testsvc.Must(t, err, "new")
	err = c.CheckTopology(context.Background())
	if !ingest.IsTopologyMismatch(err) || !strings.Contains(err.Error(), "exchange_durable") || !strings.Contains(err.Error(), "amqp_durable_queues") {
		t.Fatalf("err = %v; want a topology mismatch naming exchange_durable and amqp_durable_queues", err)
	}
	cfg.ExchangeDurable = true
	c, _ = ingest.New(cfg, r.pool, nil, nil)
	testsvc.Must(t, c.CheckTopology(context.Background()), "with exchange_durable = true")
	cfg.ExchangeDurable, cfg.ExchangePassive = false, true
	c, _ = ingest.New(cfg, r.pool, nil, nil)
	testsvc.Must(t, c.CheckTopology(context.Background()), "passive")
}

// burst publishes n instance notifications with distinct ids.
func burst(t *testing.T, n int) [][]byte {
	base := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	out := make([][]byte, n)
	for i := range out {
		uuid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i%97)
		out[i] = instanceMsg(t, fmt.Sprintf("burst-%06d", i), "instance.update", uuid, "active", "h1", map[string]string{"resources:VGPU": "1"}, base.Add(time.Duration(i)*time.Microsecond))
	}
	return out
}

// TestKillMidBurst: the consumer is stopped in the middle of a burst and a
// new one takes over: every message is applied exactly once.
func TestKillMidBurst(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	cfg.BatchSize, cfg.Prefetch = 50, 100
	cfg.OnApplied = r.appliedLog()
	r.declare(cfg)
	const n = 3000
	r.publish(infoKey, burst(t, n)...)
	run := r.start(cfg)
	for r.count(`SELECT count(*) FROM events`) < n/4 {
		time.Sleep(5 * time.Millisecond)
	}
	run.stop() // mid-burst: in-flight batch finished or requeued
	if got := r.count(`SELECT count(*) FROM events`); got >= n {
		t.Fatalf("the burst ended before the kill (%d events); make it bigger", got)
	}
	r.start(cfg)
	r.waitCount(n, 60*time.Second, `SELECT count(*) FROM events`)
	r.waitCount(n, 10*time.Second, `SELECT count(*) FROM applied_log`)
	if d := r.count(`SELECT count(*) FROM (SELECT message_id FROM applied_log GROUP BY 1 HAVING count(*) > 1) x`); d != 0 {
		t.Errorf("%d messages applied more than once", d)
	}
}

// TestConnectionCutMidBurst: the broker connection is cut (TCP reset by a
// proxy the test controls) in the middle of a burst, twice; the consumer
// reconnects by itself and every message is applied exactly once.
func TestConnectionCutMidBurst(t *testing.T) {
	r := newRig(t)
	u, err := amqp.ParseURI(r.amqpURL)
	testsvc.Must(t, err, "parse")
	p := newProxy(t, fmt.Sprintf("%s:%d", u.Host, u.Port))
	cfg := r.config(proxiedURL(r.amqpURL, p.Addr()))
	cfg.BatchSize, cfg.Prefetch = 50, 100
	cfg.OnApplied = r.appliedLog()
	r.declare(cfg)
	const n = 4000
	r.publish(infoKey, burst(t, n)...)
	run := r.start(cfg)
	for _, frac := range []int{4, 2} {
		for r.count(`SELECT count(*) FROM events`) < n/frac {
			time.Sleep(2 * time.Millisecond)
		}
		p.Cut()
	}
	if got := r.count(`SELECT count(*) FROM events`); got >= n {
		t.Logf("warning: the burst ended before the last cut (%d events)", got)
	}
	r.waitCount(n, 90*time.Second, `SELECT count(*) FROM events`)
	r.waitCount(n, 10*time.Second, `SELECT count(*) FROM applied_log`)
	if d := r.count(`SELECT count(*) FROM (SELECT message_id FROM applied_log GROUP BY 1 HAVING count(*) > 1) x`); d != 0 {
		t.Errorf("%d messages applied more than once", d)
	}
	if s := run.c.Sessions(); s < 3 {
		t.Errorf("sessions = %d, want >= 3 (reconnected after each cut)", s)
	}
	if !run.c.Connected() {
		t.Error("consumer not connected after the cuts")
	}
}

// TestConsumerCancelledAndBrokerList: the first broker of the list is down,
// so the consumer uses the second; then the broker cancels the consumer
// (its queue is deleted) and the consumer declares it again and goes on.
func TestConsumerCancelledAndBrokerList(t *testing.T) {
	r := newRig(t)
	dead := fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", testsvc.FreePort(t))
	cfg := r.config(dead)
	cfg.URLs = append(cfg.URLs, r.amqpURL)
	run := r.start(cfg)
	waitFor(t, 30*time.Second, "first session", func() bool { return run.c.Connected() && run.c.Sessions() == 1 })
	_, err := r.pub.QueueDelete(r.queue, false, false, false)
	testsvc.Must(t, err, "delete queue")
	waitFor(t, 30*time.Second, "second session", func() bool { return run.c.Connected() && run.c.Sessions() >= 2 })
	r.publish(infoKey, burst(t, 10)...)
	r.waitCount(10, 30*time.Second, `SELECT count(*) FROM events`)
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	testsvc.WaitFor(t, d, what, ok)
}

// poisoned returns an instance notification whose payload carries extra,
// a JSON member, after its tenant_id.
func poisoned(t *testing.T, id, uuid, extra string, ts time.Time) []byte {
	t.Helper()
	w := string(instanceMsg(t, id, "instance.update", uuid, "active", "h1", nil, ts))
	const anchor = `\"tenant_id\":\"p1\"`
	if !strings.Contains(w, anchor) {
		t.Fatal("test bug: no tenant_id in the wire form")
	}
	return []byte(strings.Replace(w, anchor, anchor+`,`+extra, 1))
}

// poison is the member that refuseMarked makes the database refuse.
const poison = `\"refuse_me\":true`

// refuseMarked makes the database refuse an event whose payload holds the
// member poison (a CHECK constraint: SQLSTATE 23514, a refusal of the
// data). The inbox keeps payloads as json, which takes whatever Go's
// decoder takes (a lone UTF-16 surrogate, a number beyond numeric's
// range), so no value a valid notification can carry is refused by the
// schema itself; the constraint stands for the refusals that remain
// possible (a later constraint, a value of another column).
func refuseMarked(t *testing.T, r *rig) {
	t.Helper()
	_, err := r.pool.Exec(context.Background(), `ALTER TABLE events ADD CONSTRAINT refuse_marked
		CHECK (strpos(payload::text, '"refuse_me"') = 0) NOT VALID`)
	testsvc.Must(t, err, "add the events constraint")
}

// TestPoisonValues: values jsonb would refuse (a number beyond numeric's
// range, a lone UTF-16 surrogate) are stored as they came. Notifications
// the database refuses (refuseMarked) become dead letters and never hold
// up what follows them; when Postgres refuses even the dead letter, a
// minimal one is kept, and when it refuses that too the message is
// dropped and counted. Nothing is retried forever.
func TestPoisonValues(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	r.declare(cfg)
	ts := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	const uuid = "5b1e5a6c-0b43-4bd8-9a2f-2a3cbd7e6f10"
	ok := func(id string, i int) []byte {
		return instanceMsg(t, id, "instance.update", uuid, "active", "h1", nil, ts.Add(time.Duration(i)*time.Second))
	}
	refuseMarked(t, r)
	r.publish(infoKey,
		ok("ok-1", 1),
		poisoned(t, "huge-number", uuid, `\"huge\":1e200000`, ts.Add(2*time.Second)),
		poisoned(t, "lone-surrogate", uuid, `\"bad\":\"\\ud800\"`, ts.Add(3*time.Second)),
		poisoned(t, "refused-1", uuid, poison, ts.Add(3*time.Second)),
		poisoned(t, "refused-2", uuid, `\"n\":2,`+poison, ts.Add(3*time.Second)),
		ok("ok-2", 4),
	)
	run := r.start(cfg)
	r.waitCount(4, 30*time.Second, `SELECT count(*) FROM events WHERE message_id IN ('ok-1', 'ok-2', 'huge-number', 'lone-surrogate')`)
	if n := r.count(`SELECT count(*) FROM events WHERE message_id = 'huge-number' AND payload::text LIKE '%"huge":1e200000%'
		OR message_id = 'lone-surrogate' AND payload::text LIKE '%"bad":"\\ud800"%'`); n != 2 {
		t.Errorf("%d of the 2 messages jsonb would refuse stored as they came", n)
	}
	r.waitCount(2, 10*time.Second, `SELECT count(*) FROM dead_letters WHERE reason = 'schema'
		AND message_id IN ('refused-1', 'refused-2') AND raw IS NOT NULL AND headers ? 'routing_key'
		AND detail LIKE 'database refused it: %'`)
	if n := r.count(`SELECT count(*) FROM events WHERE message_id IN ('refused-1', 'refused-2')`); n != 0 {
		t.Errorf("%d refused messages stored as events", n)
	}
	testsvc.Must(t, run.c.Ready(context.Background()), "ready after dead-lettering")

	// Postgres now refuses every schema dead letter: the next poisoned
	// message is kept as a minimal dead letter only when that passes, so
	// refuse both forms (the minimal one by its detail) and it is dropped.
	_, err := r.pool.Exec(context.Background(), `ALTER TABLE dead_letters ADD CONSTRAINT refuse_poison
		CHECK (message_id IS DISTINCT FROM 'drop-me' AND detail NOT LIKE 'dead letter refused%') NOT VALID`)
	testsvc.Must(t, err, "add constraint")
	r.publish(infoKey, poisoned(t, "drop-me", uuid, poison, ts.Add(5*time.Second)), ok("ok-3", 6))
	r.waitCount(1, 30*time.Second, `SELECT count(*) FROM events WHERE message_id = 'ok-3'`)
	if got := run.metric("vgpu_bridge_notifications_dropped_total"); got != 1 {
		t.Errorf("dropped metric %v, want 1", got)
	}
	if got := run.metric("vgpu_bridge_notifications_dead_letters_total"); got != 2 {
		t.Errorf("dead letters metric %v, want 2", got)
	}
	if got := run.metric("vgpu_bridge_notifications_commit_errors_total"); got < 3 {
		t.Errorf("commit errors metric %v, want at least one per refusal (3)", got)
	}

	// Only the minimal form is refused now: it is what is kept.
	_, err = r.pool.Exec(context.Background(), `ALTER TABLE dead_letters DROP CONSTRAINT refuse_poison;
		ALTER TABLE dead_letters ADD CONSTRAINT refuse_full CHECK (message_id IS DISTINCT FROM 'minimal') NOT VALID`)
	testsvc.Must(t, err, "swap constraint")
	r.publish(infoKey, poisoned(t, "minimal", uuid, poison, ts.Add(7*time.Second)), ok("ok-4", 8))
	r.waitCount(1, 30*time.Second, `SELECT count(*) FROM events WHERE message_id = 'ok-4'`)
	if n := r.count(`SELECT count(*) FROM dead_letters WHERE message_id IS NULL AND raw IS NULL
		AND detail LIKE 'dead letter refused by the database%first refusal: database refused it:%'`); n != 1 {
		t.Errorf("minimal dead letters: %d, want 1", n)
	}
	run.stop()
	// Everything was acknowledged: nothing comes back to a new consumer.
	q, err := r.pub.QueueDeclarePassive(r.queue, true, false, false, false, nil)
	testsvc.Must(t, err, "inspect queue")
	if q.Messages != 0 {
		t.Errorf("%d messages left on the queue after the consumer stopped; want 0 (all acknowledged)", q.Messages)
	}
}

// TestCommitStallNotReady: while every commit fails for a reason that is
// not the data's (here a trigger raising an insufficient-resources error),
// the messages wait unacked, the error is counted, and Ready fails naming
// it after StallAfter; once commits pass again, the messages are stored
// and Ready passes.
func TestCommitStallNotReady(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	cfg.StallAfter = time.Second
	r.declare(cfg)
	_, err := r.pool.Exec(context.Background(), `
		CREATE FUNCTION refuse_events() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN RAISE EXCEPTION 'disk full (test)' USING ERRCODE = '53100'; END $$;
		CREATE TRIGGER refuse_events BEFORE INSERT ON events FOR EACH STATEMENT EXECUTE FUNCTION refuse_events()`)
	testsvc.Must(t, err, "create trigger")
	r.publish(infoKey, instanceMsg(t, "stalled", "instance.update", "7d8c0f4e-4a55-4a0c-8f0f-3f8a6d2b9c11", "active", "h1", nil, time.Now()))
	run := r.start(cfg)
	deadline := time.Now().Add(20 * time.Second)
	var readyErr error
	for time.Now().Before(deadline) {
		if readyErr = run.c.Ready(context.Background()); readyErr != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if readyErr == nil || !strings.Contains(readyErr.Error(), "disk full (test)") {
		t.Fatalf("Ready = %v while commits fail; want an error naming the database's", readyErr)
	}
	if got := run.metric("vgpu_bridge_notifications_commit_errors_total"); got < 1 {
		t.Errorf("commit errors metric %v, want ≥ 1", got)
	}
	_, err = r.pool.Exec(context.Background(), `DROP TRIGGER refuse_events ON events`)
	testsvc.Must(t, err, "drop trigger")
	r.waitCount(1, 30*time.Second, `SELECT count(*) FROM events WHERE message_id = 'stalled'`)
	testsvc.Must(t, run.c.Ready(context.Background()), "ready after recovery")
}
