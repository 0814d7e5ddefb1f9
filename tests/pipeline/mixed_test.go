package pipeline_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocationcandidates"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/placementapi"
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
// demand (on here). GET /v1/gpus lists it (owner bridge, mode mixed, its
// framebuffer and its vGPUs by type) beside the T4s Nova manages, empty
// first, then with the 35C and the 17C.
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
	w.wantMixedRow(r.svc, rp, total, 0, nil)
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
	w.reportedVF(vfA, instA, true, 30*time.Second)
	w.wantMixedRow(r.svc, rp, total, 35840+17408, []placementapi.TypeInUse{
		{TypeID: "1430", Trait: "CUSTOM_1430", Profile: "H200X-35C", FramebufferMiB: 35840, Count: 1},
		{TypeID: "1431", Trait: "CUSTOM_1431", Profile: "H200X-17C", FramebufferMiB: 17408, Count: 1},
	})

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

// gpusAPI gets GET /v1/gpus?query over svc (as vgpuctl gpus does): its
// rows of the world's host.
func (w *world) gpusAPI(svc *placement.Service, query string) []placementapi.GPU {
	w.t.Helper()
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Auth: api.NoAuth{}})
	placementapi.New(svc).Register(srv)
	rec := httptest.NewRecorder()
	srv.Echo().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/gpus?"+query, nil))
	if rec.Code != http.StatusOK {
		w.t.Fatalf("GET /v1/gpus?%s: %d %s", query, rec.Code, rec.Body.String())
	}
	var out struct {
		GPUs []placementapi.GPU `json:"gpus"`
	}
	testsvc.Must(w.t, json.Unmarshal(rec.Body.Bytes(), &out), "GET /v1/gpus answer")
	var mine []placementapi.GPU
	for _, g := range out.GPUs {
		if g.Host == w.host || g.Node == w.node {
			mine = append(mine, g)
		}
	}
	return mine
}

// wantMixedRow checks GET /v1/gpus: the world's mixed GPU (provider rp)
// is one row, owner bridge, mode mixed, total MiB of which used are
// claimed, its vGPUs by type inUse, healthy, beside the T4s (owner nova,
// mode single); a profile or trait filter keeps it for a type it offers
// only.
func (w *world) wantMixedRow(svc *placement.Service, rp string, total, used int, inUse []placementapi.TypeInUse) {
	w.t.Helper()
	rows := w.gpusAPI(svc, "host="+w.node)
	var mixed []placementapi.GPU
	singles := 0
	for _, g := range rows {
		switch {
		case g.Mode == placementapi.ModeMixed:
			mixed = append(mixed, g)
		case g.Mode == placementapi.ModeSingle && g.Owner == placementapi.OwnerNova && g.ResourceClass == "VGPU":
			singles++
		default:
			w.t.Errorf("GET /v1/gpus row %+v: want a T4 of Nova (single) or the mixed GPU", g)
		}
	}
	if singles != 2 || len(mixed) != 1 {
		w.t.Fatalf("GET /v1/gpus?host=%s: %d T4s and %d mixed rows (%+v), want 2 and 1", w.node, singles, len(mixed), rows)
	}
	g := mixed[0]
	wantTraits := []string{"CUSTOM_1428", "CUSTOM_1429", "CUSTOM_1430", "CUSTOM_1431"}
	if g.ProviderUUID != rp || g.Owner != placementapi.OwnerBridge || g.PCIAddress != vfPF || g.Host != w.host || g.Node != w.node ||
		g.Name != placement.GPUProviderName(w.node, vfPF) || g.RootUUID != w.root || g.ResourceClass != placement.BridgeFBClass ||
		g.Total != total || g.Capacity != total || g.Used != used || g.Free != total-used || g.Trait != "" || g.Profile != "" ||
		!slices.Equal(g.Traits, wantTraits) || g.Health != protocol.HealthOK || g.Problem != "" || g.Drained {
		w.t.Errorf("mixed GPU row = %+v, want provider %s of %s/%s, %s %d/%d MiB used, traits %v, healthy, no problem",
			g, rp, w.host, vfPF, placement.BridgeFBClass, used, total, wantTraits)
	}
	if fb := g.Framebuffer; fb == nil || *fb != (placementapi.Framebuffer{TotalMiB: total, UsedMiB: used, FreeMiB: total - used}) {
		w.t.Errorf("framebuffer of the mixed GPU = %+v, want %d MiB, %d used", fb, total, used)
	}
	if !slices.Equal(g.TypesInUse, inUse) {
		w.t.Errorf("types in use of the mixed GPU = %+v, want %+v", g.TypesInUse, inUse)
	}
	for _, c := range []struct {
		query string
		want  bool
	}{{"profile=H200X-17C", true}, {"trait=CUSTOM_1428", true}, {"profile=T4-4Q", false}, {"trait=CUSTOM_NVIDIA_232", false}} {
		got := slices.ContainsFunc(w.gpusAPI(svc, c.query), func(x placementapi.GPU) bool { return x.Mode == placementapi.ModeMixed })
		if got != c.want {
			w.t.Errorf("GET /v1/gpus?%s lists the mixed GPU: %v, want %v", c.query, got, c.want)
		}
	}
}
