package pipeline_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const t42qTrait = "CUSTOM_NVIDIA_231" // T4-2Q

var resizePolicy = testsvc.DirectPolicy(testsvc.RuleReleaseOnRequest, testsvc.RuleResizeOnRequest)

// resizeToT42Q starts a world whose gpuB offers T4-2Q (with an mdev of
// type foreign on it when set), gives an instance a T4-4Q on gpuA, asks
// to move it to T4-2Q and waits for the end of that request.
func resizeToT42Q(t *testing.T, foreign string) (w *world, inst string, old attachmentRow, id uuid.UUID, r requests.Request) {
	t.Helper()
	w = newWorldWith(t, resizePolicy, withGPUB(t42qTrait, 8, foreign))
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	inst = w.domains[3].UUID
	old = w.attachT44Q(inst)
	id = w.submit("GPU_RESIZE", inst, map[string]any{"vgpu_profile": "T4-2Q"})
	return w, inst, old, id, w.wait(id, 60*time.Second)
}

// attachT44Q gives inst a T4-4Q (on gpuA, the GPU that offers it) and
// returns its attachment.
func (w *world) attachT44Q(inst string) attachmentRow {
	w.t.Helper()
	r := w.wait(w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q", "count": 1}), 60*time.Second)
	if r.State != requests.Succeeded {
		w.t.Fatalf("attach: %s (%s: %s)", r.State, r.Code, r.Reason)
	}
	atts := w.attachments(inst)
	if len(atts) != 1 || atts[0].pci != gpuA {
		w.t.Fatalf("attachments after the attach: %+v", atts)
	}
	w.reportedActive(atts[0].id, inst, true, 30*time.Second)
	return atts[0]
}

// swappedToB asserts what request id (a resize or a move of inst's vGPU
// old) did: detach, remove, then attach; old released; one vGPU attached,
// on GPU B. It returns that one.
func (w *world) swappedToB(id uuid.UUID, inst string, old attachmentRow, what string) attachmentRow {
	t := w.t
	t.Helper()
	var kinds string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT string_agg(kind, ',' ORDER BY seq) FROM commands WHERE request_id = $1`, id).Scan(&kinds), "commands")
	if kinds != "detach_vgpu,remove_mdev,attach_vgpu" {
		t.Errorf("commands of the %s: %s, want detach_vgpu,remove_mdev,attach_vgpu", what, kinds)
	}
	var attached []attachmentRow
	for _, a := range w.attachments(inst) {
		switch {
		case a.id == old.id && a.state != flow.AttReleased:
			t.Errorf("the old vGPU is %s after the %s, want released", a.state, what)
		case a.id != old.id && a.state == flow.AttAttached:
			attached = append(attached, a)
		}
	}
	if len(attached) != 1 || attached[0].pci != gpuB || attached[0].provider != w.gpus[gpuB] {
		t.Fatalf("attached after the %s: %+v, want one on GPU B %s", what, attached, gpuB)
	}
	return attached[0]
}

// TestDirectResize: T4-4Q → T4-2Q on the direct path, then a release.
// The old vGPU is detached and removed before the new one is created and
// attached on the GPU that offers T4-2Q; Placement ends with the new
// claim only; the request's commands ran in that order.
func TestDirectResize(t *testing.T) {
	t.Parallel()
	w, inst, old, id, r := resizeToT42Q(t, "")
	if r.State != requests.Succeeded {
		t.Fatalf("resize: %s (%s: %s)", r.State, r.Code, r.Reason)
	}
	attached := []attachmentRow{w.swappedToB(id, inst, old, "resize")}
	al := w.allocations(inst)
	if al[w.gpus[gpuB]]["VGPU"] != 1 || al[w.gpus[gpuA]]["VGPU"] != 0 {
		t.Errorf("Placement after the resize: %v, want VGPU 1 on gpuB only", al)
	}
	if w.mdevExists(old.id) || !w.mdevExists(attached[0].id) {
		t.Errorf("fake sysfs: old mdev exists %v, new %v; want false, true", w.mdevExists(old.id), w.mdevExists(attached[0].id))
	}
	w.reportedActive(attached[0].id, inst, true, 30*time.Second)
	t.Logf("resize T4-4Q → T4-2Q: %s", r.FinishedAt.Sub(r.CreatedAt).Round(time.Millisecond))

	// Giving it back.
	if r := w.wait(w.submit("GPU_RELEASE", inst, nil), 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("release: %s (%s: %s)", r.State, r.Code, r.Reason)
	}
	if n := vgpuUnits(w.allocations(inst)); n != 0 || w.mdevExists(attached[0].id) {
		t.Errorf("after the release: VGPU %d, mdev exists %v; want 0, false", n, w.mdevExists(attached[0].id))
	}
}

// TestDirectResizeFailureRestores: the new profile cannot be created on
// the host (its GPU holds an mdev of another type Placement does not know
// of), so the agent fails the attach: the request fails, the new claim is
// returned and the old vGPU is created and attached again, under the
// claim it kept.
func TestDirectResizeFailureRestores(t *testing.T) {
	t.Parallel()
	w, inst, old, id, r := resizeToT42Q(t, "nvidia-222")
	if r.State != requests.Failed || (r.Code != flow.CodeAgentFailed && r.Code != flow.CodeAgentRefused) {
		t.Fatalf("resize onto a full GPU: %s (%s: %s), want failed by the agent", r.State, r.Code, r.Reason)
	}
	// The restore runs after the request ended: wait for it on the host
	// first. The report alone cannot tell: one sent before the resize's
	// remove_mdev still shows the old mdev active.
	for deadline := time.Now().Add(60 * time.Second); !w.mdevExists(old.id); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the old mdev %s is not back", old.id)
		}
	}
	w.reportedActive(old.id, inst, true, 60*time.Second)
	al := w.allocations(inst)
	if al[w.gpus[gpuA]]["VGPU"] != 1 || al[w.gpus[gpuB]]["VGPU"] != 0 {
		t.Errorf("Placement after the failed resize: %v, want VGPU 1 on gpuA only (the old claim)", al)
	}
	for _, a := range w.attachments(inst) {
		if a.id == old.id && a.state != flow.AttAttached {
			t.Errorf("the old vGPU is %s, want attached", a.state)
		}
		if a.id != old.id && a.state != flow.AttFailed {
			t.Errorf("the new vGPU is %s, want failed", a.state)
		}
	}
	var restores int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE request_id = $1 AND action = 'restore' AND object_id = $2`,
		id.String(), old.id).Scan(&restores), "audit")
	if restores != 1 {
		t.Errorf("audit records of the restore: %d, want 1", restores)
	}
}

