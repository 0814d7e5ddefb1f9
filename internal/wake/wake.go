// Package wake runs a round of work now, again when woken, and at the
// latest after a poll interval: the loop of the bridge's relays, pollers
// and reconcilers.
//
//	var w wake.Waker // others call w.Wake() after they queued work
//	wake.Loop(ctx, w.C(), func(ctx context.Context) (time.Duration, error) {
//		n, err := relayOnce(ctx)
//		if n == batch {
//			return 0, err // more may be waiting
//		}
//		return interval, err
//	})
package wake

import (
	"context"
	"sync"
	"time"
)

// Waker coalesces wake-ups: any number of Wake calls before the next wait
// wake it once. The zero Waker is ready to use; it must not be copied
// after first use.
type Waker struct {
	once sync.Once
	c    chan struct{}
}

func (w *Waker) ch() chan struct{} {
	w.once.Do(func() { w.c = make(chan struct{}, 1) })
	return w.c
}

// Wake wakes the next wait on C, or the one in progress; it never blocks.
func (w *Waker) Wake() {
	select {
	case w.ch() <- struct{}{}:
	default:
	}
}

// C is the channel a Wake call fills.
func (w *Waker) C() <-chan struct{} { return w.ch() }

// Wait blocks until wake fires or d has passed (true), or ctx ends
// (false). A nil wake never fires; d ≤ 0 does not wait.
func Wait(ctx context.Context, wake <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-wake:
	}
	return true
}

// Loop calls round at once, then again each time wake fires or the delay
// the last round returned has passed (0: at once), until ctx ends (nil)
// or round fails (its error; a round that wants to go on after an error
// logs it and returns nil).
func Loop(ctx context.Context, wake <-chan struct{}, round func(ctx context.Context) (time.Duration, error)) error {
	for ctx.Err() == nil {
		next, err := round(ctx)
		if err != nil {
			return err
		}
		if !Wait(ctx, wake, next) {
			break
		}
	}
	return nil
}

// Every calls round each time d has passed, the first time after d (not
// at once), until ctx ends.
func Every(ctx context.Context, d time.Duration, round func(ctx context.Context)) {
	for Wait(ctx, nil, d) {
		round(ctx)
	}
}
