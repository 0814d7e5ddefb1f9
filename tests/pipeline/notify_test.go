package pipeline_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// notifyRules tell a training VM's tenant what the bridge does.
const notifyRules = `  - name: tell-training-tenants
    on: [webhook.GPU_REQUEST]
    when: event.workload == "training"
    then: ['notify("your training VM gets a " + preferred)']
`

// TestNotifyDelivers: a rule's notify(message) reaches the request's
// callback URL (a server of the test, the POST signed with the source's
// secret as every callback is) and RabbitMQ as the bridge's
// vgpu.policy.notify notification, besides its audit row. The callback
// and the notification leave after the decision committed, from the
// callback loop and the notification relay.
func TestNotifyDelivers(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testsvc.DirectPolicy(notifyRules))
	secret := []byte("pipetest-callback-secret-0123456789")

	// The callback target.
	var mu sync.Mutex
	type call struct {
		h    http.Header
		body []byte
	}
	var calls []call
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls = append(calls, call{r.Header.Clone(), b})
		mu.Unlock()
		rw.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)

	// The webhook endpoint's callback loop and the notification relay of
	// a bridge, on the world's database.
	ep, err := webhook.New(webhook.Config{Sources: []webhook.Source{{Name: "pipetest", Auth: webhook.AuthHMAC, Format: webhook.FormatNative,
		Secrets: [][]byte{secret}, Rate: 100, Burst: 100, MaxBodyBytes: 4096, CallbackHosts: []string{"127.0.0.1"}}},
		Store: w.requests, Pool: w.pool, Logger: logger(),
		Callbacks: webhook.CallbackConfig{PollInterval: 50 * time.Millisecond, BackoffMin: 100 * time.Millisecond,
			BackoffMax: time.Second, MaxAttempts: 5, Timeout: 2 * time.Second}})
	testsvc.Must(t, err, "webhook endpoint")
	topic := w.startRelay(t, "pipe-notify")
	ctx, cancel := context.WithCancel(w.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ep.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	inst := w.domains[3].UUID
	id := w.submitWithCallback("GPU_REQUEST", inst, srv.URL+"/done", map[string]any{"vgpu_profile": "T4-4Q", "count": 1, "workload": "training"})
	if r := w.wait(id, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("request %s: %s (%s: %s)", id, r.State, r.Code, r.Reason)
	}
	const want = "your training VM gets a T4-4Q"

	// The callback: the notify one and the final state's, each signed.
	var notified requests.NotifyCallback
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		got := append([]call(nil), calls...)
		mu.Unlock()
		var final bool
		for _, c := range got {
			if c.h.Get(webhook.HeaderHubSignature) != webhook.HubSignature(secret, c.body) {
				t.Errorf("callback %s: X-Hub-Signature-256 %q does not sign the body", c.body, c.h.Get(webhook.HeaderHubSignature))
			}
			var m map[string]any
			testsvc.Must(t, json.Unmarshal(c.body, &m), "callback body")
			if m["event"] == requests.NotifyEvent {
				testsvc.Must(t, json.Unmarshal(c.body, &notified), "notify callback")
			} else if m["state"] == string(requests.Succeeded) {
				final = true
			}
		}
		if notified.Message != "" && final {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("callbacks received: %d, notify %+v, final %v", len(got), notified, final)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if notified.Message != want || notified.RequestID != id || notified.InstanceUUID != inst || notified.Rule != "tell-training-tenants" || notified.Kind != "GPU_REQUEST" {
		t.Errorf("notify callback %+v, want %q of rule tell-training-tenants for request %s, instance %s", notified, want, id, inst)
	}

	// The notification on RabbitMQ.
	payload := w.consumeNotification(notify.RoutingKey(topic, notify.Info), notify.PolicyNotify, 30*time.Second)
	var p notify.NotifyPayload
	testsvc.Must(t, json.Unmarshal(payload, &p), "notification payload")
	if p.Message != want || p.RequestID != id.String() || p.InstanceUUID != inst || p.ProjectID != w.project || p.Rule != "tell-training-tenants" {
		t.Errorf("vgpu.policy.notify payload %+v, want %q for request %s, instance %s of project %s", p, want, id, inst, w.project)
	}

	// And the audit row says both went.
	var detail string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT detail::text FROM audit_log WHERE request_id = $1 AND action = 'notify'`, id).Scan(&detail), "audit")
	if !strings.Contains(detail, `"callback": true`) || !strings.Contains(detail, notify.PolicyNotify) {
		t.Errorf("notify audit detail %s", detail)
	}
}

// submitWithCallback is submit with a callback URL, as a webhook request
// that names one.
func (w *world) submitWithCallback(typ, instance, callbackURL string, extra map[string]any) uuid.UUID {
	t := w.t
	id := uuid.New()
	inst := uuid.MustParse(instance)
	payload := map[string]any{"request_id": id, "source": "pipetest", "type": typ, "vm_id": instance, "callback_url": callbackURL}
	for k, v := range extra {
		payload[k] = v
	}
	body, _ := json.Marshal(payload)
	err := pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) error {
		if err := w.requests.Create(w.ctx, tx, requests.Request{ID: id, Source: "webhook:pipetest", Kind: typ, InstanceUUID: &inst, Body: body,
			CallbackURL: callbackURL}); err != nil {
			return err
		}
		_, err := tx.Exec(w.ctx, `INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload, request_id)
			VALUES ('webhook:pipetest', $1, $2, $3, now(), $4, $1)`, id.String(), typ, instance, body)
		return err
	})
	testsvc.Must(t, err, "submit request")
	return id
}

// consumeNotification reads queue until a notification of eventType
// comes and returns its versioned object's data, a VGPUNotifyPayload.
func (w *world) consumeNotification(queue, eventType string, within time.Duration) json.RawMessage {
	w.t.Helper()
	name, data := testsvc.ConsumeNotification(w.t, w.amqpURL, queue, eventType, within)
	if name != "VGPUNotifyPayload" {
		w.t.Errorf("%s payload object %s", eventType, name)
	}
	return data
}

// startRelay runs a bridge's notification relay on the world's database
// until the test ends, publishing on an exchange and topic of the test's
// own (named after prefix), and returns the topic; its queues go at the end.
func (w *world) startRelay(t *testing.T, prefix string) string {
	t.Helper()
	topic := testsvc.Name(prefix)
	relay, err := notify.New(notify.Config{Driver: notify.DriverMessagingV2, URLs: []string{w.amqpURL}, Exchange: topic,
		Topics: []string{topic}, DeclareQueues: true, PublisherID: "vgpu-bridge:pipetest", Poll: 200 * time.Millisecond,
		ConfirmTimeout: 5 * time.Second, ReconnectMin: 100 * time.Millisecond, ReconnectMax: time.Second, Replica: "r1"}, w.pool, nil, logger())
	testsvc.Must(t, err, "notification relay")
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	go func() { defer close(done); relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		testsvc.DeleteQueue(w.amqpURL, topic, notify.RoutingKey(topic, notify.Error))
		testsvc.DeleteQueue(w.amqpURL, topic, notify.RoutingKey(topic, notify.Info))
	})
	return topic
}
