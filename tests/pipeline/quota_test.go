package pipeline_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestQuotaHoldsUnderConcurrency: ten requests for ten instances of one
// project whose quota allows four vGPUs, sent at once to two replicas:
// exactly four succeed, six end rejected with code quota, and Placement
// and the fake host hold four vGPUs. Before the per-project lock the
// decisions read the same usage and more than four passed.
func TestQuotaHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	const n, quota = 10, 4
	// Placement has room for all ten claims (gpuB says 8 T4-4Q): the
	// decisions run their claims in parallel, before the second round
	// rejects those over quota, so with less room a request can end
	// no_capacity instead (see the README's quota paragraph).
	w := newWorldWith(t, testsvc.DirectPolicy()+"projects:\n  PROJECT_ID:\n    quota: {max_vgpus: 4}\n", withDomains(n),
		withGPUB(t4qTrait, 8, ""))
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	w.startBridge(replicaOpts{name: "r2"})
	insts := w.domains[len(w.domains)-n:]
	ids := make([]uuid.UUID, n)
	var wg sync.WaitGroup
	for i, d := range insts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = w.submit("GPU_REQUEST", d.UUID, map[string]any{"vgpu_profile": "T4-4Q"})
		}()
	}
	wg.Wait()
	var ok, rejected int
	for i, id := range ids {
		r := w.wait(id, 120*time.Second)
		switch {
		case r.State == requests.Succeeded:
			ok++
		case r.State == requests.Rejected && r.Code == flow.CodeQuota:
			rejected++
		default:
			t.Errorf("request %d: %s (%s: %s), want succeeded or rejected with code quota", i, r.State, r.Code, r.Reason)
		}
	}
	if ok != quota || rejected != n-quota {
		t.Errorf("%d succeeded and %d rejected with code quota; want %d and %d", ok, rejected, quota, n-quota)
	}
	// The claims of the rejected requests are given back just after
	// their decisions: Placement comes down to the four.
	held := 0
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		held = 0
		for _, d := range insts {
			held += vgpuUnits(w.allocations(d.UUID))
		}
		if held == quota || time.Now().After(deadline) {
			break
		}
	}
	var attached int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM vgpu_attachments WHERE state = 'attached'`).Scan(&attached), "attachments")
	if held != quota || attached != quota {
		t.Errorf("Placement holds %d VGPU for the project's instances, %d attachments attached; want %d and %d", held, attached, quota, quota)
	}
}

// TestQuotaCountsNovaResizesInFlight: a Nova resize of the project still
// under way counts its vGPUs before Nova's notifications report them.
func TestQuotaCountsNovaResizesInFlight(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testsvc.DirectPolicy()+"projects:\n  PROJECT_ID:\n    quota: {max_vgpus: 4}\n")
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	// A resize through Nova to 3 × T4-4Q, at its verify step.
	resizing := w.domains[3].UUID
	rid, inst := uuid.New(), uuid.MustParse(resizing)
	testsvc.Must(t, pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) error { // a request, and no event for the pipeline
		return w.requests.Create(w.ctx, tx, requests.Request{ID: rid, Source: "webhook:pipetest", Kind: "GPU_REQUEST", InstanceUUID: &inst, Body: []byte(`{}`)})
	}), "request of the resize")
	_, err := w.pool.Exec(w.ctx, `INSERT INTO nova_resizes (request_id, instance_uuid, step, profile, trait, count, nova_request_id)
		VALUES ($1, $2, 'verifying', 'T4-4Q', 'CUSTOM_NVIDIA_232', 3, 'req-test')`, rid, resizing)
	testsvc.Must(t, err, "nova resize in flight")
	one := w.wait(w.submit("GPU_REQUEST", w.domains[4].UUID, map[string]any{"vgpu_profile": "T4-4Q"}), 60*time.Second)
	two := w.wait(w.submit("GPU_REQUEST", w.domains[5].UUID, map[string]any{"vgpu_profile": "T4-4Q"}), 60*time.Second)
	if one.State != requests.Succeeded || two.State != requests.Rejected || two.Code != flow.CodeQuota {
		t.Errorf("with 3 vGPUs resizing in: first %s (%s), second %s (%s: %s); want succeeded, then rejected with code quota",
			one.State, one.Code, two.State, two.Code, two.Reason)
	}
}

// TestQuotaCountsFlavorFramebuffer: an instance whose flavor holds a
// T4-4Q (resources:VGPU=1, trait:CUSTOM_NVIDIA_232=required) counts its
// 4 GiB against the project's framebuffer quota: with 8 GiB allowed, one
// more T4-4Q fits and a second is rejected with code quota.
func TestQuotaCountsFlavorFramebuffer(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testsvc.DirectPolicy()+"projects:\n  PROJECT_ID:\n    quota: {max_framebuffer_gib: 8}\n")
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	// domains[0] is Nova's vGPU instance: its flavor, as the bridge keeps it.
	_, err := w.pool.Exec(w.ctx, `UPDATE instances SET vgpus = 1,
		vgpu_demand = '{"groups":[{"resources":{"VGPU":1},"required":["CUSTOM_NVIDIA_232"]}]}' WHERE uuid = $1`, w.domains[0].UUID)
	testsvc.Must(t, err, "flavor vGPU")
	one := w.wait(w.submit("GPU_REQUEST", w.domains[4].UUID, map[string]any{"vgpu_profile": "T4-4Q"}), 60*time.Second)
	two := w.wait(w.submit("GPU_REQUEST", w.domains[5].UUID, map[string]any{"vgpu_profile": "T4-4Q"}), 60*time.Second)
	if one.State != requests.Succeeded || two.State != requests.Rejected || two.Code != flow.CodeQuota {
		t.Errorf("with a flavor's T4-4Q in the project: first %s (%s: %s), second %s (%s: %s); want succeeded, then rejected with code quota",
			one.State, one.Code, one.Reason, two.State, two.Code, two.Reason)
	}
}
