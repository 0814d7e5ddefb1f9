package pipeline_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestDirectAttach: a GPU_REQUEST for an instance on a fake-host agent →
// claim on a GPU child provider of the instance's host, alongside its
// VCPU/MEMORY_MB, mdev created in sysfs and attached to the domain,
// request succeeded.
func TestDirectAttach(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	inst := w.domains[3].UUID // instance-00000004, running, no vGPU
	beforeA := w.available(gpuA)

	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q", "count": 1})
	r := w.wait(id, 60*time.Second)
	if r.State != requests.Succeeded {
		t.Fatalf("request %s: %s (%s: %s)", id, r.State, r.Code, r.Reason)
	}
	atts := w.attachments(inst)
	if len(atts) != 1 || atts[0].state != flow.AttAttached {
		t.Fatalf("attachments = %+v, want one attached", atts)
	}
	a := atts[0]
	// Pack: the GPU that already serves T4-4Q (Nova's mdev) is chosen.
	if a.pci != gpuA || a.provider != w.gpus[gpuA] {
		t.Errorf("attached on %s (%s), want %s (%s)", a.pci, a.provider, gpuA, w.gpus[gpuA])
	}
	al := w.allocations(inst)
	if got := al[w.gpus[gpuA]]["VGPU"]; got != 1 {
		t.Errorf("VGPU on the GPU provider = %d, want 1 (allocations %v)", got, al)
	}
	if al[w.root]["VCPU"] != 2 || al[w.root]["MEMORY_MB"] != 2048 {
		t.Errorf("the instance's own allocations changed: %v", al)
	}
	if !w.mdevExists(a.id) {
		t.Errorf("mdev %s is not in the fake sysfs", a.id)
	}
	if got := w.available(gpuA); got != beforeA-1 {
		t.Errorf("available_instances of %s: %d → %d, want one fewer", gpuA, beforeA, got)
	}
	// The domain has the hostdev: the agent reports the mdev as the
	// instance's.
	w.reportedActive(a.id, inst, true, 30*time.Second)

	// One attach_vgpu (it creates the mdev) was published once and succeeded.
	var kinds string
	var sentOnce int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT string_agg(kind, ',' ORDER BY seq), count(*) FILTER (WHERE publish_attempts = 1 AND sent_at IS NOT NULL AND result_status = 'succeeded')
		FROM commands WHERE request_id = $1`, id).Scan(&kinds, &sentOnce), "commands")
	if kinds != "attach_vgpu" || sentOnce != 1 {
		t.Errorf("commands: %s, of which %d sent once and succeeded; want attach_vgpu, sent once and succeeded", kinds, sentOnce)
	}
	var decisions int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM decisions WHERE request_id = $1`, id).Scan(&decisions), "decisions")
	if decisions != 1 {
		t.Errorf("decisions = %d, want 1", decisions)
	}
	// The report mapped the host to its node.
	var node string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT node FROM hosts WHERE name = $1`, w.host).Scan(&node), "host row")
	if node != w.node {
		t.Errorf("hosts.node = %q, want %q", node, w.node)
	}

	// Nova powers the server on again (it rebuilds the domain from its own
	// definition, without the bridge's vGPU): the bridge attaches it again.
	_, err := w.pool.Exec(w.ctx, `INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload, project_id)
		VALUES ('nova', $1, 'instance.power_on.end', $2, now(), '{}', $3)`, testsvc.Name("msg"), inst, w.project)
	testsvc.Must(t, err, "nova event")
	deadline := time.Now().Add(60 * time.Second)
	for {
		var st, kinds string
		err := w.pool.QueryRow(w.ctx, `SELECT r.state, (SELECT string_agg(kind || ':' || coalesce(result_status,'-'), ',') FROM commands WHERE request_id = r.id)
			FROM requests r WHERE r.source = 'nova' AND r.kind = 'instance.power_on.end' AND r.instance_uuid = $1`, inst).Scan(&st, &kinds)
		if err == nil && requests.State(st).Final() {
			if st != string(requests.Succeeded) || kinds != "attach_vgpu:succeeded" {
				t.Errorf("re-attach request %s, commands %s", st, kinds)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no finished re-attach request (%v %s)", err, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	w.reportedActive(a.id, inst, true, 30*time.Second)
}

// TestAgentNeverAnswers: no agent consumes the host's queue → after the
// deadline the request fails with a reason naming the host and command,
// the claim is released (the instance keeps its own allocations) and the
// compensation is in the audit log. The request reads failed only once
// Placement has the claim back, though Placement is slowed by a second.
func TestAgentNeverAnswers(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.startBridge(replicaOpts{name: "r1", requestTimeout: 3 * time.Second, releaseDelay: time.Second})
	inst := w.domains[4].UUID

	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q"})
	// While the agent is silent the claim is held.
	deadline := time.Now().Add(10 * time.Second)
	for vgpuUnits(w.allocations(inst)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the claim never appeared in Placement")
		}
		time.Sleep(50 * time.Millisecond)
	}
	r := w.wait(id, 30*time.Second)
	if r.State != requests.Failed || r.Code != flow.CodeAgentTimeout {
		t.Fatalf("request: %s code %q (%s); want failed %s", r.State, r.Code, r.Reason, flow.CodeAgentTimeout)
	}
	for _, s := range []string{w.host, "did not answer", "attach_vgpu"} {
		if !strings.Contains(r.Reason, s) {
			t.Errorf("reason %q does not mention %q", r.Reason, s)
		}
	}
	al := w.allocations(inst) // no wait: failed means given back
	if n := vgpuUnits(al); n != 0 {
		t.Errorf("VGPU still claimed when the request read failed: %v", al)
	}
	if al[w.root]["VCPU"] != 2 {
		t.Errorf("the instance's own allocations were touched: %v", al)
	}
	if n := w.auditCount(id, "compensate"); n != 1 {
		t.Errorf("compensate audit rows = %d, want 1", n)
	}
	atts := w.attachments(inst)
	if len(atts) != 1 || atts[0].state != flow.AttFailed {
		t.Errorf("attachments = %+v, want one failed", atts)
	}
	// remove_mdev is queued for the mdev attach_vgpu may have made.
	var removes int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM commands WHERE request_id = $1 AND purpose = 'compensation' AND kind = 'remove_mdev'`,
		id).Scan(&removes), "commands")
	if removes != 1 {
		t.Errorf("compensation remove_mdev commands = %d, want 1", removes)
	}
}

