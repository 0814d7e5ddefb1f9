package pipeline_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/placementapi"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// The fake host's empty T4 (gpuB), taken from Nova and declared
// bridge-owned as an mdev GPU for T4-2Q (nvidia-231, 8 per GPU); the
// re-type tests re-type it to T4-1Q (nvidia-230, 16 per GPU). A T4 holds
// one type at a time: once it holds an mdev of one, no other is
// creatable.
const (
	mdevGPU           = gpuB
	mdevType          = "nvidia-231"
	mdevTrait         = "CUSTOM_NVIDIA_231"
	mdevProfile       = "T4-2Q"
	mdevRetypeTo      = "nvidia-230"
	mdevRetypeTrait   = "CUSTOM_NVIDIA_230"
	mdevRetypeProfile = "T4-1Q"
)

// retypeCase is a bridge-owned GPU of a kind (VF GPU, mdev GPU) that the
// re-type tests re-type: its address, the type it is declared for and
// the type a request re-types it to.
type retypeCase struct {
	name            string
	pci             string
	from, fromTrait string
	to, toTrait     string
	toProfile       string
	toTotal         int // units of to that the empty GPU offers
	// own starts the world's agent and a bridge started with o that owns
	// the GPU, empty, for from: the bridge and the GPU's provider.
	own func(w *world, o replicaOpts) (*bridgeReplica, string)
	// attached checks that inst holds one vGPU of typ on rp, on the GPU.
	attached func(w *world, inst, rp, typ string)
}

var (
	vfRetype = retypeCase{name: "vf", pci: vfPF, from: vfType, fromTrait: vfTrait, to: retypeTo, toTrait: retypeTrait,
		toProfile: retypeProfile, toTotal: 4,
		own: func(w *world, o replicaOpts) (*bridgeReplica, string) {
			r, rp := w.ownVFGPU(o, vfType)
			w.emptyVFGPU()
			_, err := r.svc.PublishOwned(w.ctx)
			testsvc.Must(w.t, err, "publish the empty GPU")
			return r, rp
		},
		attached: func(w *world, inst, rp, typ string) { w.attachedVF(inst, rp, typ) }}
	mdevRetype = retypeCase{name: "mdev", pci: mdevGPU, from: mdevType, fromTrait: mdevTrait, to: mdevRetypeTo, toTrait: mdevRetypeTrait,
		toProfile: mdevRetypeProfile, toTotal: 16,
		own:      func(w *world, o replicaOpts) (*bridgeReplica, string) { return w.ownMdevGPU(o, mdevType) },
		attached: func(w *world, inst, rp, typ string) { w.attachedMdev(inst, rp, typ) }}
)

// ownMdevGPU takes the world's empty T4 from Nova (an operator took it out
// of Nova's [devices] enabled_mdev_types: Nova's resource tracker deleted
// its provider), starts the world's agent and a bridge started with o
// that owns the T4 as an mdev GPU of typeID, and returns the bridge and
// the provider it published once the agent reported.
func (w *world) ownMdevGPU(o replicaOpts, typeID string) (*bridgeReplica, string) {
	w.t.Helper()
	testsvc.Must(w.t, resourceproviders.Delete(w.ctx, w.sc, w.gpus[mdevGPU]).ExtractErr(), "delete Nova's provider of "+mdevGPU)
	delete(w.gpus, mdevGPU)
	w.startAgent()
	o.owned = []placement.OwnedDecl{{Host: w.host, PCI: mdevGPU, TypeID: typeID}}
	r := w.startBridge(o)
	w.waitFor(30*time.Second, "a report with "+typeID+" creatable on "+mdevGPU, func() bool {
		rep, ok := w.report()
		return ok && slices.ContainsFunc(rep.GPUs, func(g protocol.GPU) bool {
			return g.PCI == mdevGPU && !g.VendorVFIO && slices.ContainsFunc(g.Types, func(t protocol.VGPUType) bool {
				return t.ID == typeID && t.AvailableInstances > 0
			})
		})
	})
	n, err := r.svc.PublishOwned(w.ctx)
	testsvc.Must(w.t, err, "publish the bridge-owned GPUs")
	if n != 1 {
		w.t.Fatalf("PublishOwned changed %d providers, want 1 (created)", n)
	}
	name := placement.GPUProviderName(w.node, mdevGPU)
	ps, err := w.placementClient().Providers(w.ctx, placement.ListOpts{Name: name})
	testsvc.Must(w.t, err, "list providers")
	if len(ps) != 1 {
		w.t.Fatalf("providers named %s: %d, want 1", name, len(ps))
	}
	w.gpus[mdevGPU] = ps[0].UUID // removed with the world's providers
	return r, ps[0].UUID
}

