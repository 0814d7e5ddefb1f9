package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocationcandidates"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/direct"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// The fake host's H200-like GPU: 8 VFs, 0000:c1:00.4 typed 1429
// (H200X-70C, at most 2 per GPU) and attached to instance-00000002 by
// Nova; the test declares the GPU bridge-owned for type 1429.
const (
	vfPF      = "0000:c1:00.0"
	novaVF    = "0000:c1:00.4"
	vfType    = "1429"
	vfTrait   = "CUSTOM_1429"
	vfProfile = "H200X-70C"
)

// vfWorld is a world whose bridge owns the fake host's VF GPU, once the
// agent reported it and the bridge published its provider.
func vfWorld(t *testing.T) (*world, *bridgeReplica, string) {
	return vfWorldWith(t, replicaOpts{name: "r1"})
}

// vfWorldWith is vfWorld with a bridge started with o (its owned GPUs
// are the world's VF GPU).
func vfWorldWith(t *testing.T, o replicaOpts) (*world, *bridgeReplica, string) {
	w := newWorld(t)
	r, rp := w.ownVFGPU(o, vfType)
	return w, r, rp
}

// ownVFGPU starts the world's agent and a bridge started with o that owns
// the world's VF GPU for typeID (or placement.MixedType), and returns the
// bridge and the provider it published once the agent reported.
func (w *world) ownVFGPU(o replicaOpts, typeID string) (*bridgeReplica, string) {
	w.t.Helper()
	w.startAgent()
	o.owned = []placement.OwnedDecl{{Host: w.host, PCI: vfPF, TypeID: typeID}}
	r := w.startBridge(o)
	w.reportedFreeVFs(30 * time.Second)
	n, err := r.svc.PublishOwned(w.ctx)
	testsvc.Must(w.t, err, "publish the bridge-owned GPUs")
	if n != 1 {
		w.t.Fatalf("PublishOwned changed %d providers, want 1 (created)", n)
	}
	rp := w.ownedProvider()
	w.gpus[vfPF] = rp // removed with the world's providers
	return r, rp
}

