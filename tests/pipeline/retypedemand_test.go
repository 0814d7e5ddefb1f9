package pipeline_test

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/placementapi"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// retypeAudits are the gpu.retype rows of the world's VF GPU: each
// one's request id ("" for none) and detail.
func (w *world) retypeAudits() [][2]string { return w.retypeAuditsOf(vfPF) }

// retypeAuditsOf are the gpu.retype rows of the world's GPU pci.
func (w *world) retypeAuditsOf(pci string) [][2]string {
	w.t.Helper()
	rows, err := w.pool.Query(w.ctx, `SELECT coalesce(request_id::text, ''), detail::text FROM audit_log
		WHERE action = 'gpu.retype' AND object_id = $1 ORDER BY id`, w.host+"/"+pci)
	testsvc.Must(w.t, err, "audit rows")
	defer rows.Close()
	var out [][2]string
	for rows.Next() {
		var r [2]string
		testsvc.Must(w.t, rows.Scan(&r[0], &r[1]), "audit row")
		out = append(out, r)
	}
	testsvc.Must(w.t, rows.Err(), "audit rows")
	return out
}

// wantOwnedType checks the bridge's type of the VF GPU and the step of its
// last re-type.
func (w *world) wantOwnedType(svc *placement.Service, typeID, step string) {
	w.t.Helper()
	w.wantOwnedTypeOf(svc, vfPF, typeID, step)
}

// wantOwnedTypeOf checks the bridge's type of the bridge-owned GPU pci
// and the step of its last re-type.
func (w *world) wantOwnedTypeOf(svc *placement.Service, pci, typeID, step string) {
	w.t.Helper()
	typ, st, err := svc.OwnedType(w.ctx, w.host, pci)
	testsvc.Must(w.t, err, "owned type")
	if typ != typeID || st != step {
		w.t.Errorf("bridge's type of %s = %s (%q), want %s (%q)", pci, typ, st, typeID, step)
	}
}

// wantOnlyCreatableOffered asks Placement's allocation candidates for a
// unit of each of the two types on rp: never both at once, and each one
// offered is a type the agent's last report says the GPU can create now.
func (w *world) wantOnlyCreatableOffered(rp string) {
	w.t.Helper()
	w.wantOnlyCreatableOfferedOf(vfRetype, rp)
}

// wantOnlyCreatableOfferedOf is wantOnlyCreatableOffered for the GPU of
// c and its two types.
func (w *world) wantOnlyCreatableOfferedOf(c retypeCase, rp string) {
	w.t.Helper()
	r, ok := w.report()
	if !ok {
		w.t.Fatalf("no report of %s", w.host)
	}
	var types []protocol.VGPUType
	for _, g := range r.GPUs {
		if g.PCI == c.pci {
			types = g.Types
		}
	}
	offered := 0
	for _, t := range []struct{ trait, typeID string }{{c.fromTrait, c.from}, {c.toTrait, c.to}} {
		if !slices.Contains(w.ownedCandidates(t.trait), rp) {
			continue
		}
		offered++
		if !slices.ContainsFunc(types, func(x protocol.VGPUType) bool { return x.ID == t.typeID && x.AvailableInstances > 0 }) {
			w.t.Errorf("Placement offers %s on %s; the agent reports %s not creatable there (%+v)", t.trait, rp, t.typeID, types)
		}
	}
	if offered > 1 {
		w.t.Errorf("Placement offers both %s and %s on %s", c.fromTrait, c.toTrait, rp)
	}
}

