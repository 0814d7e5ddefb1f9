package pipeline_test

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocationcandidates"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestBridgeOwnedVFMixed: the fake host's VF GPU in heterogeneous mode,
// declared HOST/PF=mixed, is a provider with the GPU's framebuffer in MiB
// of CUSTOM_VGPU_BRIDGE_FB_MIB (143771 less the 71680 of Nova's 70C VF)
// and every type's trait. A 35C and a 17C fill it side by side, each a VF
// typed with its own type and its framebuffer claimed; a further 35C does
// not fit (18843 MiB left) and is refused no_capacity while Placement
// still offers a 17C there; a release gives its framebuffer back and the
// 35C then fits. A mixed GPU is never re-typed, by an operator or on
// demand (on here).
func TestBridgeOwnedVFMixed(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testPolicy, withVFHetero())
	r, rp := w.ownVFGPU(replicaOpts{name: "r1", retypeOnDemand: true}, placement.MixedType)
	const total = 143771 - 71680
	w.wantMixed(rp, total, 0)
	tr, err := resourceproviders.GetTraits(w.ctx, w.sc, rp).Extract()
	testsvc.Must(t, err, "traits")
	if want := []string{"CUSTOM_1428", "CUSTOM_1429", "CUSTOM_1430", "CUSTOM_1431"}; !slices.Equal(slices.Sorted(slices.Values(tr.Traits)), want) {
		t.Errorf("traits = %v, want %v", tr.Traits, want)
	}
	w.wantNeverVGPUCandidate(rp)
	if err := r.svc.Retype(w.ctx, w.host, vfPF, "1430"); !errors.Is(err, placement.ErrRetypeNotCreatable) {
		t.Errorf("re-type of the mixed GPU: %v, want %v", err, placement.ErrRetypeNotCreatable)
	}

	instA, instB, instC := w.domains[3].UUID, w.domains[4].UUID, w.domains[5].UUID
	attach := func(inst, profile string) requests.Request {
		t.Helper()
		return w.wait(w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": profile}), 60*time.Second)
	}
	vfOf := func(inst, typ string, fb int) string {
		t.Helper()
		vf := w.attachedVF(inst, rp, typ)
		if vf == novaVF || vf == vfPF {
			t.Fatalf("%s got VF %q", inst, vf)
		}
		if al := w.allocations(inst); al[rp][placement.BridgeFBClass] != fb || len(al[rp]) != 1 {
			t.Errorf("allocations of %s = %v, want %d %s on %s", inst, al, fb, placement.BridgeFBClass, rp)
		}
		return vf
	}
	if res := attach(instA, "H200X-35C"); res.State != requests.Succeeded {
		t.Fatalf("35C: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	vfA := vfOf(instA, "1430", 35840)
	if res := attach(instB, "H200X-17C"); res.State != requests.Succeeded {
		t.Fatalf("17C beside the 35C: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	vfB := vfOf(instB, "1431", 17408)
	if vfA == vfB {
		t.Fatalf("both vGPUs on VF %s", vfA)
	}
	w.wantMixed(rp, total, 35840+17408)
	// Published again from the reports that show the two VFs typed: the
	// bridge's own VFs are its allocations, the inventory stays.
	w.reportedVF(vfB, instB, true, 30*time.Second)
	_, err = r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish again")
	w.wantMixed(rp, total, 35840+17408)

	// 18843 MiB left: no 35C, a 17C would still fit.
	if res := attach(instC, "H200X-35C"); res.State != requests.Failed || res.Code != flow.CodeNoCapacity {
		t.Errorf("a second 35C: %s (%s: %s), want failed %s", res.State, res.Code, res.Reason, flow.CodeNoCapacity)
	}
	if al := w.allocations(instC); al[rp][placement.BridgeFBClass] != 0 {
		t.Errorf("allocations of the refused request = %v", al)
	}
	w.wantFBCandidate(rp, 35840, "CUSTOM_1430", false)
	w.wantFBCandidate(rp, 17408, "CUSTOM_1431", true)

	// The 35C's release gives its framebuffer back: the refused 35C fits.
	if res := w.wait(w.submit("GPU_RELEASE", instA, nil), 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("release: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	if got := w.vfType(vfA); got != "0" {
		t.Errorf("current_vgpu_type of %s after the release = %q, want 0", vfA, got)
	}
	if al := w.allocations(instA); al[rp][placement.BridgeFBClass] != 0 {
		t.Errorf("allocations after the release = %v", al)
	}
	w.wantMixed(rp, total, 17408)
	w.wantFBCandidate(rp, 35840, "CUSTOM_1430", true)
	w.reportedVF(vfA, instA, false, 30*time.Second)
	if res := attach(instC, "H200X-35C"); res.State != requests.Succeeded {
		t.Fatalf("35C after the release: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	vfOf(instC, "1430", 35840)
	w.wantMixed(rp, total, 35840+17408)
}

// wantMixed checks the mixed GPU's only inventory is total MiB of
// placement.BridgeFBClass, used of them allocated.
func (w *world) wantMixed(rp string, total, used int) {
	w.t.Helper()
	c := w.placementClient()
	inv, _, err := c.Inventories(w.ctx, rp)
	testsvc.Must(w.t, err, "inventories")
	if i, ok := inv[placement.BridgeFBClass]; len(inv) != 1 || !ok || i.Total != total || i.Reserved != 0 {
		w.t.Errorf("inventories of %s = %+v, want %d %s only", rp, inv, total, placement.BridgeFBClass)
	}
	u, _, err := c.Usages(w.ctx, rp)
	testsvc.Must(w.t, err, "usages")
	if u[placement.BridgeFBClass] != used {
		w.t.Errorf("usage of %s = %v, want %d %s", rp, u, used, placement.BridgeFBClass)
	}
}

// wantFBCandidate asks Placement whether mib MiB of the framebuffer class
// with trait fit on rp.
func (w *world) wantFBCandidate(rp string, mib int, trait string, want bool) {
	w.t.Helper()
	pages, err := allocationcandidates.List(w.sc, allocationcandidates.ListOpts{Resources: placement.BridgeFBClass + ":" + strconv.Itoa(mib),
		Required: []string{trait}, InTree: w.root}).AllPages(w.ctx)
	testsvc.Must(w.t, err, "allocation candidates")
	ac, err := allocationcandidates.ExtractAllocationCandidates(pages)
	testsvc.Must(w.t, err, "allocation candidates")
	got := false
	for _, ar := range ac.AllocationRequests {
		if _, ok := ar.Allocations[rp]; ok {
			got = true
		}
	}
	if got != want {
		w.t.Errorf("GET /allocation_candidates?resources=%s:%d&required=%s: %s a candidate = %v, want %v", placement.BridgeFBClass, mib, trait, rp, got, want)
	}
}
