package pipeline_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// followUpRules tune and limit the VM after every change the bridge
// makes; the second rule would change vGPUs on the bridge's own event,
// which the pipeline refuses (it would loop).
const followUpRules = `  - name: follow-up-after-change
    on: [bridge.vgpu_changed]
    when: event.labels.change != "release" && event.workload == "training"
    then: ['set_limits("800000 100000", "64G")', 'tune("best_effort", 0, 0)']
  - name: would-loop
    on: [bridge.vgpu_changed]
    then: ['attach("T4-4Q", 1)']
`

// TestTuningFollowsChanges: after the bridge attaches a vGPU, its
// bridge.vgpu_changed event runs the operator's follow-up rule with the
// vGPU's GPU known: the VM's cgroup limits are set and the GPU's
// scheduler is applied (a GPU already on the wanted scheduler takes it
// though vGPUs run); the rule that would attach again is refused. A
// release writes the event too (change=release).
func TestTuningFollowsChanges(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testsvc.DirectPolicy(testsvc.RuleReleaseOnRequest, followUpRules))
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	inst := w.domains[3].UUID // instance-00000004, running, no vGPU

	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q", "count": 1, "workload": "training"})
	if r := w.wait(id, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("request %s: %s (%s: %s)", id, r.State, r.Code, r.Reason)
	}
	atts := w.attachments(inst)
	if len(atts) != 1 {
		t.Fatalf("attachments %+v, want one", atts)
	}

	follow := w.bridgeRequest(inst, 1, 60*time.Second)
	if follow.State != requests.Succeeded {
		t.Fatalf("follow-up request %s: %s (%s: %s)", follow.ID, follow.State, follow.Code, follow.Reason)
	}
	var kinds, gpu string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT string_agg(kind || ':' || coalesce(result_status, '-'), ',' ORDER BY seq),
			coalesce(max(body->'params'->>'gpu_pci'), '')
		FROM commands WHERE request_id = $1`, follow.ID).Scan(&kinds, &gpu), "commands")
	if kinds != "set_vm_limits:succeeded,set_vgpu_scheduler:succeeded" || gpu != atts[0].pci {
		t.Errorf("follow-up commands %s on GPU %q, want set_vm_limits and set_vgpu_scheduler succeeded on the vGPU's GPU %s", kinds, gpu, atts[0].pci)
	}
	if got := w.cgroupFile("instance-00000004", "cpu.max"); got != "800000 100000" {
		t.Errorf("cpu.max of the VM = %q, want 800000 100000", got)
	}
	var refused string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT coalesce(d.decision->'refused'->0->>'reason', '') FROM decisions d WHERE d.request_id = $1`,
		follow.ID).Scan(&refused), "decision")
	if !strings.Contains(refused, "would-loop") || !strings.Contains(refused, "not attach vGPUs") {
		t.Errorf("the looping rule's refusal: %q", refused)
	}
	if n := len(w.attachments(inst)); n != 1 {
		t.Errorf("%d attachments after the follow-up, want still 1", n)
	}

	// A release is a change too: its event says so, and the follow-up rule
	// (not for releases) does nothing.
	rel := w.submit("GPU_RELEASE", inst, nil)
	if r := w.wait(rel, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("release %s: %s (%s: %s)", rel, r.State, r.Code, r.Reason)
	}
	w.waitEvent(inst, "release", 30*time.Second)
}