// attachedMdev checks that the instance holds one vGPU, attached on the
// provider rp, an mdev of typ on the T4 in the fake host's sysfs, and
// returns the mdev.
func (w *world) attachedMdev(inst, rp, typ string) string {
	w.t.Helper()
	atts := w.attachments(inst)
	if len(atts) != 1 || atts[0].state != flow.AttAttached || atts[0].provider != rp || atts[0].pci != mdevGPU {
		w.t.Fatalf("attachments of %s = %+v, want one attached on %s, GPU %s", inst, atts, rp, mdevGPU)
	}
	if parent, got := w.mdevOn(atts[0].id); parent != mdevGPU || got != typ {
		w.t.Errorf("mdev %s: on %q of type %q, want on %s of type %s", atts[0].id, parent, got, mdevGPU, typ)
	}
	return atts[0].id
}

// mdevOn is the parent GPU and the type of the mdev in the fake host's
// sysfs ("" when there is no such mdev).
func (w *world) mdevOn(id string) (parent, typ string) {
	dir, err := filepath.EvalSymlinks(filepath.Join(w.fake, "sys", "bus", "mdev", "devices", id))
	if err != nil {
		return "", ""
	}
	link, err := os.Readlink(filepath.Join(dir, "mdev_type"))
	if err != nil {
		return filepath.Base(filepath.Dir(dir)), ""
	}
	return filepath.Base(filepath.Dir(dir)), filepath.Base(link)
}

// TestBridgeOwnedMdevAttachRelease: an mdev GPU (a T4 Nova no longer
// manages) declared bridge-owned for nvidia-231 is a child provider of the
// compute node's provider with CUSTOM_VGPU_BRIDGE inventory (the 8 mdevs
// of the type it can create) and the type's trait; Nova's resources:VGPU
// query never returns it. A direct-path request for T4-2Q has the agent
// create an mdev of nvidia-231 on the T4 (attach_vgpu naming the GPU, not
// a VF) and claims on that provider; the release detaches and removes the
// mdev and gives the claim back.
func TestBridgeOwnedMdevAttachRelease(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r, rp := w.ownMdevGPU(replicaOpts{name: "r1"}, mdevType)

	p, err := resourceproviders.Get(w.ctx, w.sc, rp).Extract()
	testsvc.Must(t, err, "get provider")
	if p.ParentProviderUUID != w.root || p.Name != placement.GPUProviderName(w.node, mdevGPU) {
		t.Errorf("provider %s parent %s, want %s under %s", p.Name, p.ParentProviderUUID, placement.GPUProviderName(w.node, mdevGPU), w.root)
	}
	w.wantOwnedInventory(rp, 8, 0)
	w.wantTraits(rp, mdevTrait)
	w.wantNeverVGPUCandidate(rp)

	inst := w.domains[3].UUID
	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": mdevProfile})
	if res := w.wait(id, 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("attach: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	mdev := w.attachedMdev(inst, rp, mdevType)
	var params string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT body->>'params' FROM commands WHERE request_id = $1 AND kind = 'attach_vgpu'`, id).Scan(&params), "command")
	var ap protocol.AttachParams
	testsvc.Must(t, json.Unmarshal([]byte(params), &ap), "attach params")
	if ap.VendorVFIO || ap.ParentPCI != mdevGPU || ap.TypeID != mdevType || ap.MdevUUID != mdev {
		t.Errorf("attach_vgpu params = %+v, want mdev %s of %s on parent %s, not vendor_vfio", ap, mdev, mdevType, mdevGPU)
	}
	al := w.allocations(inst)
	if al[rp][placement.BridgeClass] != 1 || vgpuUnits(al) != 0 || al[w.root]["VCPU"] != 2 {
		t.Errorf("allocations = %v, want 1 %s on %s beside VCPU/MEMORY_MB", al, placement.BridgeClass, rp)
	}
	w.reportedActive(mdev, inst, true, 30*time.Second)
	// Published again from the new report: the mdev is the bridge's, so
	// the T4 still holds 8 of the type, one in use.
	_, err = r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish again")
	w.wantOwnedInventory(rp, 8, 1)
	w.wantTraits(rp, mdevTrait)
	w.wantNeverVGPUCandidate(rp)

	rel := w.submit("GPU_RELEASE", inst, nil)
	if res := w.wait(rel, 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("release: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	var kinds string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT string_agg(kind || ':' || result_status, ',' ORDER BY seq) FROM commands WHERE request_id = $1`,
		rel).Scan(&kinds), "commands")
	if kinds != "detach_vgpu:succeeded,remove_mdev:succeeded" {
		t.Errorf("release commands = %s", kinds)
	}
	if w.mdevExists(mdev) {
		t.Errorf("mdev %s is still on the host after the release", mdev)
	}
	al = w.allocations(inst)
	if al[rp][placement.BridgeClass] != 0 || al[w.root]["VCPU"] != 2 {
		t.Errorf("allocations after the release = %v, want VCPU/MEMORY_MB only", al)
	}
	w.reportedActive(mdev, inst, false, 30*time.Second)
	_, err = r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish after the release")
	w.wantOwnedInventory(rp, 8, 0)
	w.wantNeverVGPUCandidate(rp)
}