// TestRetypeOnDemand: with [placement] retype_on_demand, a direct-path
// request for H200X-35C (1430) on a host whose only bridge-owned GPU is
// empty and offers 1429 succeeds: the bridge re-types the GPU (its
// provider then has the trait of 1430 only and four units, one used by
// the request), audits gpu.retype with the request, and the agent types a
// VF of that GPU 1430.
func TestRetypeOnDemand(t *testing.T) {
	t.Parallel()
	w, r, rp := vfWorldWith(t, replicaOpts{name: "r1", retypeOnDemand: true})
	w.emptyVFGPU()
	_, err := r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish the empty GPU")
	w.wantOffers(rp, true, false)

	inst := w.domains[3].UUID
	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": retypeProfile})
	if res := w.wait(id, 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("attach %s: %s (%s: %s)", retypeProfile, res.State, res.Code, res.Reason)
	}
	if vf := w.attachedVF(inst, rp, retypeTo); !strings.HasPrefix(vf, "0000:c1:") {
		t.Errorf("attached VF %s, want a VF of %s", vf, vfPF)
	}
	w.wantTraits(rp, retypeTrait)
	w.wantOwnedInventory(rp, 4, 1)
	w.wantOffers(rp, false, true)
	w.wantNeverVGPUCandidate(rp)
	w.wantOwnedType(r.svc, retypeTo, placement.RetypeDone)
	audits := w.retypeAudits()
	if len(audits) != 1 || audits[0][0] != id.String() || !strings.Contains(audits[0][1], `"from": "`+vfType+`"`) ||
		!strings.Contains(audits[0][1], `"to": "`+retypeTo+`"`) || !strings.Contains(audits[0][1], "request "+id.String()) {
		t.Errorf("gpu.retype audit rows = %v, want one of request %s, from %s to %s, naming the request", audits, id, vfType, retypeTo)
	}
}

// TestRetypeOnDemandRefused: a direct-path request for 1430 on a host
// whose only bridge-owned GPU offers 1429 is refused no_capacity, and the
// GPU keeps 1429 (Placement, the bridge's state, no audit row), when the
// GPU holds a vGPU of the bridge, and when retype_on_demand is off (the
// reason says so and names the GPU an operator can re-type).
func TestRetypeOnDemandRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		on     bool
		inUse  bool
		reason []string
	}{
		{"in use", true, true, []string{"re-type on demand", "in use"}},
		{"off", false, false, []string{"retype_on_demand is off", "vgpuctl gpu retype", vfPF}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w, r, rp := vfWorldWith(t, replicaOpts{name: "r1", retypeOnDemand: c.on})
			w.emptyVFGPU()
			_, err := r.svc.PublishOwned(w.ctx)
			testsvc.Must(t, err, "publish the empty GPU")
			used := 0
			if c.inUse {
				id := w.submit("GPU_REQUEST", w.domains[4].UUID, map[string]any{"vgpu_profile": vfProfile})
				if res := w.wait(id, 60*time.Second); res.State != requests.Succeeded {
					t.Fatalf("attach %s: %s (%s: %s)", vfProfile, res.State, res.Code, res.Reason)
				}
				used = 1
			}
			id := w.submit("GPU_REQUEST", w.domains[3].UUID, map[string]any{"vgpu_profile": retypeProfile})
			res := w.wait(id, 60*time.Second)
			if res.State != requests.Failed || res.Code != flow.CodeNoCapacity {
				t.Fatalf("attach %s: %s (%s: %s), want failed %s", retypeProfile, res.State, res.Code, res.Reason, flow.CodeNoCapacity)
			}
			for _, s := range c.reason {
				if !strings.Contains(res.Reason, s) {
					t.Errorf("reason %q does not say %q", res.Reason, s)
				}
			}
			w.wantTraits(rp, vfTrait)
			w.wantOwnedInventory(rp, 2, used)
			w.wantOffers(rp, used < 2, false)
			w.wantOwnedType(r.svc, vfType, "")
			if a := w.retypeAudits(); len(a) != 0 {
				t.Errorf("gpu.retype audit rows = %v, want none", a)
			}
		})
	}
}

