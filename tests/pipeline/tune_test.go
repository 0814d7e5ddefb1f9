package pipeline_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// tuneRules are operator rules that change a GPU's tuning: a training
// VM's GPU gets 1200 MHz application clocks once its vGPU is attached (the
// clocks may change while VMs run); when the VM gives its vGPU back, the
// GPU, now without a running vGPU, is switched to the equal share
// scheduler with a 4 ms timeslice (NVIDIA's driver changes the scheduler
// only while no VM runs on the GPU).
const tuneRules = `  - name: training-clocks
    on: [bridge.vgpu_changed]
    when: event.labels.change != "release" && event.workload == "training"
    then: ['tune("", 0, 1200)']
  - name: release-and-share
    on: [webhook.GPU_RELEASE]
    then: ['release()', 'tune("equal_share", 4000, 0)']
`

// TestTuneChangesTheGPU: a clock change and a scheduler change go from the
// rule through the bridge and the signed commands to the agent and NVML
// (the mock of the fake host), which reads back the new values; the
// commands' results carry the read-back, verified. The GPU starts on
// other values, so the test sees a change, not a setting already there.
func TestTuneChangesTheGPU(t *testing.T) {
	t.Parallel()
	// GPU B offers T4-8Q and holds nothing else: the VM's vGPU is the only
	// one on it (GPU A holds Nova's vGPU of a running VM).
	w := newWorldWith(t, testsvc.DirectPolicy(tuneRules), withGPUB("CUSTOM_NVIDIA_233", 2, ""))
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	inst := w.domains[3].UUID // instance-00000004, running, no vGPU
	// Read before the request: the attach's follow-up (the clocks) may
	// run as soon as the attach succeeds.
	before := w.readGPU(pci.MustParse(gpuB))
	if before.Clocks.AppSM == 1200 || (before.Scheduler != nil && before.Scheduler.Policy == gpu.PolicyEqualShare) {
		t.Fatalf("GPU B starts with the tuning the test sets: %+v %+v", before.Clocks, before.Scheduler)
	}

	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-8Q", "count": 1, "workload": "training"})
	if r := w.wait(id, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("request %s: %s (%s: %s)", id, r.State, r.Code, r.Reason)
	}
	atts := w.attachments(inst)
	if len(atts) != 1 {
		t.Fatalf("attachments %+v, want one", atts)
	}
	addr := pci.MustParse(atts[0].pci)
	if addr != pci.MustParse(gpuB) {
		t.Fatalf("the vGPU is on %s, want GPU B %s", addr, gpuB)
	}

	// The clocks: the follow-up rule of the attach.
	follow := w.bridgeRequest(inst, 1, 60*time.Second)
	if follow.State != requests.Succeeded {
		t.Fatalf("follow-up request %s: %s (%s: %s)", follow.ID, follow.State, follow.Code, follow.Reason)
	}
	applied := w.tuneResult(follow.ID, "set_clocks")
	if !applied.verified || !applied.Applied.Changed || applied.Applied.AppSMMHz != 1200 || applied.Applied.AppMemMHz != before.Clocks.AppMem {
		t.Errorf("set_clocks result %+v, want a verified change to 1200 MHz SM, memory clock kept at %d MHz", applied, before.Clocks.AppMem)
	}
	if g := w.readGPU(addr); g.Clocks.AppSM != 1200 || g.Clocks.AppMem != before.Clocks.AppMem {
		t.Errorf("NVML reads back application clocks %+v, want SM 1200 MHz, memory %d MHz", g.Clocks, before.Clocks.AppMem)
	}

	// The scheduler: the release, then the GPU without a running vGPU.
	rel := w.submit("GPU_RELEASE", inst, nil)
	if r := w.wait(rel, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("release %s: %s (%s: %s)", rel, r.State, r.Code, r.Reason)
	}
	applied = w.tuneResult(rel, "set_vgpu_scheduler")
	if !applied.verified || !applied.Applied.Changed || applied.Applied.Scheduler == nil ||
		*applied.Applied.Scheduler != (gpu.Scheduler{Policy: gpu.PolicyEqualShare, TimesliceUs: 4000}) {
		t.Errorf("set_vgpu_scheduler result %+v, want a verified change to equal_share, 4000 µs", applied)
	}
	if g := w.readGPU(addr); g.Scheduler == nil || *g.Scheduler != (gpu.Scheduler{Policy: gpu.PolicyEqualShare, TimesliceUs: 4000}) {
		t.Errorf("NVML reads back scheduler %+v, want equal_share, 4000 µs", g.Scheduler)
	}
}

