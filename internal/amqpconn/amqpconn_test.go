package amqpconn_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/amqpconn"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestDialFailsOver: a dead broker first in the list costs one refused
// dial, then the live one answers; with none alive the error names every
// broker and no password.
func TestDialFailsOver(t *testing.T) {
	live := testsvc.RabbitURL(t)
	dead := "amqp://guest:s3cret@127.0.0.1:1/"
	conn, k, err := amqpconn.Dial(amqpconn.Config{URLs: []string{dead, live}, Name: "amqpconn test", Timeout: 2 * time.Second}, 0)
	if err != nil {
		t.Fatalf("dial with one live broker: %v", err)
	}
	conn.Close()
	if k != 1 {
		t.Errorf("connected to broker %d, want 1 (the live one)", k)
	}
	_, _, err = amqpconn.Dial(amqpconn.Config{URLs: []string{dead, "amqp://u:s3cret@127.0.0.1:2/"}, Timeout: time.Second}, 1)
	if err == nil {
		t.Fatal("dial with no live broker succeeded")
	}
	msg := err.Error()
	if strings.Contains(msg, "s3cret") || !strings.Contains(msg, "127.0.0.1:1") || !strings.Contains(msg, "127.0.0.1:2") {
		t.Errorf("error %q: want both brokers named, no password", msg)
	}
}

func TestRedact(t *testing.T) {
	tests := map[string]string{
		"amqp://guest:pw@rabbit:5672/vhost": "amqp://guest@rabbit:5672/vhost",
		"amqps://rabbit/":                   "amqps://rabbit/",
		"::not a url":                       "<unparsable URL>",
	}
	for in, want := range tests {
		if got := amqpconn.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestLoop: sessions run again after they end, with waits that grow
// while they fail at once and start over after one that made progress;
// Run returns when its context ends.
func TestLoop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var waits []time.Duration
	var ns []int
	l := amqpconn.Loop{Backoff: backoff.Policy{Min: time.Millisecond, Max: 64 * time.Millisecond}, Healthy: time.Hour,
		Ended: func(err error, wait time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			waits = append(waits, wait)
		}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(ctx, func(ctx context.Context, n int) (bool, error) {
			mu.Lock()
			ns = append(ns, n)
			mu.Unlock()
			if n == 6 {
				cancel()
				return false, ctx.Err()
			}
			return n == 3, errors.New("refused") // session 3 delivered something
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ns) != 7 || ns[6] != 6 {
		t.Fatalf("sessions %v, want 0..6", ns)
	}
	if len(waits) != 6 {
		t.Fatalf("Ended called %d times, want 6 (not for the session the context ended)", len(waits))
	}
	// Jitter is ±25 %: compare attempt levels, not exact waits.
	if !(waits[2] > waits[0] && waits[3] < waits[2] && waits[5] > waits[3]) {
		t.Errorf("waits %v: want growth, a reset after session 3, growth again", waits)
	}
}