// TestRetypeOnDemandStoppedAtEachStep stops the bridge at each step of a
// re-type on demand of a bridge-owned GPU, a VF GPU (from 1429 to 1430)
// and an mdev GPU (a T4, from nvidia-231 to nvidia-230), the hook
// freezing it there while the test looks, then the replica stops. At the
// stop Placement's allocation candidates for the two types' traits never
// offer both and never a type the GPU cannot create; once the old type is
// withdrawn neither is offered. A bridge started again serves the
// request: it finishes the re-type, audits it with the request and
// attaches a vGPU of the new type (a VF typed 1430, an mdev of
// nvidia-230).
func TestRetypeOnDemandStoppedAtEachStep(t *testing.T) {
	t.Parallel()
	for _, c := range []retypeCase{vfRetype, mdevRetype} {
		for _, stop := range []string{placement.RetypeWithdrawing, placement.RetypeWithdrawn, placement.RetypeTyped} {
			t.Run(c.name+"/"+stop, func(t *testing.T) {
				t.Parallel()
				reached, release := make(chan struct{}), make(chan struct{})
				var crashed atomic.Bool
				hook := func(step string) error {
					if crashed.Load() {
						return errCrash // stopped: nothing goes further
					}
					if step != stop {
						return nil
					}
					crashed.Store(true)
					close(reached)
					<-release
					return fmt.Errorf("at %s: %w", step, errCrash)
				}
				w := newWorld(t)
				r1, rp := c.own(w, replicaOpts{name: "r1", retypeOnDemand: true, retypeHook: hook})

				inst := w.domains[3].UUID
				id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": c.toProfile})
				select {
				case <-reached:
				case <-time.After(90 * time.Second):
					close(release)
					res := w.wait(id, time.Second)
					t.Fatalf("the re-type never reached %s; request %s (%s: %s)", stop, res.State, res.Code, res.Reason)
				}
				// Stopped there: what Placement offers now.
				w.wantOnlyCreatableOfferedOf(c, rp)
				switch stop {
				case placement.RetypeWithdrawing:
					w.wantOffersOf(c, rp, true, false) // recorded, Placement not written yet
				default:
					w.wantOffersOf(c, rp, false, false)
					w.wantTraits(rp)
				}
				_, step, err := r1.svc.OwnedType(w.ctx, w.host, c.pci)
				testsvc.Must(t, err, "owned type")
				if want := map[string]string{placement.RetypeWithdrawn: placement.RetypeWithdrawing}[stop]; step != stop && step != want {
					t.Errorf("step recorded at the stop = %q, want %q", step, stop)
				}
				close(release)
				r1.stop()
				if res, err := w.requests.Get(w.ctx, id); err != nil || res.State.Final() {
					t.Fatalf("request after the stop: %+v %v, want it open", res, err)
				}
				w.wantOnlyCreatableOfferedOf(c, rp)

				r2 := w.startBridge(replicaOpts{name: "r2", owned: []placement.OwnedDecl{{Host: w.host, PCI: c.pci, TypeID: c.from}}, retypeOnDemand: true})
				// (r2's first full sync of the shared Placement comes first.)
				if res := w.wait(id, 120*time.Second); res.State != requests.Succeeded {
					t.Fatalf("attach %s after the restart: %s (%s: %s)", c.toProfile, res.State, res.Code, res.Reason)
				}
				c.attached(w, inst, rp, c.to)
				w.wantOnlyCreatableOfferedOf(c, rp)
				w.wantTraits(rp, c.toTrait)
				w.wantOwnedInventory(rp, c.toTotal, 1)
				w.wantOffersOf(c, rp, false, true)
				w.wantOwnedTypeOf(r2.svc, c.pci, c.to, placement.RetypeDone)
				if a := w.retypeAuditsOf(c.pci); len(a) != 1 || a[0][0] != id.String() {
					t.Errorf("gpu.retype audit rows = %v, want one of request %s", a, id)
				}
			})
		}
	}
}