// readGPU reads a GPU of the fake host through the NVML backend the
// agent uses.
func (w *world) readGPU(a pci.Addr) gpu.GPU {
	w.t.Helper()
	gs, err := w.drv.GPU.GPUs(w.ctx)
	testsvc.Must(w.t, err, "read the GPUs")
	for _, g := range gs {
		if g.Addr == a {
			return g
		}
	}
	w.t.Fatalf("no GPU %s on the fake host", a)
	return gpu.GPU{}
}

type tuneDetails struct {
	status   string
	verified bool
	Applied  gpu.Applied
}

// tuneResult returns the result of request id's command of kind.
func (w *world) tuneResult(id uuid.UUID, kind string) tuneDetails {
	w.t.Helper()
	var status string
	var raw []byte
	testsvc.Must(w.t, w.pool.QueryRow(w.ctx, `SELECT coalesce(result_status, ''), coalesce(result->'details', 'null')
		FROM commands WHERE request_id = $1 AND kind = $2`, id, kind).Scan(&status, &raw), kind+" command of "+id.String())
	var d struct {
		Applied  gpu.Applied `json:"applied"`
		Verified bool        `json:"verified"`
	}
	testsvc.Must(w.t, json.Unmarshal(raw, &d), "details")
	return tuneDetails{status: status, verified: status == "succeeded" && d.Verified, Applied: d.Applied}
}

// TestTenantTuneRefusedOnASharedGPU: tuning a webhook request asks for
// (a tenant's, not an operator rule's) is refused with the reason when
// another tenant's vGPU shares the GPU (GPU A holds the vGPU of another
// project's VM), audited, and the GPU keeps its clocks; on a GPU the
// tenant is alone on (GPU B), the same request is applied and read back.
func TestTenantTuneRefusedOnASharedGPU(t *testing.T) {
	t.Parallel()
	other := "0ther0project0000000000000000001"
	w := newWorldWith(t, testsvc.DirectPolicy(), withGPUB("CUSTOM_NVIDIA_233", 2, ""), withProjects(map[int]string{0: other}))
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	shared, alone := w.domains[3].UUID, w.domains[4].UUID
	tune := map[string]any{"clocks_mhz": 1200}

	for _, c := range []struct {
		inst, profile, gpu string
	}{{shared, "T4-4Q", gpuA}, {alone, "T4-8Q", gpuB}} {
		id := w.submit("GPU_REQUEST", c.inst, map[string]any{"vgpu_profile": c.profile, "count": 1, "workload": "inference"})
		if r := w.wait(id, 60*time.Second); r.State != requests.Succeeded {
			t.Fatalf("request %s: %s (%s: %s)", id, r.State, r.Code, r.Reason)
		}
		if atts := w.attachments(c.inst); len(atts) != 1 || atts[0].pci != c.gpu {
			t.Fatalf("attachments of %s: %+v, want one on %s", c.inst, atts, c.gpu)
		}
	}
	before := w.readGPU(pci.MustParse(gpuA))

	// Shared: refused, with the reason, audited; the clocks stay.
	id := w.submit("GPU_LOAD", shared, map[string]any{"tune": tune})
	r := w.wait(id, 60*time.Second)
	var refused string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT coalesce(d.decision->'refused'->0->>'reason', '') FROM decisions d WHERE d.request_id = $1`,
		id).Scan(&refused), "decision")
	if !strings.Contains(refused, "GPU "+gpuA) || !strings.Contains(refused, "shared with another tenant") || !strings.Contains(refused, other) {
		t.Errorf("refusal %q, want GPU %s shared with project %s", refused, gpuA, other)
	}
	if r.State == requests.Succeeded || !strings.Contains(r.Reason, "shared with another tenant") {
		t.Errorf("request %s: %s (%s), want it not to succeed, with the reason", id, r.State, r.Reason)
	}
	if n := w.auditCount(id, "tune_refused"); n != 1 {
		t.Errorf("%d tune_refused audit rows, want 1", n)
	}
	var n int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM commands WHERE request_id = $1`, id).Scan(&n), "commands")
	if g := w.readGPU(pci.MustParse(gpuA)); n != 0 || g.Clocks.AppSM != before.Clocks.AppSM {
		t.Errorf("%d commands; GPU A's SM application clock %d, want none and still %d", n, g.Clocks.AppSM, before.Clocks.AppSM)
	}

	// Alone: applied and read back.
	id = w.submit("GPU_LOAD", alone, map[string]any{"tune": tune})
	if r := w.wait(id, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("tune on the tenant's own GPU %s: %s (%s: %s)", id, r.State, r.Code, r.Reason)
	}
	if res := w.tuneResult(id, "set_clocks"); !res.verified || res.Applied.AppSMMHz != 1200 {
		t.Errorf("set_clocks result %+v, want verified at 1200 MHz", res)
	}
	if g := w.readGPU(pci.MustParse(gpuB)); g.Clocks.AppSM != 1200 {
		t.Errorf("GPU B's SM application clock %d, want 1200", g.Clocks.AppSM)
	}
}