// TestFailedRestoreIsRecorded: the agent cannot attach the old vGPU again
// after a failed profile change (its restore command fails). The bridge
// had put the old vGPU back as attached when it queued the restore; the
// failed answer ends it failed, gives its claim back and says so in the
// audit log, instead of leaving a vGPU the VM does not have on record.
func TestFailedRestoreIsRecorded(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, resizePolicy, withGPUB(t42qTrait, 8, ""))
	w.startAgent()
	br := w.startBridge(replicaOpts{name: "r1"})
	inst := w.domains[3].UUID
	old := w.attachT44Q(inst)

	// The failed profile change and its restore command, sent: what
	// restoreReleases queued and the relay published.
	reqID, cmdID := uuid.New(), uuid.New()
	instID := uuid.MustParse(inst)
	testsvc.Must(t, pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) error {
		if err := w.requests.Create(w.ctx, tx, requests.Request{ID: reqID, Source: "webhook:pipetest", Kind: "GPU_RESIZE", InstanceUUID: &instID}); err != nil {
			return err
		}
		if _, err := tx.Exec(w.ctx, `UPDATE requests SET state = 'failed', code = 'agent_failed', finished_at = now() WHERE id = $1`, reqID); err != nil {
			return err
		}
		_, err := tx.Exec(w.ctx, `INSERT INTO commands (id, request_id, host, kind, body, seq, purpose, attachment_id, instance_uuid, sent_at)
			VALUES ($1, $2, $3, 'attach_vgpu', '{}', 9, 'compensation', $4, $5, now())`, cmdID, reqID, w.host, old.id, inst)
		return err
	}), "failed request and its restore")

	err := br.proc.HandleResult(w.ctx, protocol.Result{CommandID: cmdID.String(), Host: w.host, Status: protocol.Failed, Code: "no_capacity",
		Message: "create mdev " + old.id + ": available_instances is 0"})
	testsvc.Must(t, err, "handle the restore's result")

	atts := w.attachments(inst)
	if len(atts) != 1 || atts[0].state != flow.AttFailed {
		t.Fatalf("attachments %+v, want the old one failed", atts)
	}
	if al := w.allocations(inst); al[w.gpus[gpuA]]["VGPU"] != 0 {
		t.Errorf("Placement still holds the old claim: %v", al)
	}
	var why string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT coalesce(detail->>'reason', '') FROM audit_log WHERE request_id = $1 AND action = 'restore_failed' AND object_id = $2`,
		reqID.String(), old.id).Scan(&why), "audit")
	if !strings.Contains(why, "could not be restored") || !strings.Contains(why, "available_instances is 0") {
		t.Errorf("restore_failed reason %q", why)
	}
	// A second delivery of the same answer changes nothing.
	testsvc.Must(t, br.proc.HandleResult(w.ctx, protocol.Result{CommandID: cmdID.String(), Host: w.host, Status: protocol.Failed}), "again")
}

// TestDirectResizeNeedsRetype: no GPU of the host offers the new profile,
// but one is empty: the change fails no_capacity before anything is
// sent, its reason says needs_retype and names that GPU, and the old
// vGPU stays attached with its claim.
func TestDirectResizeNeedsRetype(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, resizePolicy, withGPUB(t42qTrait, 8, ""))
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	inst := w.domains[3].UUID
	old := w.attachT44Q(inst)

	id := w.submit("GPU_RESIZE", inst, map[string]any{"vgpu_profile": "T4-8Q"}) // no GPU is set to T4-8Q
	r := w.wait(id, 60*time.Second)
	if r.State != requests.Failed || r.Code != flow.CodeNoCapacity || !strings.Contains(r.Reason, "needs_retype") || !strings.Contains(r.Reason, gpuB) {
		t.Fatalf("resize to a profile no GPU offers: %s (%s: %s); want no_capacity, needs_retype naming %s", r.State, r.Code, r.Reason, gpuB)
	}
	// GPU B is Nova's: the reason carries the host's nova.conf change
	// (GPU A keeps T4-4Q and its vGPU) and the vgpuctl command.
	if want := "enabled_mdev_types = nvidia-232, nvidia-233\n\n[mdev_nvidia-232]\ndevice_addresses = " + gpuA + "\n\n[mdev_nvidia-233]\ndevice_addresses = " + gpuB; !strings.Contains(r.Reason, want) ||
		!strings.Contains(r.Reason, `"vgpuctl fleet retype --gpu `+w.host+"/"+gpuB+`=nvidia-233"`) {
		t.Errorf("needs_retype reason %q: want the nova.conf change %q and the vgpuctl command", r.Reason, want)
	}
	var sent int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM commands WHERE request_id = $1`, id).Scan(&sent), "commands")
	if sent != 0 {
		t.Errorf("%d commands for a change that cannot be placed", sent)
	}
	if atts := w.attachments(inst); len(atts) != 1 || atts[0].id != old.id || atts[0].state != flow.AttAttached {
		t.Errorf("attachments %+v, want the old one attached", atts)
	}
	if al := w.allocations(inst); al[w.gpus[gpuA]]["VGPU"] != 1 || al[w.gpus[gpuB]]["VGPU"] != 0 {
		t.Errorf("Placement %v, want the old claim only", al)
	}
}