// TestRetypeOnDemandUndoneWhenClaimed: a claim of the old type lands on
// the GPU after the bridge chose it and recorded the re-type, before its
// provider stopped offering the old type (the step hook makes it, as
// another scheduler would). The bridge finds it after the withdrawal and
// undoes the re-type: the request fails no_capacity saying so, the GPU
// offers 1429 again, the bridge's state forgets the re-type and nothing is
// audited.
func TestRetypeOnDemandUndoneWhenClaimed(t *testing.T) {
	t.Parallel()
	other := uuid.NewString()
	var w *world
	var rp string
	var claimed atomic.Bool
	hook := func(step string) error {
		if step != placement.RetypeWithdrawing || claimed.Swap(true) {
			return nil
		}
		return w.placementClient().PutAllocations(w.ctx, &placement.Consumer{UUID: other, ProjectID: uuid.NewString(), UserID: uuid.NewString(),
			Type: "INSTANCE", Providers: map[string]map[string]int{rp: {placement.BridgeClass: 1}}})
	}
	w, r, rp0 := vfWorldWith(t, replicaOpts{name: "r1", retypeOnDemand: true, retypeHook: hook})
	rp = rp0
	t.Cleanup(func() { _, _ = w.sc.Delete(w.ctx, w.sc.ServiceURL("allocations", other), nil) })
	w.emptyVFGPU()
	_, err := r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish the empty GPU")

	id := w.submit("GPU_REQUEST", w.domains[3].UUID, map[string]any{"vgpu_profile": retypeProfile})
	res := w.wait(id, 60*time.Second)
	if res.State != requests.Failed || res.Code != flow.CodeNoCapacity || !strings.Contains(res.Reason, "re-type undone") {
		t.Fatalf("attach %s: %s (%s: %s), want failed %s saying the re-type was undone", retypeProfile, res.State, res.Code, res.Reason, flow.CodeNoCapacity)
	}
	if !claimed.Load() {
		t.Fatalf("the re-type never reached %s", placement.RetypeWithdrawing)
	}
	w.wantTraits(rp, vfTrait)
	w.wantOwnedInventory(rp, 2, 1)
	w.wantOffers(rp, true, false)
	w.wantOwnedType(r.svc, vfType, "")
	if a := w.retypeAudits(); len(a) != 0 {
		t.Errorf("gpu.retype audit rows = %v, want none", a)
	}
}

// vfPF2 is the second VF GPU of withSecondVFGPU's worlds.
const vfPF2 = "0000:c2:00.0"