// TestBridgeOwnedVFAttachRelease: a bridge-owned VF GPU is a child
// provider of the compute node's provider with CUSTOM_VGPU_BRIDGE
// inventory (the VFs it can still type: Nova's typed VF is not counted)
// and the type's trait; a plain VGPU:1 allocation-candidates query never
// returns it. A direct-path request types a free VF (never Nova's), hot-
// plugs it and claims on that provider; a second request finds no room;
// the release detaches the VF, clears its type and gives the claim back.
func TestBridgeOwnedVFAttachRelease(t *testing.T) {
	t.Parallel()
	w, r, rp := vfWorld(t)

	// The provider: parent = the compute node, one VF of type 1429 left
	// (Nova's VF holds the other), the type trait.
	p, err := resourceproviders.Get(w.ctx, w.sc, rp).Extract()
	testsvc.Must(t, err, "get provider")
	if p.ParentProviderUUID != w.root || p.Name != placement.GPUProviderName(w.node, vfPF) {
		t.Errorf("provider %s parent %s, want %s under %s", p.Name, p.ParentProviderUUID, placement.GPUProviderName(w.node, vfPF), w.root)
	}
	w.wantOwnedInventory(rp, 1, 0)
	tr, err := resourceproviders.GetTraits(w.ctx, w.sc, rp).Extract()
	testsvc.Must(t, err, "traits")
	if !slices.Equal(tr.Traits, []string{vfTrait}) {
		t.Errorf("traits = %v, want [%s]", tr.Traits, vfTrait)
	}
	w.wantNeverVGPUCandidate(rp)

	inst, other := w.domains[3].UUID, w.domains[4].UUID
	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": vfProfile})
	if res := w.wait(id, 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("attach: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	vf := w.attachedVF(inst, rp, vfType)
	if vf == novaVF || !strings.HasPrefix(vf, "0000:c1:") {
		t.Fatalf("attached VF %q: want a free VF of %s, not Nova's %s", vf, vfPF, novaVF)
	}
	if got := w.vfType(novaVF); got != vfType {
		t.Errorf("Nova's VF %s: current_vgpu_type = %q, want it untouched (%s)", novaVF, got, vfType)
	}
	var params string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT body->>'params' FROM commands WHERE request_id = $1 AND kind = 'attach_vgpu'`, id).Scan(&params), "command")
	var ap protocol.AttachParams
	testsvc.Must(t, json.Unmarshal([]byte(params), &ap), "attach params")
	if !ap.VendorVFIO || ap.ParentPCI != vf || ap.TypeID != vfType {
		t.Errorf("attach_vgpu params = %+v, want vendor_vfio, parent_pci %s, type_id %s", ap, vf, vfType)
	}
	al := w.allocations(inst)
	if al[rp][placement.BridgeClass] != 1 || vgpuUnits(al) != 0 || al[w.root]["VCPU"] != 2 {
		t.Errorf("allocations = %v, want 1 %s on %s beside VCPU/MEMORY_MB", al, placement.BridgeClass, rp)
	}
	w.reportedVF(vf, inst, true, 30*time.Second)
	// Published again from the new report: the typed VF is the bridge's
	// now, so the GPU still holds one vGPU of the type, in use.
	_, err = r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish again")
	w.wantOwnedInventory(rp, 1, 1)
	w.wantNeverVGPUCandidate(rp)

	// No VF of the type is left: the next request is refused.
	id2 := w.submit("GPU_REQUEST", other, map[string]any{"vgpu_profile": vfProfile})
	if res := w.wait(id2, 60*time.Second); res.State != requests.Failed || res.Code != flow.CodeNoCapacity {
		t.Errorf("second attach: %s (%s: %s), want failed %s", res.State, res.Code, res.Reason, flow.CodeNoCapacity)
	}

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
	if got := w.vfType(vf); got != "0" {
		t.Errorf("current_vgpu_type of %s after the release = %q, want 0 (cleared)", vf, got)
	}
	if got := w.vfType(novaVF); got != vfType {
		t.Errorf("Nova's VF %s after the release: %q, want %s", novaVF, got, vfType)
	}
	al = w.allocations(inst)
	if al[rp][placement.BridgeClass] != 0 || al[w.root]["VCPU"] != 2 {
		t.Errorf("allocations after the release = %v, want VCPU/MEMORY_MB only", al)
	}
	w.reportedVF(vf, inst, false, 30*time.Second)
	_, err = r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish after the release")
	w.wantOwnedInventory(rp, 1, 0)
	w.wantNeverVGPUCandidate(rp)
}

// TestBridgeOwnedVFStaleRelease: instance A's vGPU is released and the
// same VF is typed for instance B; A's release commands delivered again
// (late, or repeated with new ids) leave B's vGPU as it is: its VF keeps
// its type, stays attached to B, and B keeps its claim.
func TestBridgeOwnedVFStaleRelease(t *testing.T) {
	t.Parallel()
	w, r, rp := vfWorld(t)
	instA, instB := w.domains[3].UUID, w.domains[4].UUID

	id := w.submit("GPU_REQUEST", instA, map[string]any{"vgpu_profile": vfProfile})
	if res := w.wait(id, 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("attach A: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	attA := w.attachmentRows(instA)[0]
	w.reportedVF(attA.PCIAddress, instA, true, 30*time.Second)
	if res := w.wait(w.submit("GPU_RELEASE", instA, nil), 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("release A: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	w.reportedVF(attA.PCIAddress, instA, false, 30*time.Second)
	_, err := r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish")

	id = w.submit("GPU_REQUEST", instB, map[string]any{"vgpu_profile": vfProfile})
	if res := w.wait(id, 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("attach B: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	attB := w.attachmentRows(instB)[0]
	if attB.PCIAddress != attA.PCIAddress {
		t.Fatalf("B got VF %s, A had %s: the scenario needs the VF reused", attB.PCIAddress, attA.PCIAddress)
	}
	w.reportedVF(attB.PCIAddress, instB, true, 30*time.Second)

	// A's release again, as a request of its own through the outbox.
	late := uuid.New()
	now := time.Now()
	cmds, err := direct.ReleaseCommands(attA, false, late.String(), now, now.Add(time.Minute))
	testsvc.Must(t, err, "release commands")
	rows := make([]requests.Command, len(cmds))
	for i, c := range cmds {
		body, err := json.Marshal(c)
		testsvc.Must(t, err, "command body")
		aid := attA.ID
		rows[i] = requests.Command{ID: c.ID, Host: c.Host, Kind: string(c.Kind), Body: body, ExpiresAt: c.ExpiresAt, Seq: i + 1,
			AttachmentID: &aid, InstanceUUID: c.InstanceUUID}
	}
	a := uuid.MustParse(instA)
	testsvc.Must(t, pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) error {
		if err := w.requests.Create(w.ctx, tx, requests.Request{ID: late, Source: "webhook:pipetest", Kind: "GPU_RELEASE", InstanceUUID: &a, Body: []byte(`{}`)}); err != nil {
			return err
		}
		return requests.QueueCommands(w.ctx, tx, late, requests.PurposeAction, rows)
	}), "queue the late release")
	r.disp.Kick()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var done int
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM commands WHERE request_id = $1 AND finished_at IS NOT NULL`, late).Scan(&done), "late commands")
		if done == len(cmds) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the late release's commands did not finish (%d of %d)", done, len(cmds))
		}
		time.Sleep(100 * time.Millisecond)
	}
	var remove string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT result_status || ':' || coalesce(result->>'code', '') FROM commands WHERE request_id = $1 AND kind = 'remove_mdev'`,
		late).Scan(&remove), "late remove")
	if remove != "refused:"+protocol.CodeNotOwned {
		t.Errorf("late remove_mdev answered %s, want refused:%s", remove, protocol.CodeNotOwned)
	}
	if got := w.vfType(attB.PCIAddress); got != vfType {
		t.Errorf("B's VF %s: current_vgpu_type = %q after A's late release, want %s", attB.PCIAddress, got, vfType)
	}
	w.reportedVF(attB.PCIAddress, instB, true, 30*time.Second)
	if al := w.allocations(instB); al[rp][placement.BridgeClass] != 1 {
		t.Errorf("B's allocations after A's late release = %v, want its claim kept", al)
	}
	if st := w.attachmentRows(instB)[0].State; st != flow.AttAttached {
		t.Errorf("B's attachment is %s, want attached", st)
	}
}

// TestBridgeOwnedVFPublishedBySyncLeader: the placement service's sync
// loop (the replica holding the sync lock) publishes a declared GPU once
// its agent reported it, with no call of the test's: the provider appears
// under the compute node, in the bridge's index too.
func TestBridgeOwnedVFPublishedBySyncLeader(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.startAgent()
	r := w.startBridge(replicaOpts{name: "r1", owned: []placement.OwnedDecl{{Host: w.host, PCI: vfPF, TypeID: vfType}},
		syncInterval: 500 * time.Millisecond})
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	name := placement.GPUProviderName(w.node, vfPF)
	deadline := time.Now().Add(60 * time.Second)
	for {
		ps, err := w.placementClient().Providers(w.ctx, placement.ListOpts{Name: name})
		testsvc.Must(t, err, "list providers")
		if len(ps) == 1 {
			if g, ok := r.svc.Index().Lookup(ps[0].UUID); ok && g.Class == placement.BridgeClass {
				w.gpus[vfPF] = ps[0].UUID
				if ps[0].ParentUUID != w.root {
					t.Errorf("provider %s parent %s, want the compute node %s", name, ps[0].ParentUUID, w.root)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sync loop never published %s (providers %+v)", name, ps)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestBridgeOwnedVFRefusedWhenNovaReportsIt: a declared GPU whose VFs
// Nova's resource tracker reports in Placement ([pci] device_spec with
// report_in_placement: a provider <node>_<PF> under the compute node) is
// Nova's: the bridge creates no provider for it and says why.
func TestBridgeOwnedVFRefusedWhenNovaReportsIt(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.startAgent()
	r := w.startBridge(replicaOpts{name: "r1", owned: []placement.OwnedDecl{{Host: w.host, PCI: vfPF, TypeID: vfType}}})
	w.reportedFreeVFs(30 * time.Second)
	nova := uuid.NewString()
	_, err := resourceproviders.Create(w.ctx, w.sc, resourceproviders.CreateOpts{Name: w.node + "_" + strings.ToUpper(vfPF), UUID: nova,
		ParentProviderUUID: w.root}).Extract()
	testsvc.Must(t, err, "Nova's PCI provider")
	w.gpus["nova-pf"] = nova
	n, err := r.svc.PublishOwned(w.ctx)
	if !errors.Is(err, placement.ErrNotOwned) || n != 0 {
		t.Errorf("PublishOwned = %d, %v; want 0, %v", n, err, placement.ErrNotOwned)
	}
	ps, err := w.placementClient().Providers(w.ctx, placement.ListOpts{Name: placement.GPUProviderName(w.node, vfPF)})
	testsvc.Must(t, err, "list providers")
	if len(ps) != 0 {
		w.gpus[vfPF] = ps[0].UUID
		t.Errorf("the bridge created %s for a GPU Nova reports", ps[0].UUID)
	}
}

// reportedFreeVFs waits until the host's kept report lists free VFs of
// the VF GPU.
func (w *world) reportedFreeVFs(within time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		if r, ok := w.report(); ok {
			for _, g := range r.GPUs {
				if g.PCI == vfPF && g.VendorVFIO && len(g.FreeVFs) > 0 {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("no report listing free VFs of %s", vfPF)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reportedVF waits for the kept report to list (want) or not the VF as an
// agent-owned vGPU of the instance.
func (w *world) reportedVF(vf, instance string, want bool, within time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		if r, ok := w.report(); ok {
			found := false
			for _, g := range r.GPUs {
				for _, a := range g.Active {
					if a.PCI == vf && a.InstanceUUID == instance && a.Owner == protocol.OwnerAgent {
						found = true
					}
				}
			}
			if found == want {
				return
			}
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("the agent's report never showed VF %s attached to %s = %v", vf, instance, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (w *world) report() (protocol.Report, bool) {
	var raw []byte
	var r protocol.Report
	if err := w.pool.QueryRow(w.ctx, `SELECT report FROM hosts WHERE name = $1`, w.host).Scan(&raw); err != nil || raw == nil {
		return r, false
	}
	testsvc.Must(w.t, json.Unmarshal(raw, &r), "report")
	return r, true
}

// ownedProvider is the uuid of the VF GPU's provider in Placement.
func (w *world) ownedProvider() string {
	w.t.Helper()
	ps, err := w.placementClient().Providers(w.ctx, placement.ListOpts{Name: placement.GPUProviderName(w.node, vfPF)})
	testsvc.Must(w.t, err, "list providers")
	if len(ps) != 1 {
		w.t.Fatalf("providers named %s: %d, want 1", placement.GPUProviderName(w.node, vfPF), len(ps))
	}
	return ps[0].UUID
}

func (w *world) placementClient() *placement.Client {
	c, err := placement.NewClient(w.ctx, placement.ClientConfig{Endpoint: testsvc.PlacementURL(w.t), Token: "admin"})
	testsvc.Must(w.t, err, "placement client")
	return c
}

// wantOwnedInventory checks the provider's only inventory is total units
// of placement.BridgeClass, used of them in use.
func (w *world) wantOwnedInventory(rp string, total, used int) {
	w.t.Helper()
	c := w.placementClient()
	inv, _, err := c.Inventories(w.ctx, rp)
	testsvc.Must(w.t, err, "inventories")
	if len(inv) != 1 || inv[placement.BridgeClass].Total-inv[placement.BridgeClass].Reserved != total {
		w.t.Errorf("inventories of %s = %+v, want %d usable %s only", rp, inv, total, placement.BridgeClass)
	}
	u, _, err := c.Usages(w.ctx, rp)
	testsvc.Must(w.t, err, "usages")
	if u[placement.BridgeClass] != used {
		w.t.Errorf("usage of %s = %v, want %d %s", rp, u, used, placement.BridgeClass)
	}
}

// wantNeverVGPUCandidate asks Placement what Nova's scheduler asks for a
// resources:VGPU=1 flavor in the world's tree: rp is never in an
// allocation request (provider_summaries lists every provider of a
// candidate's tree, rp too: that is no candidate).
func (w *world) wantNeverVGPUCandidate(rp string) {
	w.t.Helper()
	for _, q := range []string{"VGPU:1", "VGPU:1,VCPU:1"} {
		pages, err := allocationcandidates.List(w.sc, allocationcandidates.ListOpts{Resources: q, InTree: w.root}).AllPages(w.ctx)
		testsvc.Must(w.t, err, "allocation candidates")
		ac, err := allocationcandidates.ExtractAllocationCandidates(pages)
		testsvc.Must(w.t, err, "allocation candidates")
		if len(ac.AllocationRequests) == 0 {
			w.t.Errorf("GET /allocation_candidates?resources=%s: none, want the T4s (the query is wrong)", q)
		}
		for _, ar := range ac.AllocationRequests {
			if _, ok := ar.Allocations[rp]; ok {
				w.t.Errorf("GET /allocation_candidates?resources=%s returned the bridge-owned provider %s", q, rp)
			}
		}
	}
}

// vfType reads a VF's nvidia/current_vgpu_type on the fake host.
// attachedVF checks that the instance holds one vGPU, attached on the
// provider rp, on a VF typed typ, and returns that VF.
func (w *world) attachedVF(inst, rp, typ string) string {
	w.t.Helper()
	atts := w.attachments(inst)
	if len(atts) != 1 || atts[0].state != flow.AttAttached || atts[0].provider != rp {
		w.t.Fatalf("attachments of %s = %+v, want one attached on %s", inst, atts, rp)
	}
	if got := w.vfType(atts[0].pci); got != typ {
		w.t.Errorf("current_vgpu_type of %s = %q, want %s", atts[0].pci, got, typ)
	}
	return atts[0].pci
}

func (w *world) vfType(vf string) string {
	b, err := os.ReadFile(filepath.Join(w.fake, "sys", "bus", "pci", "devices", vf, "nvidia", "current_vgpu_type"))
	testsvc.Must(w.t, err, "current_vgpu_type of "+vf)
	return strings.TrimSpace(string(b))
}

// attachmentRows are the instance's attachments as the bridge keeps them.
func (w *world) attachmentRows(instance string) []flow.Attachment {
	rows, err := w.pool.Query(w.ctx, `SELECT `+requests.AttachmentColumns+` FROM vgpu_attachments WHERE instance_uuid = $1 ORDER BY created_at DESC`, instance)
	testsvc.Must(w.t, err, "attachments")
	out, err := requests.ScanAttachments(rows)
	testsvc.Must(w.t, err, "attachments")
	if len(out) == 0 {
		w.t.Fatalf("no attachment of %s", instance)
	}
	return out
}