// TestRetypeOnDemandMdev: with [placement] retype_on_demand, a
// direct-path request for T4-1Q (nvidia-230), which no GPU of the host
// offers, on a host whose bridge-owned T4 is empty and offers nvidia-231
// succeeds: the bridge re-types the T4 (its provider then has the trait
// of nvidia-230 only and 16 units, one used by the request), audits
// gpu.retype with the request, and the agent creates an mdev of
// nvidia-230 on it.
func TestRetypeOnDemandMdev(t *testing.T) {
	t.Parallel()
	c := mdevRetype
	w := newWorld(t)
	r, rp := c.own(w, replicaOpts{name: "r1", retypeOnDemand: true})
	w.wantOffersOf(c, rp, true, false)

	inst := w.domains[3].UUID
	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": c.toProfile})
	if res := w.wait(id, 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("attach %s: %s (%s: %s)", c.toProfile, res.State, res.Code, res.Reason)
	}
	mdev := w.attachedMdev(inst, rp, c.to)
	w.wantTraits(rp, c.toTrait)
	w.wantOwnedInventory(rp, 16, 1)
	w.wantOffersOf(c, rp, false, true)
	w.wantNeverVGPUCandidate(rp)
	w.wantOwnedTypeOf(r.svc, c.pci, c.to, placement.RetypeDone)
	audits := w.retypeAuditsOf(c.pci)
	if len(audits) != 1 || audits[0][0] != id.String() || !strings.Contains(audits[0][1], `"from": "`+c.from+`"`) ||
		!strings.Contains(audits[0][1], `"to": "`+c.to+`"`) || !strings.Contains(audits[0][1], "request "+id.String()) {
		t.Errorf("gpu.retype audit rows = %v, want one of request %s, from %s to %s, naming the request", audits, id, c.from, c.to)
	}
	// The agent's next report: the T4 holds the bridge's mdev of
	// nvidia-230, so only nvidia-230 is creatable; published again, the
	// provider keeps the new type.
	w.reportedActive(mdev, inst, true, 30*time.Second)
	_, err := r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish after the re-type")
	w.wantTraits(rp, c.toTrait)
	w.wantOwnedInventory(rp, 16, 1)
	w.wantOnlyCreatableOfferedOf(c, rp)
}