// TestRetypeOnDemandTwoEmptyGPUs: a host with two empty bridge-owned GPUs
// offering 1429, declared in reverse address order. A direct-path request
// for H200X-35C (1430) re-types the one of the lower PCI address
// (0000:c1:00.0), not the first declared; the other keeps 1429. A request
// for H200X-141C (1428) then finds 0000:c1:00.0 in use and re-types the
// next one, 0000:c2:00.0. Each attach types a VF of the GPU re-typed for
// it, and each GPU has one gpu.retype audit row.
func TestRetypeOnDemandTwoEmptyGPUs(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testPolicy, withSecondVFGPU())
	w.startAgent()
	r := w.startBridge(replicaOpts{name: "r1", retypeOnDemand: true,
		owned: []placement.OwnedDecl{{Host: w.host, PCI: vfPF2, TypeID: vfType}, {Host: w.host, PCI: vfPF, TypeID: vfType}}})
	w.reportedFreeVFs(30 * time.Second)
	w.emptyVFGPU()
	w.waitFor(30*time.Second, "a report with "+retypeTo+" creatable 4 times on "+vfPF2, func() bool {
		rep, ok := w.report()
		return ok && slices.ContainsFunc(rep.GPUs, func(g protocol.GPU) bool {
			return g.PCI == vfPF2 && slices.ContainsFunc(g.Types, func(t protocol.VGPUType) bool { return t.ID == retypeTo && t.AvailableInstances == 4 })
		})
	})
	n, err := r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish the two GPUs")
	rps := map[string]string{}
	for _, pf := range []string{vfPF, vfPF2} {
		ps, err := w.placementClient().Providers(w.ctx, placement.ListOpts{Name: placement.GPUProviderName(w.node, pf)})
		testsvc.Must(t, err, "list providers")
		if len(ps) != 1 {
			t.Fatalf("providers of %s: %d, want 1 (PublishOwned changed %d)", pf, len(ps), n)
		}
		rps[pf] = ps[0].UUID
		w.gpus[pf] = ps[0].UUID // removed with the world's providers
	}
	rp1, rp2 := rps[vfPF], rps[vfPF2]
	w.wantOffers(rp1, true, false)
	w.wantOffers(rp2, true, false)
	audits := func(pf string) int {
		t.Helper()
		var k int
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE action = 'gpu.retype' AND object_id = $1`,
			w.host+"/"+pf).Scan(&k), "audit rows")
		return k
	}

	inst := w.domains[3].UUID
	if res := w.wait(w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": retypeProfile}), 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("attach %s: %s (%s: %s)", retypeProfile, res.State, res.Code, res.Reason)
	}
	if vf := w.attachedVF(inst, rp1, retypeTo); !strings.HasPrefix(vf, "0000:c1:") {
		t.Errorf("attached VF %s, want a VF of %s", vf, vfPF)
	}
	w.wantTraits(rp1, retypeTrait)
	w.wantTraits(rp2, vfTrait)
	w.wantOffers(rp2, true, false)
	w.wantOwnedRow(r.svc, rp2, vfPF2, vfTrait, vfProfile)
	typ, _, err := r.svc.OwnedType(w.ctx, w.host, vfPF2)
	testsvc.Must(t, err, "owned type")
	if typ != vfType || audits(vfPF) != 1 || audits(vfPF2) != 0 {
		t.Errorf("after the 35C: %s is %s with %d audit rows, %s has %d, want %s untouched and one re-type of %s",
			vfPF2, typ, audits(vfPF2), vfPF, audits(vfPF), vfPF2, vfPF)
	}

	// The lower address is in use now: the next GPU by address is re-typed.
	const wholeType, wholeTrait, wholeProfile = "1428", "CUSTOM_1428", "H200X-141C"
	inst2 := w.domains[4].UUID
	if res := w.wait(w.submit("GPU_REQUEST", inst2, map[string]any{"vgpu_profile": wholeProfile}), 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("attach %s: %s (%s: %s)", wholeProfile, res.State, res.Code, res.Reason)
	}
	if vf := w.attachedVF(inst2, rp2, wholeType); !strings.HasPrefix(vf, "0000:c2:") {
		t.Errorf("attached VF %s, want a VF of %s", vf, vfPF2)
	}
	w.wantTraits(rp1, retypeTrait)
	w.wantTraits(rp2, wholeTrait)
	w.wantOwnedType(r.svc, retypeTo, placement.RetypeDone)
	typ, step, err := r.svc.OwnedType(w.ctx, w.host, vfPF2)
	testsvc.Must(t, err, "owned type")
	if typ != wholeType || step != placement.RetypeDone || audits(vfPF) != 1 || audits(vfPF2) != 1 {
		t.Errorf("after the 141C: %s is %s (%q) with %d audit rows, %s has %d, want %s done and one re-type each",
			vfPF2, typ, step, audits(vfPF2), vfPF, audits(vfPF), wholeType)
	}
}

// wantOwnedRow checks GET /v1/gpus shows the single-type bridge-owned GPU
// pf (provider rp) with its type's trait and profile (the provider's
// trait, not under type_trait_prefix), owner bridge, mode single.
func (w *world) wantOwnedRow(svc *placement.Service, rp, pf, trait, profile string) {
	w.t.Helper()
	rows := w.gpusAPI(svc, "host="+w.node)
	i := slices.IndexFunc(rows, func(g placementapi.GPU) bool { return g.ProviderUUID == rp })
	if i < 0 {
		w.t.Fatalf("GET /v1/gpus lists no row of %s (%s): %+v", pf, rp, rows)
	}
	g := rows[i]
	if g.PCIAddress != pf || g.Trait != trait || g.Profile != profile || g.Owner != placementapi.OwnerBridge || g.Mode != placementapi.ModeSingle ||
		g.ResourceClass != placement.BridgeClass || g.Framebuffer != nil {
		w.t.Errorf("GET /v1/gpus row of %s = %+v, want trait %s, profile %s, owner bridge, mode single, %s", pf, g, trait, profile, placement.BridgeClass)
	}
}
