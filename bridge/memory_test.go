package bridge

import (
	"context"
	"testing"
	"time"
)

// TestReturnLoadMemory: the memory of the first load goes back once it is
// over, and the step ends with the bridge even if it never is.
func TestReturnLoadMemory(t *testing.T) {
	loaded := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- returnLoadMemory(context.Background(), loaded) }()
	select {
	case <-done:
		t.Fatal("returned before the load")
	case <-time.After(50 * time.Millisecond):
	}
	close(loaded)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still waiting after the load")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := returnLoadMemory(ctx, make(chan struct{})); err != nil {
		t.Fatal(err)
	}
}
