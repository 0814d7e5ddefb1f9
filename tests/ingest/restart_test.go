package ingest_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestRabbitRestartDuringNotifications stops a private RabbitMQ node
// (a clean SIGTERM stop, not a cut connection) under a whole vgpu-bridge while
// 20,000 Nova notifications arrive, and starts it again. The bridge
// reconnects by itself (readiness names the broker meanwhile, and is back
// after), and exactly the sent set ends in the inbox: the publisher
// resends what the broker had not confirmed, the inbox keeps each
// message_id once.
func TestRabbitRestartDuringNotifications(t *testing.T) {
	const n = 20_000
	rb := testsvc.NewPrivateRabbit(t)
	proc, pool, count := bridgeOn(t, rb.URL)
	proc.Start()
	base := time.Now().UTC()
	var sent, resent atomic.Int64
	done := make(chan error, 1)
	go func() {
		var ch *amqp.Channel
		connect := func() {
			for {
				conn, err := amqp.Dial(rb.URL)
				if err == nil {
					if ch, err = conn.Channel(); err == nil && ch.Confirm(false) == nil {
						return
					}
					conn.Close()
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		connect()
		for start := 0; start < n; {
			end := min(start+500, n)
			ok := true
			var confs []*amqp.DeferredConfirmation
			for i := start; i < end && ok; i++ {
				uuid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i%997)
				b := instanceMsg(t, fmt.Sprintf("restart-%06d", i), "instance.update", uuid, "active", "h1", nil, base.Add(time.Duration(i)*time.Microsecond))
				dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "nova", "versioned_notifications.info", false, false,
					amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: b})
				ok = err == nil
				confs = append(confs, dc)
			}
			for _, c := range confs {
				if !ok || c == nil {
					break
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				acked, err := c.WaitContext(ctx)
				cancel()
				ok = err == nil && acked
			}
			if !ok { // the node went away: send the whole chunk again
				resent.Add(int64(end - start))
				connect()
				continue
			}
			sent.Add(int64(end - start))
			start = end
		}
		done <- nil
	}()
	deadline := time.Now().Add(3 * time.Minute)
	for count() < n/3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d notifications stored after 3m", count(), n/3)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rb.Stop()
	stopped := time.Now()
	detail := proc.WaitReadyz(http.StatusServiceUnavailable, 30*time.Second)
	rb.Start()
	proc.WaitReadyz(http.StatusOK, 2*time.Minute)
	back := time.Since(stopped)
	testsvc.Must(t, <-done, "publish")
	deadline = time.Now().Add(3 * time.Minute)
	for count() < n && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	var total, distinct int
	testsvc.Must(t, pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT message_id) FROM events WHERE source = 'nova'`).Scan(&total, &distinct), "events")
	t.Logf("sent %d (%d sent again after the restart), recorded %d, lost %d, doubled %d; broker stopped and the bridge ready again in %.1f s "+
		"(readiness meanwhile: %q); peak RSS %s", sent.Load(), resent.Load(), distinct, n-distinct, total-distinct, back.Seconds(), detail, proc.PeakNow())
	if !strings.Contains(detail, "broker") && !strings.Contains(detail, "rabbit") && !strings.Contains(detail, "notifications") {
		t.Errorf("readiness while the broker is down: %q, want it to name the broker", detail)
	}
	if sent.Load() != n || distinct != n || total != n {
		t.Errorf("sent %d, recorded %d distinct of %d rows; want %d each once\n%s", sent.Load(), distinct, total, n, proc.Log(30))
	}
}
