// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// evacuate forces the server's host down and evacuates the server to
// the other host; it returns the evacuation's final migration status.
func (w *moveWorld) evacuate(vm, from, to string) string {
	w.t.Helper()
	w.n.ForceDown(w.t, from, true)
	return w.evacuateDown(vm, to)
}

// evacuateDown evacuates the server, whose host is forced down already,
// to host to; it returns the evacuation's final migration status.
func (w *moveWorld) evacuateDown(vm, to string) string {
	t := w.t
	t.Helper()
	w.n.ServerAction(t, vm, map[string]any{"evacuate": map[string]any{"host": to}})
	var status string
	w.waitFor(3*time.Minute, "the evacuation of "+vm+" to end", func() bool {
		for _, m := range w.n.Migrations(t, vm) {
			if m.Type == "evacuation" {
				status = m.Status
				return status == "done" || status == "failed" || status == "error" || status == "completed"
			}
		}
		return false
	})
	w.waitFor(2*time.Minute, "server "+vm+" with no task", func() bool { return w.n.Server(t, vm).TaskState == "" })
	return status
}

// evacuationRefused asserts what Nova 26 does when it evacuates a server
// whose allocations hold a VGPU on the source host's GPU: the
// destination's spawn gets the instance's whole allocation, the source's
// providers first (the scheduler's claim, _move_operation_alloc_request,
// keeps both hosts in the instance's consumer); the libvirt driver serves
// only the first VGPU allocation (LibvirtDriver._allocate_mdevs), finds
// that provider outside its tree and raises
// ComputeResourcesUnavailable; ComputeManager.rebuild_instance marks the
// evacuation failed, drops the destination's allocations and keeps the
// instance ACTIVE on its source without a fault. The vGPU is intact on
// the source, before and after the source compute comes back.
func (w *moveWorld) evacuationRefused(vm string, direct bool) {
	t := w.t
	t.Helper()
	a, b := w.host, w.b
	mdev := w.assertOneVGPU("boot", vm, a, direct)
	if st := w.evacuate(vm, a, b); st != "failed" {
		t.Errorf("evacuation ended %s, want failed", st)
	}
	s := w.n.Server(t, vm)
	if s.Status != "ACTIVE" || s.Host != a || s.Fault != "" {
		t.Errorf("server after the evacuation: %s on %s, fault %q; want ACTIVE on %s without a fault", s.Status, s.Host, s.Fault, a)
	}
	if !slices.Contains(w.n.FakeHost(b).Events(), "spawn "+vm) {
		t.Errorf("no spawn of %s on %s: events %v", vm, b, w.n.FakeHost(b).Events())
	}
	if got := w.assertOneVGPU("evacuation refused", vm, a, direct); got != mdev {
		t.Errorf("evacuation refused: mdev %s, want the same %s", got, mdev)
	}
	// The source compute comes back: nothing was evacuated, nothing to
	// clean up there.
	w.n.ForceDown(t, a, false)
	w.n.RestartCompute(t, a)
	w.bridgeIdle("source back", vm)
	if got := w.assertOneVGPU("source back", vm, a, direct); got != mdev {
		t.Errorf("source back: mdev %s, want the same %s", got, mdev)
	}
}

// TestEvacuateFlavorVGPU: a server of a resources:VGPU flavor cannot be
// evacuated by Nova 26: its VGPU on the source GPU is the first VGPU
// allocation the destination's driver is handed.
func TestEvacuateFlavorVGPU(t *testing.T) {
	w := newMoveWorld(t, "evf")
	vm := w.n.CreateServer(t, "e2e-evac-flavor", w.vgpuFlavor, w.host)
	w.n.WaitServer(t, vm, "ACTIVE")
	w.evacuationRefused(vm, false)
	w.n.DeleteServer(t, vm)
}

