// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"slices"
	"testing"
	"time"
)

// evacuate forces the server's host down and evacuates the server to
// the other host; it returns the evacuation's final migration status.
func (w *moveWorld) evacuate(vm, from, to string) string {
	t := w.t
	t.Helper()
	w.n.ForceDown(t, from, true)
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

// TestEvacuateDirectVGPU: the same for a direct-path vGPU: the bridge's
// claim on the source GPU, in the instance's consumer, makes the
// destination's driver refuse the evacuation.
func TestEvacuateDirectVGPU(t *testing.T) {
	w := newMoveWorld(t, "evd")
	vm := w.bootServer("e2e-evac-direct")
	w.attachDirect(vm)
	w.evacuationRefused(vm, true)
	w.n.DeleteServer(t, vm)
}
