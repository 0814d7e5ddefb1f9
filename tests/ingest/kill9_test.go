package ingest_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestKill9DuringNotifications publishes 50,000 Nova notifications to a
// whole vgpu-bridge (a subprocess, in a RabbitMQ vhost of its own) and
// kills it with SIGKILL three times while they arrive, starting it again
// each time. Exactly the sent set ends in the inbox: none lost, none
// doubled, none dead-lettered. It logs the figures, with the peak RSS of
// each process.
func TestKill9DuringNotifications(t *testing.T) {
	const n = 50_000
	vh := testsvc.PrivateVHost(t)
	proc, pool, count := bridgeOn(t, vh)

	proc.Start() // declares exchange nova and binds its queue

	conn, err := amqp.Dial(vh)
	testsvc.Must(t, err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	testsvc.Must(t, err, "channel")
	testsvc.Must(t, ch.Confirm(false), "confirm mode")
	base := time.Now().UTC()
	var sent atomic.Int64
	published := make(chan error, 1)
	began := time.Now()
	go func() {
		var confs []*amqp.DeferredConfirmation
		for i := range n {
			uuid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i%997)
			b := instanceMsg(t, fmt.Sprintf("kill9-%06d", i), "instance.update", uuid, "active", "h1", nil, base.Add(time.Duration(i)*time.Microsecond))
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "nova", "versioned_notifications.info", false, false,
				amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: b})
			if err != nil {
				published <- err
				return
			}
			confs = append(confs, dc)
			if len(confs) == 500 || i == n-1 {
				for _, c := range confs {
					if ok, err := c.WaitContext(context.Background()); err != nil || !ok {
						published <- fmt.Errorf("confirm: %v %v", ok, err)
						return
					}
				}
				sent.Add(int64(len(confs)))
				confs = confs[:0]
			}
		}
		published <- nil
	}()
	for _, at := range []int{n / 5, n / 2, 4 * n / 5} {
		deadline := time.Now().Add(3 * time.Minute)
		for count() < at {
			if time.Now().After(deadline) {
				t.Fatalf("only %d of %d notifications stored after 3m (sent %d)", count(), at, sent.Load())
			}
			time.Sleep(20 * time.Millisecond)
		}
		proc.Kill9()
		proc.Start()
	}
	testsvc.Must(t, <-published, "publish")
	deadline := time.Now().Add(3 * time.Minute)
	for count() < n && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	elapsed := time.Since(began)
	var total, distinct, dead int
	testsvc.Must(t, pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT message_id) FROM events WHERE source = 'nova'`).Scan(&total, &distinct), "events")
	testsvc.Must(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM dead_letters`).Scan(&dead), "dead letters")
	proc.Kill9()
	t.Logf("sent %d, recorded %d, lost %d, doubled %d, dead-lettered %d; 3 × kill -9; %.1f s; peak RSS per process %s",
		sent.Load(), distinct, int(sent.Load())-distinct, total-distinct, dead, elapsed.Seconds(), strings.Join(proc.Peaks, ", "))
	if sent.Load() != n || distinct != n || total != n || dead != 0 {
		t.Errorf("sent %d, recorded %d distinct of %d rows, %d dead letters; want %d, each once\n%s", sent.Load(), distinct, total, dead, n,
			proc.Log(30))
	}
}

// bridgeOn prepares a whole vgpu-bridge (a subprocess, not started) on a
// fresh database, taking Nova's notifications from the broker at amqpURL,
// and returns it with its database and a count of the notifications in
// its inbox.
func bridgeOn(t *testing.T, amqpURL string) (*testbridge.Proc, *pgxpool.Pool, func() int) {
	t.Helper()
	dbURL := testsvc.MigratedPostgres(t)
	pool := testsvc.Pool(t, dbURL)
	proc := testbridge.NewProc(t, dbURL, "", "DEFAULT.transport_url=rabbit://"+strings.TrimPrefix(amqpURL, "amqp://"),
		"notifications.queue="+testsvc.Name("vgpu-bridge-fault"))
	count := func() int {
		var c int
		testsvc.Must(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE source = 'nova'`).Scan(&c), "count")
		return c
	}
	return proc, pool, count
}
