package wake

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestWakerCoalesces(t *testing.T) {
	var w Waker
	for range 3 {
		w.Wake()
	}
	if !Wait(context.Background(), w.C(), time.Hour) {
		t.Fatal("Wait after Wake = false")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if Wait(ctx, w.C(), time.Hour) {
		t.Fatal("three wakes woke twice")
	}
}

func TestWait(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		wake <-chan struct{}
		d    time.Duration
		want bool
	}{
		{"interval passes", context.Background(), nil, time.Millisecond, true},
		{"no wait", context.Background(), nil, 0, true},
		{"no wait, ctx ended", done, nil, 0, false},
		{"ctx ended", done, nil, time.Hour, false},
		{"woken", context.Background(), wake, time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Wait(tc.ctx, tc.wake, tc.d); got != tc.want {
				t.Errorf("Wait = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLoop(t *testing.T) {
	t.Run("first round at once, then on wake", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var w Waker
		rounds := make(chan int, 10)
		n := 0
		done := make(chan error)
		go func() {
			done <- Loop(ctx, w.C(), func(context.Context) (time.Duration, error) {
				n++
				rounds <- n
				return time.Hour, nil
			})
		}()
		if got := <-rounds; got != 1 {
			t.Fatalf("round %d first", got)
		}
		w.Wake()
		if got := <-rounds; got != 2 {
			t.Fatalf("round %d after a wake", got)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Loop = %v after ctx ended", err)
		}
	})
	t.Run("zero delay runs again, error stops", func(t *testing.T) {
		boom := errors.New("boom")
		n := 0
		err := Loop(context.Background(), nil, func(context.Context) (time.Duration, error) {
			n++
			if n == 3 {
				return 0, boom
			}
			return 0, nil
		})
		if !errors.Is(err, boom) || n != 3 {
			t.Fatalf("Loop = %v after %d rounds, want boom after 3", err, n)
		}
	})
	t.Run("interval", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		n := 0
		start := time.Now()
		_ = Loop(ctx, nil, func(context.Context) (time.Duration, error) {
			if n++; n == 3 {
				cancel()
			}
			return 10 * time.Millisecond, nil
		})
		if el := time.Since(start); n != 3 || el < 20*time.Millisecond {
			t.Fatalf("%d rounds in %v, want 3 in ≥ 20ms", n, el)
		}
	})
	t.Run("ctx ended before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := Loop(ctx, nil, func(context.Context) (time.Duration, error) {
			t.Fatal("round ran after ctx ended")
			return 0, nil
		}); err != nil {
			t.Fatal(err)
		}
	})
}

func TestEvery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	var at []time.Duration
	Every(ctx, 10*time.Millisecond, func(context.Context) {
		if at = append(at, time.Since(start)); len(at) == 2 {
			cancel()
		}
	})
	if len(at) != 2 || at[0] < 10*time.Millisecond || at[1] < 20*time.Millisecond {
		t.Fatalf("rounds at %v, want 2, the first after 10ms", at)
	}
}