// heldOffHost forces host down and waits until the bridge has taken the
// direct-path vGPU of vm out of the instance's consumer (no VGPU left in
// Placement, the attachment held, the mdev still in the running domain
// on host), by a request of its own that succeeded and says so in its
// history. It returns that request's id.
func (w *moveWorld) heldOffHost(vm, host, mdev string) string {
	t := w.t
	t.Helper()
	w.n.ForceDown(t, host, true)
	w.waitFor(time.Minute, "the VGPU of "+vm+" to leave its consumer", func() bool {
		for _, res := range w.n.Allocations(t, vm) {
			if res["VGPU"] != 0 {
				return false
			}
		}
		return true
	})
	if u := w.n.Usages(t, w.gpuOf(host)); u["VGPU"] != 0 {
		t.Errorf("held: VGPU used on %s's T4: %d, want 0", host, u["VGPU"])
	}
	var id string
	w.waitFor(time.Minute, "the bridge's hold request of "+vm+" to succeed", func() bool {
		l, err := w.api.Requests(w.ctx, apiclient.RequestFilter{InstanceUUID: vm})
		testsvc.Must(t, err, "requests")
		for _, r := range l.Requests {
			if r.Kind == "host_down" && r.State == "succeeded" && strings.Contains(r.Reason, "hold") {
				id = r.ID
				return true
			}
		}
		return false
	})
	var state, ahost string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT state, host FROM vgpu_attachments WHERE instance_uuid = $1 AND id = $2`, vm, mdev).Scan(&state, &ahost),
		"attachment")
	if state != "held" || ahost != host {
		t.Errorf("held: attachment %s is %s on %s, want held on %s", mdev, state, ahost, host)
	}
	var audited int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE request_id = $1 AND action = 'hold' AND object_id = $2
		AND detail->>'reason' LIKE '%forced down%'`, id, mdev).Scan(&audited), "audit")
	if audited != 1 {
		t.Errorf("held: request %s's history has %d hold entries for %s, want 1", id, audited, mdev)
	}
	if d, ok := w.n.FakeHost(host).Domain(t, vm); !ok || d.State != "running" || !slices.Contains(d.Mdevs(), mdev) {
		t.Errorf("held: the domain on %s lost mdev %s: %+v (%v)", host, mdev, d, ok)
	}
	return id
}

