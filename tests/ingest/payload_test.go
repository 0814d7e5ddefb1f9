package ingest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestPayloadsOfABatch: the payloads of one batch go to Postgres as one
// byte string cut by offset; each event keeps its own, byte lengths and
// characters of several bytes (é, ☃, 😀) included, and nothing of its
// neighbours.
func TestPayloadsOfABatch(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	cfg.BatchSize, cfg.Prefetch, cfg.Committers = 64, 64, 1
	cfg.FlushInterval = 200 * time.Millisecond
	r.declare(cfg)

	base := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	names := []string{"", "a", "café", "☃ snow", strings.Repeat("é", 300), "😀" + strings.Repeat("x", 2000), `quote " and \ backslash`}
	var bodies [][]byte
	want := map[string]string{} // message id → payload, as Decode gives it
	for i := range 40 {
		id := fmt.Sprintf("payload-%02d", i)
		uuid := fmt.Sprintf("%08x-0000-4000-8000-000000000000", i)
		md := map[string]any{"name": names[i%len(names)]}
		b := instanceMsgMeta(t, id, "instance.power_on.end", uuid, "active", "h1", nil, md, base.Add(time.Duration(i)*time.Second))
		m, err := nova.Decode(b)
		testsvc.Must(t, err, "decode")
		want[id] = string(m.RawPayload)
		bodies = append(bodies, b)
	}
	r.publish(infoKey, bodies...)
	r.start(cfg)
	r.waitCount(len(want), 60*time.Second, `SELECT count(*) FROM events WHERE message_id LIKE 'payload-%'`)
	for id, p := range want {
		if n := r.count(`SELECT count(*) FROM events WHERE message_id = $1 AND payload::jsonb = $2::jsonb`, id, p); n != 1 {
			var got string
			_ = r.pool.QueryRow(context.Background(), `SELECT payload::text FROM events WHERE message_id = $1`, id).Scan(&got)
			t.Errorf("%s: stored payload %.200s…, want %.200s…", id, got, p)
		}
	}
}
