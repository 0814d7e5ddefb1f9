package ingest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

func TestRedactTokens(t *testing.T) {
	for _, in := range []string{
		`{"_context_auth_token": "gAAAAABsecret", "x": 1}`,
		`{"oslo.message": "{\"_context_auth_token\": \"gAAAAABsecret\", \"x\": 1}"}`,
		`{"oslo.message": "{\"_context_auth_token\":\"gAAAAABsecret\"}"`,
	} {
		out := string(redactTokens([]byte(in)))
		if strings.Contains(out, "gAAAAABsecret") || !strings.Contains(out, "***") {
			t.Errorf("redactTokens(%s) = %s", in, out)
		}
	}
}

func TestHasEscapedNUL(t *testing.T) {
	for in, want := range map[string]bool{
		`{"a":"\u0000"}`:   true,
		`{"a":"x\u0000y"}`: true,
		`{"a":"\\u0000"}`:  false,
		`{"a":"\\\u0000"}`: true,
		`{"a":"\u00001"}`:  true,
		`{"a":"u0000"}`:    false,
		`{"a":"\u0001"}`:   false,
		`\u0000`:           true,
		`\u000`:            false,
		`\\\\u0000`:        false,
		`xx\\\\\u0000`:     true,
	} {
		if got := hasEscapedNUL([]byte(in)); got != want {
			t.Errorf("hasEscapedNUL(%s) = %v, want %v", in, got, want)
		}
	}
}

func TestValidate(t *testing.T) {
	c := DefaultConfig()
	c.URLs = []string{"amqp://localhost/"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Queue = "versioned_notifications.info"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "oslo.messaging declares") {
		t.Errorf("queue named like a routing key: %v", err)
	}
	c = DefaultConfig()
	c.URLs = []string{"amqp://localhost/"}
	c.Prefetch = 10
	if err := c.Validate(); err == nil {
		t.Error("prefetch below batch size accepted")
	}
}

func newTestConsumer() *Consumer {
	cfg := DefaultConfig()
	cfg.MaxMessageBytes = 2048
	cfg.DeadLetterMaxBytes = 16
	return &Consumer{cfg: cfg, m: newMetrics(nil, func() float64 { return 0 }, func() float64 { return 0 })}
}

func TestDecodeDelivery(t *testing.T) {
	c := newTestConsumer()
	c.log = discard
	good := func(id, eventType, version string) []byte {
		b, err := nova.WireMessage([]byte(`{"event_type":"`+eventType+`","priority":"INFO","publisher_id":"nova-compute:h1",
			"payload":{"nova_object.name":"InstanceActionPayload","nova_object.namespace":"nova","nova_object.version":"`+version+`",
			"nova_object.data":{"uuid":"178b0921-8f85-4257-88b6-2e743b5a975c","host":"h1"}}}`), id, time.Unix(1714564800, 0))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name, reason, status string
		body                 []byte
	}{
		{"ok", "", "", good("1", "instance.power_on.end", "1.9")},
		{"unknown event", "", "unrecognized", good("2", "instance.teleport.end", "1.9")},
		{"unknown major", "", "unrecognized", good("3", "instance.power_on.end", "2.0")},
		{"oversize", ReasonOversize, "", []byte(`{"x":"` + strings.Repeat("y", 3000) + `"}`)},
		{"not json", ReasonNotJSON, "", []byte("nope")},
		{"nul", ReasonSchema, "", []byte(strings.Replace(string(good("4", "instance.power_on.end", "1.9")), `\"host\":\"h1\"`, `\"host\":\"h\\u0000\"`, 1))},
	} {
		it := c.decode(&amqp.Delivery{DeliveryTag: 7, Body: tc.body})
		switch {
		case tc.reason != "":
			if it.ev != nil || it.reason != tc.reason {
				t.Errorf("%s: reason %q, want %q (ev %v)", tc.name, it.reason, tc.reason, it.ev)
			}
			if len(it.raw) > 16 || (len(tc.body) > 16) != it.truncated {
				t.Errorf("%s: raw not capped: %d bytes, truncated %v", tc.name, len(it.raw), it.truncated)
			}
		case it.ev == nil:
			t.Errorf("%s: dead letter %s: %s", tc.name, it.reason, it.detail)
		case it.ev.Status != tc.status:
			t.Errorf("%s: status %q, want %q (%s)", tc.name, it.ev.Status, tc.status, it.ev.Detail)
		case it.ev.InstanceUUID != "178b0921-8f85-4257-88b6-2e743b5a975c" && tc.status == "":
			t.Errorf("%s: instance uuid %q", tc.name, it.ev.InstanceUUID)
		}
	}
}

type captureHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}
func (h *captureHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *captureHandler) WithGroup(string) slog.Handler      { return h }

func TestSilenceHint(t *testing.T) {
	h := &captureHandler{}
	c := newTestConsumer()
	c.log = slog.New(h)
	c.cfg.SilenceWarning = 40 * time.Millisecond
	c.started = time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.watchSilence(ctx); close(done) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	<-done
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.msgs) != 1 {
		t.Fatalf("%d hints, want exactly 1 per silent period: %q", len(h.msgs), h.msgs)
	}
	for _, want := range []string{"notification_format = versioned", "driver = messagingv2"} {
		if !strings.Contains(h.msgs[0], want) {
			t.Errorf("hint %q does not name %q", h.msgs[0], want)
		}
	}
}

// Nova 26's rebuild.end of an evacuation names the source (the instance
// before finish_evacuation): the destination that sent it is where the
// instance is, its node to be read from the hosts table. Other events,
// and a rebuild on the same host, keep their payload's host and node.
func TestEvacuatedTo(t *testing.T) {
	src, node := "src", "src.node"
	in := &nova.Instance{Host: &src, Node: &node}
	for _, tc := range []struct {
		name       string
		m          nova.Message
		host       string
		nodeKnown  bool
		sameObject bool
	}{
		{"evacuation", nova.Message{EventType: "instance.rebuild.end", Service: "nova-compute", Host: "dst"}, "dst", false, false},
		{"rebuild in place", nova.Message{EventType: "instance.rebuild.end", Service: "nova-compute", Host: "src"}, "src", true, true},
		{"rebuild.start", nova.Message{EventType: "instance.rebuild.start", Service: "nova-compute", Host: "dst"}, "src", true, true},
		{"from the conductor", nova.Message{EventType: "instance.rebuild.end", Service: "nova-conductor", Host: "dst"}, "src", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := evacuatedTo(&tc.m, in)
			if *got.Host != tc.host || (got.Node != nil) != tc.nodeKnown || (got == in) != tc.sameObject {
				t.Errorf("evacuatedTo = host %s node %v (same %v)", *got.Host, got.Node, got == in)
			}
		})
	}
	if *in.Host != src || in.Node == nil {
		t.Errorf("the payload's instance changed: %+v", in)
	}
}
