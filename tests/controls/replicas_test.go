package controls_test

import (
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestTwoReplicas: switches set through one replica hold the other: a
// pause through replica 2 holds replica 1's pipeline, a drain through
// replica 2 reaches replica 1's placement decisions at once (NOTIFY, not
// the hour-long sync rounds), and a resume through replica 1 lets the
// held request complete.
func TestTwoReplicas(t *testing.T) {
	f := newFleet(t)
	f.start()
	a := f.hosts[0]
	f.startAgent(a)
	f.notifyCreates()
	d2, _ := f.launch()
	url2 := "http://" + d2.API.Addr()
	admin2 := apiclient.New(apiclient.Config{URL: url2, Token: testbridge.AdminToken, Timeout: 30 * time.Second})

	_, err := admin2.SetControls(f.ctx, apiclient.ControlsChange{Paused: ptr(true), Reason: "two replicas"})
	testsvc.Must(t, err, "pause through replica 2")
	f.waitFor(30*time.Second, "replica 1's paused gauge", func() bool { return f.metric("vgpu_bridge_controls_paused") == 1 })
	id := f.request(a)
	const polls = `vgpu_bridge_controls_held_total{part="pipeline"}`
	h1, h2 := f.metric(polls), f.metricAt(url2, polls)
	f.waitFor(30*time.Second, "two held inbox polls on each replica", func() bool {
		return f.metric(polls) >= h1+2 && f.metricAt(url2, polls) >= h2+2
	})
	r, err := f.admin.Request(f.ctx, id)
	testsvc.Must(t, err, "request")
	if r.State != "accepted" {
		t.Fatalf("paused through replica 2: request %s on replica 1, want accepted", r.State)
	}

	_, err = admin2.SetDrain(f.ctx, apiclient.DrainHost, a.name, "replica test", true)
	testsvc.Must(t, err, "drain through replica 2")
	f.waitFor(30*time.Second, "replica 1 leaves the drained host out", func() bool { return dryRun(t, f, a.node) == 0 })
	_, err = admin2.SetDrain(f.ctx, apiclient.DrainHost, a.name, "", false)
	testsvc.Must(t, err, "undrain through replica 2")
	f.waitFor(30*time.Second, "replica 1 places on the host again", func() bool { return dryRun(t, f, a.node) > 0 })

	_, err = f.admin.SetControls(f.ctx, apiclient.ControlsChange{Paused: ptr(false), Reason: "two replicas done"})
	testsvc.Must(t, err, "resume through replica 1")
	if r := f.final(id); r.State != "succeeded" {
		t.Fatalf("after resume: %s %s %q, want succeeded", r.State, r.Code, r.Reason)
	}
	f.waitFor(30*time.Second, "replica 2's paused gauge back to 0", func() bool { return f.metricAt(url2, "vgpu_bridge_controls_paused") == 0 })
}