// bridgeRequest waits (within) until the n-th request made for the
// bridge's own events of instance has ended, and returns it.
func (w *world) bridgeRequest(instance string, n int, within time.Duration) requests.Request {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var id string
		err := w.pool.QueryRow(w.ctx, `SELECT id::text FROM requests WHERE source = 'bridge' AND instance_uuid = $1
			AND state IN ('succeeded','failed','rejected') ORDER BY created_at OFFSET $2 LIMIT 1`, instance, n-1).Scan(&id)
		if err == nil {
			r, err := w.requests.Get(w.ctx, mustUUID(w.t, id))
			testsvc.Must(w.t, err, "request")
			return r
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("no finished request for the bridge's event of %s within %s", instance, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitEvent waits until a processed bridge.vgpu_changed event of
// instance says change.
func (w *world) waitEvent(instance, change string, within time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var n int
		testsvc.Must(w.t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM events WHERE source = 'bridge' AND event_type = 'vgpu_changed'
			AND instance_uuid = $1 AND payload->>'change' = $2 AND payload->>'path' = 'direct' AND processed_at IS NOT NULL`, instance, change).Scan(&n), "events")
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("no processed bridge.vgpu_changed event (change %s) of %s within %s", change, instance, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cgroupFile reads a cgroup file of a domain's scope on the fake host.
func (w *world) cgroupFile(domain, name string) string {
	w.t.Helper()
	var found string
	_ = filepath.WalkDir(w.fake, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == name && strings.Contains(p, strings.TrimPrefix(domain, "instance-")) {
			found = p
			return fs.SkipAll
		}
		return nil
	})
	if found == "" {
		w.t.Fatalf("no %s of domain %s under %s", name, domain, w.fake)
	}
	b, err := os.ReadFile(found)
	testsvc.Must(w.t, err, "cgroup file")
	return strings.TrimSpace(string(b))
}

// TestGuestDriverTooNew: a request whose guest driver (the webhook's
// guest_driver, or the server metadata's) is of a newer branch than the host's vGPU manager is
// refused, citing NVIDIA's compatibility rule (such a guest shows code
// 43), and nothing is claimed; one of the host's branch is served.
func TestGuestDriverTooNew(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testsvc.DirectPolicy())
	// The bridge first: the agent's first report, sent as it starts, then
	// finds the bridge's reports queue.
	w.startBridge(replicaOpts{name: "r1"})
	w.startAgent()
	inst := w.domains[3].UUID // on the fake host, whose vGPU manager is 550.54.16
	w.waitReport(60 * time.Second)

	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q", "count": 1, "workload": "training", "guest_driver": "570.86.15"})
	r := w.wait(id, 60*time.Second)
	if r.State != requests.Rejected || !strings.Contains(r.Reason, "570.86.15") || !strings.Contains(r.Reason, "branch 550") || !strings.Contains(r.Reason, "code 43") {
		t.Fatalf("request with a too-new guest driver: %s (%s: %s); want rejected citing the branch rule", r.State, r.Code, r.Reason)
	}
	if n := len(w.attachments(inst)); n != 0 {
		t.Errorf("%d attachments after the refusal", n)
	}
	if al := w.allocations(inst); al[w.gpus[gpuA]]["VGPU"]+al[w.gpus[gpuB]]["VGPU"] != 0 {
		t.Errorf("a claim was made: %v", al)
	}

	ok := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q", "count": 1, "workload": "training", "guest_driver": "550.54.15"})
	if r := w.wait(ok, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("request with the host's branch: %s (%s: %s)", r.State, r.Code, r.Reason)
	}

	// Declared in the server's metadata (ingest keeps it in
	// instances.guest_driver): a request that names no driver is held to it.
	other := w.domains[4].UUID
	_, err := w.pool.Exec(w.ctx, `UPDATE instances SET guest_driver = '570.86.15' WHERE uuid = $1`, other)
	testsvc.Must(t, err, "declare the guest driver")
	id = w.submit("GPU_REQUEST", other, map[string]any{"vgpu_profile": "T4-4Q", "count": 1, "workload": "training"})
	if r := w.wait(id, 60*time.Second); r.State != requests.Rejected || !strings.Contains(r.Reason, "570.86.15") || !strings.Contains(r.Reason, "code 43") {
		t.Fatalf("request for a VM whose metadata declares a too-new guest driver: %s (%s: %s); want rejected citing the rule", r.State, r.Code, r.Reason)
	}
}

// waitReport waits until the bridge has a report of the world's host
// that names its vGPU manager and hypervisor.
func (w *world) waitReport(within time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var driver, hyp string
		err := w.pool.QueryRow(w.ctx, `SELECT coalesce(report->>'driver_version', ''), coalesce(report->>'hypervisor', '') FROM hosts WHERE name = $1`,
			w.host).Scan(&driver, &hyp)
		if err == nil && driver != "" && hyp != "" {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("no report of %s with its driver and hypervisor within %s (driver %q, hypervisor %q, %v)", w.host, within, driver, hyp, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