// TestEvacuateDirectVGPU: a server holding a direct-path vGPU is
// evacuated. Its host forced down, the bridge takes the vGPU's claim out
// of the instance's consumer (Nova 26 would hand the destination's spawn
// the source GPU's VGPU, which the libvirt driver refuses), so Nova's
// evacuation succeeds; after it, the bridge applies the vGPU again on the
// destination. The source comes back (nova-compute destroys the
// evacuated guest) and the bridge removes the old mdev there: one vGPU,
// on the destination, in Nova, Placement, the bridge and on the host;
// nothing left on the source.
func TestEvacuateDirectVGPU(t *testing.T) {
	w := newMoveWorld(t, "evd")
	vm := w.bootServer("e2e-evac-direct")
	w.attachDirect(vm)
	a, b := w.host, w.b
	mdev := w.assertOneVGPU("boot", vm, a, true)
	w.heldOffHost(vm, a, mdev)
	if st := w.evacuateDown(vm, b); st != "done" && st != "completed" {
		w.dump(vm)
		t.Fatalf("evacuation ended %s, want done", st)
	}
	s := w.n.Server(t, vm)
	if s.Status != "ACTIVE" || s.Host != b || s.Fault != "" {
		t.Errorf("server after the evacuation: %s on %s, fault %q; want ACTIVE on %s", s.Status, s.Host, s.Fault, b)
	}
	// The bridge applies it again on b; a's guest and mdev are left until
	// a is back.
	w.waitFor(3*time.Minute, "a vGPU of "+vm+" attached on "+b, func() bool {
		var n int
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM vgpu_attachments WHERE instance_uuid = $1 AND state = 'attached' AND host = $2`,
			vm, b).Scan(&n), "attachments")
		return n == 1
	})
	// The source comes back as Nova's guide has it: its nova-compute
	// starts (init_host destroys the evacuated guest, drops the instance's
	// allocations there and completes the migration), then the service is
	// forced up; the bridge then detaches and removes the old mdev.
	w.n.RestartComputeForcedDown(t, a)
	w.waitFor(3*time.Minute, "the evacuation of "+vm+" completed by "+a+"'s init_host", func() bool {
		for _, m := range w.n.Migrations(t, vm) {
			if m.Type == "evacuation" {
				return m.Status == "completed"
			}
		}
		return false
	})
	if _, ok := w.n.FakeHost(a).Domain(t, vm); ok {
		t.Errorf("the evacuated guest is still defined on %s after its init_host", a)
	}
	w.n.ForceDown(t, a, false)
	w.waitFor(3*time.Minute, "the bridge's removal of the old mdev on "+a, func() bool {
		var state string
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT state FROM vgpu_attachments WHERE id = $1`, mdev).Scan(&state), "old attachment")
		return state == "released"
	})
	w.bridgeIdle("source back", vm)
	got := w.assertOneVGPU("evacuated", vm, b, true)
	if got == mdev {
		t.Errorf("evacuated: the mdev on %s is %s, the one left on %s", b, got, a)
	}
	// Nothing leaked: the old vGPU released, its usage ended; the hold's
	// request and the re-apply are in the instance's history.
	var state string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT state FROM vgpu_attachments WHERE id = $1`, mdev).Scan(&state), "old attachment")
	if state != "released" {
		t.Errorf("evacuated: the old attachment %s is %s, want released", mdev, state)
	}
	var open int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM vgpu_usage WHERE instance_uuid = $1 AND ended_at IS NULL`, vm).Scan(&open), "usage")
	if open != 1 {
		t.Errorf("evacuated: %d open usage records of %s, want 1", open, vm)
	}
	var notes int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM vgpu_attachments WHERE id = $1 AND reason LIKE '%applied again on host '||$2||'%'`,
		mdev, b).Scan(&notes), "reason")
	if notes != 1 {
		t.Errorf("evacuated: the old attachment's reason does not name the re-apply on %s", b)
	}
	w.n.DeleteServer(t, vm)
}

// TestEvacuateDirectVGPUHostBack: the host of a server holding a
// direct-path vGPU is forced down, and comes back without an evacuation:
// the bridge claims the vGPU again on the same GPU, where its mdev
// stayed, and marks it attached; the guest kept it all along.
func TestEvacuateDirectVGPUHostBack(t *testing.T) {
	w := newMoveWorld(t, "evb")
	vm := w.bootServer("e2e-evac-back")
	w.attachDirect(vm)
	a := w.host
	mdev := w.assertOneVGPU("boot", vm, a, true)
	w.heldOffHost(vm, a, mdev)
	w.n.ForceDown(t, a, false)
	w.waitFor(time.Minute, "the bridge's restore request of "+vm+" to succeed", func() bool {
		l, err := w.api.Requests(w.ctx, apiclient.RequestFilter{InstanceUUID: vm})
		testsvc.Must(t, err, "requests")
		for _, r := range l.Requests {
			if r.Kind == "host_down" && r.State == "succeeded" && strings.Contains(r.Reason, "again") {
				return true
			}
		}
		return false
	})
	w.bridgeIdle("host back", vm)
	if got := w.assertOneVGPU("host back", vm, a, true); got != mdev {
		t.Errorf("host back: mdev %s, want the same %s", got, mdev)
	}
	var provider string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT coalesce(provider_uuid::text, '') FROM vgpu_attachments WHERE id = $1 AND state = 'attached'`,
		mdev).Scan(&provider), "attachment")
	if provider != w.gpu {
		t.Errorf("host back: attachment %s on provider %s, want %s", mdev, provider, w.gpu)
	}
	w.n.DeleteServer(t, vm)
}
