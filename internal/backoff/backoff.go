// Package backoff is the one retry policy of vgpu-bridge and vgpu-agent:
// waits start at a minimum and double up to a maximum, each with ±25 %
// jitter so that replicas and agents do not retry in step. It is built on
// github.com/sethvargo/go-retry.
package backoff

import (
	"context"
	"time"

	retry "github.com/sethvargo/go-retry"
)

// Jitter is how far, in percent, a wait may stray either way.
const Jitter = 25

// Policy bounds the waits of a retry loop.
type Policy struct {
	Min, Max time.Duration
}

func (p Policy) bounds() (time.Duration, time.Duration) {
	lo, hi := p.Min, p.Max
	if lo <= 0 {
		lo = 10 * time.Millisecond
	}
	return lo, max(hi, lo)
}

// New returns the waits of one retry loop: Min, 2·Min, 4·Min … up to Max,
// jittered, never above Max. It is safe for concurrent use.
func (p Policy) New() retry.Backoff {
	lo, hi := p.bounds()
	return retry.WithCappedDuration(hi, retry.WithJitterPercent(Jitter, retry.NewExponential(lo)))
}

// Delay is the wait before retry n (0 for the first) of a loop that keeps
// its own count, such as one stored in a database row across restarts.
func (p Policy) Delay(n int) time.Duration {
	lo, hi := p.bounds()
	exp := retry.NewExponential(lo)
	var d time.Duration
	for i := 0; i <= n; i++ {
		if d, _ = exp.Next(); d >= hi {
			break
		}
	}
	fixed := retry.BackoffFunc(func() (time.Duration, bool) { return d, false })
	d, _ = retry.WithCappedDuration(hi, retry.WithJitterPercent(Jitter, fixed)).Next()
	return d
}

// Wait sleeps for b's next wait, or until ctx ends (its error then).
func Wait(ctx context.Context, b retry.Backoff) error {
	d, _ := b.Next()
	return Sleep(ctx, d)
}

// Sleep sleeps for d, or until ctx ends (its error then).
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
