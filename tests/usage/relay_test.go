package usage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// The relay publishes what committed, in commit order, on TOPIC.PRIORITY
// of its exchange, in oslo's envelope, and marks it sent; two replicas
// publish each notification once.
func TestRelay(t *testing.T) {
	pool := db(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := testsvc.RabbitURL(t)
	exchange, topic := testsvc.Name("vgpu-notify-test"), testsvc.Name("notifications")

	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("RabbitMQ at %s: %v", url, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{topic + ".info", topic + ".error"} {
		if err := ch.QueueBind(q.Name, k, exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}

	cfg := notify.Config{Driver: notify.DriverMessagingV2, URLs: []string{url}, Exchange: exchange, ExchangeAutoDelete: true,
		Topics: []string{topic}, PublisherID: "vgpu-bridge:test", Poll: 30 * time.Second}
	for _, replica := range []string{"a", "b"} {
		cfg.Replica = replica
		r, err := notify.New(cfg, pool, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		go r.Run(ctx) //nolint:errcheck
	}

	// Ten commits, one of them an error; a long poll: only NOTIFY on
	// commit can make them arrive quickly.
	const n = 10
	for i := range n {
		ev, prio := notify.AttachStart, notify.Info
		if i == 7 {
			ev, prio = notify.RequestError, notify.Error
		}
		inTx(t, pool, func(tx pgx.Tx) error {
			return notify.Queue(ctx, tx, ev, prio, notify.Action(notify.ActionPayload{RequestID: fmt.Sprint(i), State: "decided"}))
		})
	}
	for i := range n {
		select {
		case d := <-deliveries:
			var env map[string]string
			if err := json.Unmarshal(d.Body, &env); err != nil || env["oslo.version"] != "2.0" {
				t.Fatalf("body %s: %v", d.Body, err)
			}
			var msg struct {
				EventType string `json:"event_type"`
				Priority  string `json:"priority"`
				Payload   struct {
					Data struct {
						RequestID string `json:"request_id"`
					} `json:"versioned_object.data"`
				} `json:"payload"`
			}
			if err := json.Unmarshal([]byte(env["oslo.message"]), &msg); err != nil {
				t.Fatal(err)
			}
			if msg.Payload.Data.RequestID != fmt.Sprint(i) {
				t.Errorf("notification %d carries request %s: out of order or doubled", i, msg.Payload.Data.RequestID)
			}
			wantKey := topic + ".info"
			if i == 7 {
				wantKey = topic + ".error"
				if msg.EventType != notify.RequestError || msg.Priority != "ERROR" {
					t.Errorf("notification 7 = %s %s", msg.EventType, msg.Priority)
				}
			}
			if d.RoutingKey != wantKey {
				t.Errorf("notification %d routed %s, want %s", i, d.RoutingKey, wantKey)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("notification %d did not arrive", i)
		}
	}
	select {
	case d := <-deliveries:
		t.Errorf("a notification more than queued: %s", d.Body)
	case <-time.After(time.Second):
	}
	var unsent int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM bridge_notifications WHERE sent_at IS NULL`).Scan(&unsent); err != nil || unsent != 0 {
		t.Errorf("%d notifications left unsent (%v)", unsent, err)
	}
}

// The noop driver marks notifications sent without a broker.
func TestRelayNoop(t *testing.T) {
	pool := db(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := notify.New(notify.Config{Driver: notify.DriverNoop, Poll: 50 * time.Millisecond}, pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	go r.Run(ctx) //nolint:errcheck
	inTx(t, pool, func(tx pgx.Tx) error {
		return notify.Queue(ctx, tx, notify.AttachEnd, notify.Info, notify.Action(notify.ActionPayload{RequestID: "x"}))
	})
	for {
		var unsent int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM bridge_notifications WHERE sent_at IS NULL`).Scan(&unsent); err != nil {
			t.Fatal(err)
		}
		if unsent == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the noop relay did not mark the notification sent")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