// TestRetypeOnDemandMdevRefused: a direct-path request for T4-1Q on a
// host whose only bridge-owned T4 offers nvidia-231 is refused
// no_capacity, and the T4 keeps nvidia-231 (Placement, the bridge's
// state, no audit row, no mdev of nvidia-230), when the T4 holds an mdev
// of the bridge, and when retype_on_demand is off (the reason says so and
// names the GPU an operator can re-type).
func TestRetypeOnDemandMdevRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		on     bool
		inUse  bool
		reason []string
	}{
		{"in use", true, true, []string{"re-type on demand", "in use", "mdev(s) of the bridge"}},
		{"off", false, false, []string{"retype_on_demand is off", "vgpuctl gpu retype", mdevGPU}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			r, rp := w.ownMdevGPU(replicaOpts{name: "r1", retypeOnDemand: c.on}, mdevType)
			used := 0
			if c.inUse {
				inst := w.domains[4].UUID
				id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": mdevProfile})
				if res := w.wait(id, 60*time.Second); res.State != requests.Succeeded {
					t.Fatalf("attach %s: %s (%s: %s)", mdevProfile, res.State, res.Code, res.Reason)
				}
				// The agent's report shows the bridge's mdev on the T4.
				w.reportedActive(w.attachedMdev(inst, rp, mdevType), inst, true, 30*time.Second)
				used = 1
			}
			inst := w.domains[3].UUID
			id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": mdevRetypeProfile})
			res := w.wait(id, 60*time.Second)
			if res.State != requests.Failed || res.Code != flow.CodeNoCapacity {
				t.Fatalf("attach %s: %s (%s: %s), want failed %s", mdevRetypeProfile, res.State, res.Code, res.Reason, flow.CodeNoCapacity)
			}
			for _, s := range c.reason {
				if !strings.Contains(res.Reason, s) {
					t.Errorf("reason %q does not say %q", res.Reason, s)
				}
			}
			if atts := w.attachments(inst); len(atts) != 0 {
				t.Errorf("attachments of the refused request's instance: %+v, want none", atts)
			}
			w.wantTraits(rp, mdevTrait)
			w.wantOwnedInventory(rp, 8, used)
			w.wantOffersOf(mdevRetype, rp, true, false)
			w.wantOwnedTypeOf(r.svc, mdevGPU, mdevType, "")
			if a := w.retypeAuditsOf(mdevGPU); len(a) != 0 {
				t.Errorf("gpu.retype audit rows = %v, want none", a)
			}
		})
	}
}

// TestBridgeOwnedMdevRetypeAPI: the operator's re-type (POST
// /v1/hosts/{name}/gpus/{pci}/retype, as vgpuctl gpu retype) takes an
// mdev type for an empty bridge-owned T4: its provider then offers
// nvidia-230 (16 units) and not nvidia-231. A numeric (vendor-VFIO) type
// is not creatable on an mdev GPU, and what is no type id is an invalid
// field (each 422, problem+json); neither changes the provider.
func TestBridgeOwnedMdevRetypeAPI(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r, rp := w.ownMdevGPU(replicaOpts{name: "r1"}, mdevType)

	for _, c := range []struct {
		typeID, says string
	}{{retypeTo, "Type not creatable"}, {"nvidia 230", "invalid_params"}} {
		code, body, ctype := w.retypeAPI(r.svc, mdevGPU, c.typeID)
		if code != http.StatusUnprocessableEntity || ctype != "application/problem+json" || !strings.Contains(body, c.says) {
			t.Errorf("POST retype to %q: %d %s (%s), want 422 problem+json saying %s", c.typeID, code, body, ctype, c.says)
		}
	}
	w.wantTraits(rp, mdevTrait)
	w.wantOwnedInventory(rp, 8, 0)

	code, body, _ := w.retypeAPI(r.svc, mdevGPU, mdevRetypeTo)
	if code != http.StatusOK {
		t.Fatalf("POST retype: %d %s", code, body)
	}
	var res placementapi.RetypeResult
	testsvc.Must(t, json.Unmarshal([]byte(body), &res), "retype answer")
	if res.TypeID != mdevRetypeTo || res.Step != placement.RetypeDone || res.PCI != mdevGPU {
		t.Errorf("retype answer = %+v, want %s %s done", res, mdevGPU, mdevRetypeTo)
	}
	w.wantTraits(rp, mdevRetypeTrait)
	w.wantOwnedInventory(rp, 16, 0)
	w.wantOffersOf(mdevRetype, rp, false, true)
	w.wantNeverVGPUCandidate(rp)
	if a := w.retypeAuditsOf(mdevGPU); len(a) != 1 || !strings.Contains(a[0][1], `"to": "`+mdevRetypeTo+`"`) {
		t.Errorf("gpu.retype audit rows = %v, want one to %s", a, mdevRetypeTo)
	}
}
