package controls_test

import (
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

// TestWakeWithoutPoll: with the pipeline's inbox poll at its longest (one
// minute), notifications and webhooks still reach a decision at once:
// the commit that stores them wakes the pipeline, and agents' results
// move the request on directly. Without those wakes the request could not
// finish before the first poll, a minute after start.
func TestWakeWithoutPoll(t *testing.T) {
	f := newFleet(t)
	f.start("pipeline.poll_interval=1m", "pipeline.deadline_check_interval=1m")
	started := time.Now()
	a := f.hosts[0]
	f.startAgent(a)
	f.notifyCreates()
	id := f.request(a)
	var r apiclient.Request
	f.waitFor(40*time.Second, "request "+id+" succeeded before the first inbox poll", func() bool {
		var err error
		r, err = f.admin.Request(f.ctx, id)
		return err == nil && apiclient.FinalState(r.State)
	})
	if r.State != "succeeded" {
		t.Fatalf("request %s: %s (%s: %s), want succeeded", id, r.State, r.Code, r.Reason)
	}
	if since := time.Since(started); since >= time.Minute {
		t.Fatalf("the request took %s from the bridge's start: a poll, not a wake, may have decided it", since)
	}
}
