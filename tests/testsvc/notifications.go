// SPDX-License-Identifier: Apache-2.0

package testsvc

import (
	"encoding/json"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ConsumeNotification reads queue on the broker at amqpURL until an
// oslo.messaging (messagingv2) notification of eventType comes, and
// returns its versioned object's name and data; other notifications on
// the queue are consumed and skipped. It fails t after within. The queue
// may appear late: a publisher that declares it does so with its first
// publication.
func ConsumeNotification(t testing.TB, amqpURL, queue, eventType string, within time.Duration) (name string, data json.RawMessage) {
	t.Helper()
	c, err := amqp.Dial(amqpURL)
	Must(t, err, "amqp")
	defer c.Close()
	ch, err := c.Channel()
	Must(t, err, "channel")
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		d, ok, err := ch.Get(queue, true)
		if err != nil || !ok {
			if err != nil { // the queue is not there yet: the channel is closed
				if ch, err = c.Channel(); err != nil {
					t.Fatalf("channel: %v", err)
				}
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		var env map[string]string
		Must(t, json.Unmarshal(d.Body, &env), "envelope")
		var m struct {
			EventType string `json:"event_type"`
			Payload   struct {
				Name string          `json:"versioned_object.name"`
				Data json.RawMessage `json:"versioned_object.data"`
			} `json:"payload"`
		}
		Must(t, json.Unmarshal([]byte(env["oslo.message"]), &m), "oslo.message")
		if m.EventType == eventType {
			return m.Payload.Name, m.Payload.Data
		}
	}
	t.Fatalf("no %s notification on %s within %s", eventType, queue, within)
	return "", nil
}

// DeleteQueue deletes queue and exchange on the broker at amqpURL, as a
// test's cleanup does (errors ignored).
func DeleteQueue(amqpURL, exchange, queue string) {
	c, err := amqp.Dial(amqpURL)
	if err != nil {
		return
	}
	defer c.Close()
	if ch, err := c.Channel(); err == nil {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
	}
}