// TestRelease: attach, then GPU_RELEASE → detach_vgpu + remove_mdev on the
// host and the claim released.
func TestRelease(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	inst := w.domains[5].UUID

	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q"})
	if r := w.wait(id, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("attach: %s (%s: %s)", r.State, r.Code, r.Reason)
	}
	a := w.attachments(inst)[0]
	w.reportedActive(a.id, inst, true, 30*time.Second)

	rel := w.submit("GPU_RELEASE", inst, nil)
	r := w.wait(rel, 60*time.Second)
	if r.State != requests.Succeeded {
		t.Fatalf("release: %s (%s: %s)", r.State, r.Code, r.Reason)
	}
	var kinds string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT string_agg(kind || ':' || result_status, ',' ORDER BY seq) FROM commands WHERE request_id = $1`,
		rel).Scan(&kinds), "commands")
	if kinds != "detach_vgpu:succeeded,remove_mdev:succeeded" {
		t.Errorf("release commands = %s", kinds)
	}
	if w.mdevExists(a.id) {
		t.Errorf("mdev %s still exists", a.id)
	}
	al := w.allocations(inst)
	if n := vgpuUnits(al); n != 0 || al[w.root]["VCPU"] != 2 {
		t.Errorf("allocations after release = %v, want VCPU/MEMORY_MB only", al)
	}
	if st := w.attachments(inst)[0].state; st != flow.AttReleased {
		t.Errorf("attachment state %s, want released", st)
	}
	w.reportedActive(a.id, inst, false, 30*time.Second)

	// Nothing left to release: rejected with the reason.
	again := w.submit("GPU_RELEASE", inst, nil)
	if r := w.wait(again, 30*time.Second); r.State != requests.Rejected {
		t.Errorf("second release: %s (%s), want rejected", r.State, r.Reason)
	}
}

// TestTwoReplicas: two pipelines and relays on the same database and
// queues handle a burst of requests: one decision and one claim per
// request, each command published once, one mdev per request.
func TestTwoReplicas(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	w.startBridge(replicaOpts{name: "r2"})
	insts := []string{w.domains[3].UUID, w.domains[4].UUID, w.domains[5].UUID, w.domains[6].UUID}
	before := w.available(gpuA) + w.available(gpuB)

	ids := make([]string, len(insts))
	var wg sync.WaitGroup
	for i, inst := range insts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q"}).String()
		}()
	}
	wg.Wait()
	for i, id := range ids {
		r := w.wait(mustUUID(t, id), 90*time.Second)
		if r.State != requests.Succeeded {
			t.Errorf("request %d: %s (%s: %s)", i, r.State, r.Code, r.Reason)
		} else {
			t.Logf("request %d: accepted → succeeded in %s", i, r.FinishedAt.Sub(r.CreatedAt).Round(time.Millisecond))
		}
	}
	for _, inst := range insts {
		if n := vgpuUnits(w.allocations(inst)); n != 1 {
			t.Errorf("instance %s holds %d VGPU, want 1", inst, n)
		}
		if atts := w.attachments(inst); len(atts) != 1 {
			t.Errorf("instance %s has %d attachments, want 1", inst, len(atts))
		}
	}
	var cmds, once, decisions, replicas int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*), count(*) FILTER (WHERE publish_attempts = 1 AND result_status = 'succeeded') FROM commands`).
		Scan(&cmds, &once), "commands")
	if cmds != len(insts) || once != cmds {
		t.Errorf("commands %d, published once and succeeded %d; want %d and %d (one attach_vgpu each)", cmds, once, len(insts), len(insts))
	}
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*), count(DISTINCT replica) FROM decisions`).Scan(&decisions, &replicas), "decisions")
	if decisions != len(insts) {
		t.Errorf("decisions = %d, want %d", decisions, len(insts))
	}
	t.Logf("decisions taken by %d replica(s)", replicas)
	if after := w.available(gpuA) + w.available(gpuB); after != before-len(insts) {
		t.Errorf("available instances %d → %d, want %d fewer", before, after, len(insts))
	}
}

func mustUUID(t *testing.T, s string) uuid.UUID {
	t.Helper()
	u, err := uuid.Parse(s)
	testsvc.Must(t, err, "uuid")
	return u
}

// TestCancelCompensates: an operator cancels a request while its agent
// has not answered → the claim is released and the compensation recorded,
// and the request reads cancelled only once Placement has the claim back,
// though Placement is slowed by a second: until then it is not final, its
// release and its end planned.
func TestCancelCompensates(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	r1 := w.startBridge(replicaOpts{name: "r1", releaseDelay: time.Second})
	inst := w.domains[6].UUID
	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q"})
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := w.requests.Get(w.ctx, id)
		testsvc.Must(t, err, "get")
		if r.State == requests.Dispatched {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("request still %s", r.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// What POST /v1/requests/{id}/cancel does (requests.Canceller).
	cancelled := make(chan error, 1)
	go func() { cancelled <- r1.direct.Cancel(w.ctx, id, "admin") }()
	// While Placement is slow to take the claim back, the request is not
	// final: the release and the cancel wait, planned.
	deadline = time.Now().Add(10 * time.Second)
	for w.plannedReleases(inst) == 0 {
		select {
		case err := <-cancelled:
			t.Fatalf("the cancel returned (%v) with no release planned before it", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no release planned after the cancel")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var ends int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM planned_finishes WHERE request_id = $1 AND code = $2`, id, flow.CodeCancelled).Scan(&ends), "planned ends")
	if r, err := w.requests.Get(w.ctx, id); err != nil || r.State.Final() || ends != 1 {
		t.Errorf("request while its release is planned: %s (%v), planned cancelled ends %d; want it not final, 1", r.State, err, ends)
	}
	testsvc.Must(t, <-cancelled, "cancel")
	r := w.wait(id, 10*time.Second)
	if r.State != requests.Failed || r.Code != flow.CodeCancelled || r.Reason != "cancelled by admin" {
		t.Errorf("request after the cancel: %s code %q (%s); want failed %s", r.State, r.Code, r.Reason, flow.CodeCancelled)
	}
	if n := vgpuUnits(w.allocations(inst)); n != 0 { // no wait: final means given back
		t.Errorf("VGPU still claimed when the request read cancelled: %d", n)
	}
	if n, c := w.auditCount(id, "compensate"), w.auditCount(id, "cancel"); n != 1 || c != 1 {
		t.Errorf("compensate audit rows %d, cancel %d; want 1 and 1", n, c)
	}
	if err := r1.direct.Cancel(w.ctx, id, "admin"); !requests.IsIllegal(err) {
		t.Errorf("cancel of a cancelled request: %v, want ErrIllegal", err)
	}
	if atts := w.attachments(inst); len(atts) != 1 || atts[0].state != flow.AttFailed {
		t.Errorf("attachments %+v, want one failed", atts)
	}
}
