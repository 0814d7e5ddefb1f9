package pipeline_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// gpuFaultRules are the GPU fault rules of doc/source/operations.rst:
// a vGPU the bridge attached moves off the faulted GPU; the tenant of a
// vGPU that came with the flavor (Nova's) is told.
const gpuFaultRules = `  - name: gpu-fault-move
    on: [bridge.GPU_FAULT]
    when: instance.vgpus.exists(v, v.gpu == event.labels.gpu && v.path == "direct")
    then: ['move()']
  - name: gpu-fault-tell
    on: [bridge.GPU_FAULT]
    when: instance.vgpus.exists(v, v.gpu == event.labels.gpu && v.path == "nova")
    then: ['notify("the GPU of your vGPU failed (" + event.labels.reason + "); migrate the VM to get a healthy one")']
`

// TestGPUFaultMovesDirectVGPU: GPU A holds Nova's vGPU (the flavor's, of
// instance-00000001) and a direct-path one the bridge attached. An Xid 79
// injected on A through the agent's NVML mock: the bridge marks A, the
// rule's move() takes the direct-path vGPU to GPU B (its claim moved in
// Placement, the mdev gone from A and made on B by the agent, the
// bridge's attachment on B), the Nova-path VM's tenant gets the rule's
// notify (vgpu.policy.notify on RabbitMQ) and keeps its vGPU, a new
// request lands on B, not A; an operator's undrain clears the mark.
func TestGPUFaultMovesDirectVGPU(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testsvc.DirectPolicy(testsvc.RuleReleaseOnRequest, gpuFaultRules), withDomains(1))
	topic := w.startRelay(t, "pipe-fault")

	ctl := controls.NewStore(w.pool, nil, logger())
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1", faults: ctl})
	novaVM, directVM, later := w.domains[0].UUID, w.domains[3].UUID, w.domains[4].UUID
	// Nova's notifications told the bridge of the vGPU of novaVM's flavor.
	_, err := w.pool.Exec(w.ctx, `UPDATE instances SET vgpus = 1 WHERE uuid = $1`, novaVM)
	testsvc.Must(t, err, "the Nova VM's flavor vGPU")
	old := w.attachT44Q(directVM) // on A, next to Nova's vGPU
	novaBefore := w.allocations(novaVM)
	if novaBefore[w.gpus[gpuA]]["VGPU"] != 1 {
		t.Fatalf("Nova's VM holds %v, want VGPU 1 on GPU A", novaBefore)
	}

	w.waitFor(30*time.Second, "the agent watching GPU A's Xid events", func() bool {
		return w.drv.NVMLMock.InjectXid(pci.MustParse(gpuA), 79)
	})
	const reason = "Xid 79: GPU has fallen off the bus"
	w.waitFor(30*time.Second, "GPU A marked for its fault", func() bool {
		var fault string
		var drained bool
		err := w.pool.QueryRow(w.ctx, `SELECT coalesce(fault_reason,''), drained FROM gpus WHERE provider_uuid = $1`, w.gpus[gpuA]).Scan(&fault, &drained)
		return err == nil && fault == reason && drained
	})

	// The direct-path VM: its fault request moves the vGPU to B.
	moveReq := w.faultRequest(directVM)
	if r := w.wait(moveReq, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("the move of %s off GPU A: %s (%s: %s)", directVM, r.State, r.Code, r.Reason)
	}
	moved := []attachmentRow{w.swappedToB(moveReq, directVM, old, "move")}
	if al := w.allocations(directVM); al[w.gpus[gpuB]]["VGPU"] != 1 || al[w.gpus[gpuA]]["VGPU"] != 0 {
		t.Errorf("Placement after the move: %v, want VGPU 1 on GPU B only", al)
	}
	if w.mdevExists(old.id) || !w.mdevExists(moved[0].id) {
		t.Errorf("fake sysfs: old mdev exists %v, new %v; want false, true", w.mdevExists(old.id), w.mdevExists(moved[0].id))
	}
	w.reportedActive(moved[0].id, directVM, true, 30*time.Second)
	w.waitEvent(directVM, "move", 30*time.Second) // rules on bridge.vgpu_changed hear of it as a move
	var profile string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT profile FROM vgpu_attachments WHERE id = $1`, moved[0].id).Scan(&profile), "profile")
	if profile != "T4-4Q" {
		t.Errorf("the moved vGPU is %s, want the same profile T4-4Q", profile)
	}

	// The Nova-path VM: its tenant is told, its vGPU (Nova's) stays.
	// No request of a tenant asked for anything: the bridge's event has
	// no request (nor callback), the notification tells the tenant.
	const told = "the GPU of your vGPU failed (" + reason + "); migrate the VM to get a healthy one"
	payload := w.consumeNotification(notify.RoutingKey(topic, notify.Info), notify.PolicyNotify, 30*time.Second)
	var p notify.NotifyPayload
	testsvc.Must(t, json.Unmarshal(payload, &p), "notification payload")
	if p.Message != told || p.InstanceUUID != novaVM || p.ProjectID != w.project || p.Rule != "gpu-fault-tell" || p.RequestID != "" ||
		p.RequestKind != requests.EventGPUFault || p.Source != "bridge" {
		t.Errorf("vgpu.policy.notify payload %+v, want %q of rule gpu-fault-tell for %s of project %s", p, told, novaVM, w.project)
	}
	if al := w.allocations(novaVM); al[w.gpus[gpuA]]["VGPU"] != 1 {
		t.Errorf("Nova's VM after the fault: %v, want its VGPU on A untouched", al)
	}
	var notified int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE action = 'notify' AND object_id = $1`, directVM).Scan(&notified), "audit")
	if notified != 0 {
		t.Errorf("%d notify audit rows for the direct-path VM, want none (its rule moves)", notified)
	}

	// Nothing new lands on A.
	if r := w.wait(w.submit("GPU_REQUEST", later, map[string]any{"vgpu_profile": "T4-4Q", "count": 1}), 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("a new request: %s (%s: %s)", r.State, r.Code, r.Reason)
	}
	if atts := w.attachments(later); len(atts) != 1 || atts[0].pci != gpuB {
		t.Errorf("a new vGPU after the fault: %+v, want it on GPU B", atts)
	}

	// The operator clears the mark after the GPU recovered.
	g, err := ctl.DrainGPU(w.ctx, controls.Actor{Name: "ops"}, w.gpus[gpuA], "GPU reset, Xid cleared", false, nil)
	testsvc.Must(t, err, "undrain GPU A")
	if g.Drained || g.FaultReason != "" {
		t.Errorf("after undrain: %+v", g)
	}
	var actions []string
	rows, err := w.pool.Query(w.ctx, `SELECT action FROM audit_log WHERE object_id = $1 ORDER BY id`, w.gpus[gpuA])
	testsvc.Must(t, err, "audit")
	for rows.Next() {
		var a string
		testsvc.Must(t, rows.Scan(&a), "audit")
		actions = append(actions, a)
	}
	rows.Close()
	if !slices.Contains(actions, "gpu.fault") || !slices.Contains(actions, "gpu.undrain") {
		t.Errorf("GPU A's audit: %v, want gpu.fault and gpu.undrain", actions)
	}
}

