package ingest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestOsloNotifier publishes every Nova sample with Debian's
// python3-oslo.messaging Notifier (tests/oslo_notify.py: driver messagingv2,
// the topic's .info and .error routing keys, a request context per
// message): the wire format is oslo's own.
func TestOsloNotifier(t *testing.T) {
	r := newRig(t)
	// A topic of the test's own: oslo declares a queue named like each
	// routing key, which the cleanup deletes.
	topic := testsvc.Name("vn")
	cfg := r.config(r.amqpURL)
	cfg.BindingKeys = []string{topic + ".info", topic + ".error"}
	r.declare(cfg)
	t.Cleanup(func() {
		conn, err := amqp.Dial(r.amqpURL)
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			for _, k := range cfg.BindingKeys {
				ch.QueueDelete(k, false, false, false) //nolint:errcheck
			}
		}
	})

	ss := samples(t)
	var in bytes.Buffer
	wantErrors := 0
	for i, s := range ss {
		var n map[string]any
		testsvc.Must(t, json.Unmarshal(s.JSON, &n), "sample")
		n["context"] = map[string]any{
			"request_id":        fmt.Sprintf("req-%08d-0000-4000-8000-000000000000", i),
			"global_request_id": fmt.Sprintf("req-global-%d", i),
			"project_id":        "6f70656e737461636b20342065766572",
			"user_id":           "fake",
			"roles":             []string{"admin"},
		}
		line, err := json.Marshal(n)
		testsvc.Must(t, err, "line")
		in.Write(line)
		in.WriteByte('\n')
		if n["priority"] == "ERROR" {
			wantErrors++
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "oslo_notify.py")
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", script,
		"--url", "rabbit://"+strings.TrimPrefix(r.amqpURL, "amqp://"), "--exchange", r.exchange, "--topic", topic)
	cmd.Stdin = &in
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C.UTF-8"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tests/oslo_notify.py (needs Debian's python3-oslo.messaging; `make services` installs it): %v\n%s", err, out)
	}
	if want := fmt.Sprintf("sent %d notification(s)", len(ss)); !strings.Contains(string(out), want) {
		t.Fatalf("publisher output %q, want %q", out, want)
	}

	r.start(cfg)
	r.waitCount(len(ss), 60*time.Second, `SELECT count(*) FROM events`)
	if n := r.count(`SELECT count(*) FROM dead_letters`); n != 0 {
		t.Errorf("%d dead letters from oslo's own messages", n)
	}
	if n := r.count(`SELECT count(*) FROM events WHERE priority = 'ERROR'`); n != wantErrors || wantErrors == 0 {
		t.Errorf("ERROR events %d, want %d", n, wantErrors)
	}
	if n := r.count(`SELECT count(*) FROM events WHERE request_id LIKE 'req-%' AND global_request_id LIKE 'req-global-%' AND user_id = 'fake'`); n != len(ss) {
		t.Errorf("events with the request context: %d, want %d", n, len(ss))
	}
	if n := r.count(`SELECT count(*) FROM events WHERE occurred_at > now() - interval '10 minutes' AND occurred_at < now() + interval '1 minute'`); n != len(ss) {
		t.Errorf("events with oslo's timestamp parsed: %d, want %d", n, len(ss))
	}
	if n := r.count(`SELECT count(*) FROM instances WHERE uuid = '178b0921-8f85-4257-88b6-2e743b5a975c'`); n != 1 {
		t.Errorf("instance not recorded")
	}
}
