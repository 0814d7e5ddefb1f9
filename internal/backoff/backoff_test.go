package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	p := Policy{Min: 100 * time.Millisecond, Max: time.Second}
	for _, tc := range []struct {
		n      int
		center time.Duration
	}{
		{0, 100 * time.Millisecond},
		{1, 200 * time.Millisecond},
		{2, 400 * time.Millisecond},
		{3, 800 * time.Millisecond},
		{4, time.Second},
		{60, time.Second}, // no overflow far past the cap
	} {
		lo := tc.center * (100 - Jitter) / 100
		hi := min(tc.center*(100+Jitter)/100, p.Max)
		for range 200 {
			if d := p.Delay(tc.n); d < lo || d > hi {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", tc.n, d, lo, hi)
			}
		}
	}
}

func TestNewDoublesToMax(t *testing.T) {
	b := Policy{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond}.New()
	var last time.Duration
	for i := range 10 {
		d, stop := b.Next()
		if stop || d <= 0 || d > 80*time.Millisecond {
			t.Fatalf("wait %d: %v (stop %v), want in (0, 80ms]", i, d, stop)
		}
		last = d
	}
	if last < 60*time.Millisecond {
		t.Errorf("after 10 waits: %v, want near the 80ms cap", last)
	}
}

func TestZeroPolicy(t *testing.T) {
	if d := (Policy{}).Delay(0); d <= 0 {
		t.Errorf("zero policy: %v, want a positive wait", d)
	}
}

func TestWaitEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Wait(ctx, Policy{Min: time.Hour, Max: time.Hour}.New()); err != context.Canceled {
		t.Fatalf("Wait on a cancelled context: %v, want context.Canceled", err)
	}
}
