package ingest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestReadyFirstCheckAfterRecovery: while commits fail, Ready reports it;
// once Postgres takes them again, the first check is ready, even though
// the consumer's retry backoff (here 30 s and more) has not run out: the
// check drives the retry instead of reporting a stale state.
func TestReadyFirstCheckAfterRecovery(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	cfg.StallAfter = 200 * time.Millisecond
	cfg.ReconnectMin, cfg.ReconnectMax = 30*time.Second, time.Minute
	r.declare(cfg)
	_, err := r.pool.Exec(context.Background(), `
		CREATE FUNCTION refuse_events() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN RAISE EXCEPTION 'database away (test)' USING ERRCODE = '57P03'; END $$;
		CREATE TRIGGER refuse_events BEFORE INSERT ON events FOR EACH STATEMENT EXECUTE FUNCTION refuse_events()`)
	testsvc.Must(t, err, "create trigger")
	r.publish(infoKey, instanceMsg(t, "held", "instance.update", "7d8c0f4e-4a55-4a0c-8f0f-3f8a6d2b9c11", "active", "h1", nil, time.Now()))
	run := r.start(cfg)
	waitFor(t, 30*time.Second, "Ready to fail while commits fail", func() bool {
		err := run.c.Ready(context.Background())
		return err != nil && strings.Contains(err.Error(), "database away (test)")
	})
	_, err = r.pool.Exec(context.Background(), `DROP TRIGGER refuse_events ON events`)
	testsvc.Must(t, err, "drop trigger")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := run.c.Ready(ctx); err != nil {
		t.Fatalf("first check after the database takes commits again: %v; want ready", err)
	}
	if n := r.count(`SELECT count(*) FROM events WHERE message_id = 'held'`); n != 1 {
		t.Errorf("%d events of the held message after the check, want 1", n)
	}
}
