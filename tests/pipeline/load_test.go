package pipeline_test

import (
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// loadRules: sustained load on the vGPU's own SM (the agent's report)
// raises its profile; a sustained idle one is given back.
const loadRules = `  - name: busy-raises
    on: [bridge.vgpu_load]
    when: metrics.gpu_util > 90.0 && instance.profile == "T4-4Q"
    for: 2s
    then: ['resize("T4-8Q")']
  - name: idle-releases
    on: [bridge.vgpu_load]
    when: metrics.gpu_util < 5.0 && instance.vgpu_count > 0
    for: 2s
    then: ['release()']
`

// TestAgentLoadDrivesRules: the agent reports each vGPU's load (NVML,
// scripted on the fake host); the bridge turns it into bridge.vgpu_load
// events, and the load rules close the loop with no outside monitor: a
// vGPU busy for 2 s moves to the bigger profile, then, idle for 2 s, is
// given back.
func TestAgentLoadDrivesRules(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testsvc.DirectPolicy(loadRules), withGPUB("CUSTOM_NVIDIA_233", 2, "")) // gpuB offers T4-8Q
	w.startBridge(replicaOpts{name: "r1", loadInterval: 300 * time.Millisecond})
	w.startAgent()
	inst := w.domains[3].UUID
	old := w.attachT44Q(inst)

	testsvc.Must(t, fakehost.SetVGPUCodecLoad(w.fake, old.id, 97, 35, 20), "script the load")
	up := w.loadRequest(inst, 0, 90*time.Second)
	if up.State != requests.Succeeded {
		t.Fatalf("load-driven resize %s: %s (%s: %s)", up.ID, up.State, up.Code, up.Reason)
	}
	atts := w.attachments(inst)
	var now []attachmentRow
	for _, a := range atts {
		if a.state == flow.AttAttached {
			now = append(now, a)
		}
	}
	if len(now) != 1 || now[0].pci != gpuB {
		t.Fatalf("attachments after the load-driven resize %+v, want one attached on %s (T4-8Q)", atts, gpuB)
	}
	var sm, enc, dec float64
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT (m->>'gpu_util')::float8, (m->>'enc_util')::float8, (m->>'dec_util')::float8
		FROM (SELECT e.payload->'metrics' AS m FROM events e JOIN decisions d ON d.event_id = e.id WHERE d.request_id = $1) x`,
		up.ID).Scan(&sm, &enc, &dec), "the deciding event")
	if sm != 97 || enc != 35 || dec != 20 {
		t.Errorf("the deciding event's gpu_util, enc_util, dec_util = %v, %v, %v; want the scripted 97, 35, 20", sm, enc, dec)
	}

	testsvc.Must(t, fakehost.SetVGPULoad(w.fake, now[0].id, 0), "script the load")
	down := w.loadRequest(inst, 1, 90*time.Second)
	if down.State != requests.Succeeded {
		t.Fatalf("idle release %s: %s (%s: %s)", down.ID, down.State, down.Code, down.Reason)
	}
	for _, a := range w.attachments(inst) {
		if a.state == flow.AttAttached || a.state == flow.AttPending {
			t.Errorf("after the idle release: %+v", a)
		}
	}
	if al := w.allocations(inst); al[w.gpus[gpuA]]["VGPU"]+al[w.gpus[gpuB]]["VGPU"] != 0 {
		t.Errorf("claims after the idle release: %v", al)
	}
}

// loadRequest waits until the n-th (from 0) request made for a
// bridge.vgpu_load event of instance has ended.
func (w *world) loadRequest(instance string, n int, within time.Duration) requests.Request {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var id string
		err := w.pool.QueryRow(w.ctx, `SELECT id::text FROM requests WHERE source = 'bridge' AND kind = 'vgpu_load' AND instance_uuid = $1
			AND state IN ('succeeded','failed','rejected') ORDER BY created_at OFFSET $2 LIMIT 1`, instance, n).Scan(&id)
		if err == nil {
			r, err := w.requests.Get(w.ctx, mustUUID(w.t, id))
			testsvc.Must(w.t, err, "request")
			return r
		}
		if time.Now().After(deadline) {
			var samples string
			w.pool.QueryRow(w.ctx, `SELECT coalesce(samples::text, '') FROM instance_load WHERE instance_uuid = $1`, instance).Scan(&samples)
			w.t.Fatalf("no finished load-driven request #%d for %s within %s (load window %s)", n, instance, within, samples)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
