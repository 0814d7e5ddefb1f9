package pipeline_test

import (
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// eventsProcessed waits until the instance's Nova events of eventType
// (want of them) are all processed.
func (m *moveWorld) eventsProcessed(instance, eventType string, want int) {
	m.t.Helper()
	m.waitFor(60*time.Second, eventType+" processed", func() bool {
		var open, all int
		testsvc.Must(m.t, m.pool.QueryRow(m.ctx, `SELECT count(*) FILTER (WHERE processed_at IS NULL), count(*) FROM events
			WHERE instance_uuid = $1 AND source = 'nova' AND event_type = $2`, instance, eventType).Scan(&open, &all), "events")
		return open == 0 && all == want
	})
}

// TestRebuildSameHostReattaches: Nova rebuilds an instance with a
// direct-path vGPU on its own host (instance.rebuild.end, host unchanged,
// allocations kept): the domain is recreated from Nova's definition
// without the bridge's device, so the bridge attaches the same mdev again
// (one request, one attach_vgpu) and claims nothing new. A later
// rebuild.end on another host (an evacuation, Nova rewrote the
// allocations) is still a move: released on A, applied again on B.
func TestRebuildSameHostReattaches(t *testing.T) {
	m := newMoveWorld(t)
	m.start()
	inst := m.domains[3].UUID
	old := m.attachOnA(inst)
	const ev = "instance.rebuild.end"

	m.novaRedefinesOnA(inst)
	m.notify(ev, inst, m.host, m.node, "active")
	m.eventsProcessed(inst, ev, 1)
	var n int
	testsvc.Must(t, m.pool.QueryRow(m.ctx, `SELECT count(*) FROM requests WHERE source = 'nova' AND kind = $1 AND instance_uuid = $2`,
		ev, inst).Scan(&n), "requests")
	if n != 1 {
		t.Fatalf("%d requests for the same-host %s, want 1 (a re-attach)", n, ev)
	}
	reqs := m.moveRequests(inst, ev, 1)
	r, ok := reqs[""]
	if !ok {
		t.Fatalf("requests %v: want one re-attach, not half of a move", reqs)
	}
	if r.State != requests.Succeeded {
		t.Errorf("re-attach request: %s (%s: %s)", r.State, r.Code, r.Reason)
	}
	var kinds string
	testsvc.Must(t, m.pool.QueryRow(m.ctx, `SELECT coalesce(string_agg(kind || ':' || coalesce(result_status, '-') || ':' || coalesce(body->'params'->>'mdev_uuid', '-'), ',' ORDER BY created_at), '')
		FROM commands WHERE request_id = $1`, r.ID).Scan(&kinds), "commands")
	if want := "attach_vgpu:succeeded:" + old.id; kinds != want {
		t.Errorf("commands of the re-attach: %q, want %q", kinds, want)
	}
	a := m.atts(inst)
	if len(a) != 1 || a[0].id != old.id || a[0].state != flow.AttAttached || a[0].host != m.host || a[0].provider != old.provider {
		t.Errorf("attachments after the rebuild: %+v, want only %+v", a, old)
	}
	al := m.allocations(inst)
	if vgpuUnits(al) != 1 || al[old.provider]["VGPU"] != 1 {
		t.Errorf("allocations after the rebuild: %v, want 1 VGPU on %s", al, old.provider)
	}
	if !m.mdevOn(m.fake, old.id) {
		t.Errorf("mdev %s gone from host A", old.id)
	}
	m.reportedOn(m.host, old.id, inst)

	// Evacuation: the same event on another host moves the vGPU.
	m.novaLeavesA(inst)
	m.novaAllocations(inst, m.rootB)
	m.notify(ev, inst, m.hostB, m.nodeB, "active")
	reqs = m.moveRequests(inst, ev, 3)
	for _, half := range []string{"release", "reapply"} {
		if r, ok := reqs[half]; !ok || r.State != requests.Succeeded {
			t.Errorf("%s request of the evacuation: %+v", half, r)
		}
	}
	m.checkOnB(inst, old)
}
