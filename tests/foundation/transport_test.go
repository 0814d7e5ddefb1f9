package foundation

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestSeparateNotificationTransport: with [notifications] transport_url
// set, as a site with its own notification broker sets oslo's
// [oslo_messaging_notifications] transport_url, the bridge consumes Nova's
// notifications there (its queue is declared there, not on the commands'
// broker) and /readyz checks both brokers.
func TestSeparateNotificationTransport(t *testing.T) {
	notifyURL := testsvc.PrivateVHost(t) // amqp://…/vgpu-test-…
	queue := testsvc.Name("vgpu-test-notifications")
	db := testsvc.MigratedPostgres(t)
	d := start(t, config(t, db, "notifications.transport_url=rabbit://"+strings.TrimPrefix(notifyURL, "amqp://"),
		"notifications.queue="+queue))
	base := "http://" + d.API.Addr()
	var ready struct {
		Checks map[string]string `json:"checks"`
	}
	_, body := get(t, base+"/readyz", "")
	if err := json.Unmarshal([]byte(body), &ready); err != nil || ready.Checks["broker"] != "ok" || ready.Checks["notifications_broker"] != "ok" {
		t.Errorf("readyz checks = %s, want broker and notifications_broker ok", body)
	}

	// Nova publishes on its notification broker.
	conn, err := amqp.Dial(notifyURL)
	testsvc.Must(t, err, "connect to the notification broker")
	defer conn.Close()
	ch, err := conn.Channel()
	testsvc.Must(t, err, "channel")
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("the bridge's queue is not on the notification broker: %v", err)
	}
	id := uuid.NewString()
	sample := map[string]any{"event_type": "instance.power_off.end", "priority": "INFO", "publisher_id": "nova-compute:cmp1",
		"payload": map[string]any{"nova_object.name": "InstanceActionPayload", "nova_object.namespace": "nova", "nova_object.version": "1.9",
			"nova_object.data": map[string]any{"uuid": id, "tenant_id": "p1", "user_id": "u1", "host": "cmp1", "node": "cmp1",
				"state": "stopped", "task_state": nil, "power_state": "shutdown"}}}
	raw, _ := json.Marshal(sample)
	wire, err := nova.WireMessage(raw, uuid.NewString(), time.Now())
	testsvc.Must(t, err, "wire message")
	testsvc.Must(t, ch.PublishWithContext(context.Background(), "nova", "versioned_notifications.info", false, false,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: wire}), "publish")

	pool := testsvc.Pool(t, db)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var state string
		err := pool.QueryRow(context.Background(), `SELECT coalesce(vm_state, '') FROM instances WHERE uuid = $1`, id).Scan(&state)
		if err == nil && state == "stopped" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the notification published on the notification broker was not ingested within 30s (%v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The commands' broker holds no notification queue of the bridge.
	dc, err := amqp.Dial(testsvc.RabbitURL(t))
	testsvc.Must(t, err, "connect to the default broker")
	defer dc.Close()
	dch, err := dc.Channel()
	testsvc.Must(t, err, "channel")
	if _, err := dch.QueueDeclarePassive(queue, true, false, false, false, nil); err == nil {
		t.Error("the bridge declared its notification queue on [DEFAULT] transport_url's broker too")
	}
}