// faultRequest waits for the request the bridge opened for instance's
// bridge.GPU_FAULT event and returns its id.
func (w *world) faultRequest(instance string) uuid.UUID {
	w.t.Helper()
	var id uuid.UUID
	w.waitFor(30*time.Second, "the GPU_FAULT request of "+instance, func() bool {
		return w.pool.QueryRow(w.ctx, `SELECT id FROM requests WHERE kind = $1 AND instance_uuid = $2`, requests.EventGPUFault, instance).Scan(&id) == nil
	})
	return id
}

// TestGPUFaultMoveWithoutRoom: the host's other GPU serves another type
// (T4-2Q), so move() finds no GPU for the T4-4Q: the request fails with
// code no_capacity and a reason that says so, and the vGPU stays where
// it is (attached, its claim on the faulted GPU), nothing sent to the
// agent.
func TestGPUFaultMoveWithoutRoom(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testsvc.DirectPolicy(testsvc.RuleReleaseOnRequest, gpuFaultRules), withGPUB(t42qTrait, 8, ""))
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1", faults: controls.NewStore(w.pool, nil, logger())})
	inst := w.domains[3].UUID
	old := w.attachT44Q(inst)
	w.waitFor(30*time.Second, "the agent watching GPU A's Xid events", func() bool {
		return w.drv.NVMLMock.InjectXid(pci.MustParse(gpuA), 79)
	})
	id := w.faultRequest(inst)
	r := w.wait(id, 60*time.Second)
	if r.State != requests.Failed || r.Code != flow.CodeNoCapacity || !strings.Contains(r.Reason, "move off GPU "+gpuA+": no other GPU of host "+w.host) {
		t.Fatalf("the move with no room: %s (%s: %s), want failed no_capacity saying no other GPU can take it", r.State, r.Code, r.Reason)
	}
	if atts := w.attachments(inst); len(atts) != 1 || atts[0].id != old.id || atts[0].state != flow.AttAttached {
		t.Errorf("attachments after the failed move: %+v, want only the old one, attached", atts)
	}
	if al := w.allocations(inst); al[w.gpus[gpuA]]["VGPU"] != 1 || vgpuUnits(al) != 1 {
		t.Errorf("Placement after the failed move: %v, want VGPU 1 on GPU A", al)
	}
	var n int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM commands WHERE request_id = $1`, id).Scan(&n), "commands")
	if n != 0 || !w.mdevExists(old.id) {
		t.Errorf("%d commands sent, old mdev exists %v; want none sent, the mdev kept", n, w.mdevExists(old.id))
	}
}
