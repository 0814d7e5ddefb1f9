package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestTenantResizeRecorded is scenario 2: a tenant resizes a server to a
// vGPU flavor through Nova by hand (resize, then confirm). The bridge
// records the instance's vGPU (its demand and, from the host's agent,
// the physical GPU) and applies the policy's operator tuning rule on the
// host's agent (set_vm_limits on the domain); it makes no Nova call.
func TestTenantResizeRecorded(t *testing.T) {
	w := newWorld(t, worldOpts{typ: typeTenant})
	plain := w.flavor("small", 2, 2048, 10, 0)
	vgpu := w.flavor("small.vgpu", 2, 2048, 10, 1)
	w.startBridge()
	vm := w.n.CreateServer(t, "e2e-tenant", plain, w.host)
	srv := w.n.WaitServer(t, vm, "ACTIVE")
	w.systemdScope(srv.InstanceName)
	w.waitInstance(vm, w.host, 0)
	w.waitAgent()

	// The tenant's resize, through Nova's API.
	sc := w.n.ComputeClient(t)
	testsvc.Must(t, servers.Resize(w.ctx, sc, vm, servers.ResizeOpts{FlavorRef: vgpu}).ExtractErr(), "resize")
	w.n.WaitServer(t, vm, "VERIFY_RESIZE")
	testsvc.Must(t, servers.ConfirmResize(w.ctx, sc, vm).ExtractErr(), "confirm resize")
	w.n.WaitServer(t, vm, "ACTIVE")
	w.assertResized(vm, "small.vgpu")

	// Recorded: the instance's vGPU demand, and the GPU the agent reported.
	w.waitInstance(vm, w.host, 1)
	var rec struct {
		GPU    string `json:"gpu"`
		VGPUs  int    `json:"vgpus"`
		Flavor string `json:"flavor"`
		Host   string `json:"host"`
	}
	var raw []byte
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := w.pool.QueryRow(w.ctx, `SELECT detail FROM audit_log WHERE action = 'vgpu_recorded' AND object_id = $1 ORDER BY id DESC LIMIT 1`, vm).Scan(&raw)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no vgpu_recorded audit row for %s after 2m: %v", vm, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	testsvc.Must(t, json.Unmarshal(raw, &rec), "audit detail")
	if rec.GPU != gpuPCI || rec.VGPUs != 1 || rec.Flavor != w.flavorName("small.vgpu") || rec.Host != w.host {
		t.Errorf("recorded %+v, want 1 vGPU of %s on GPU %s of %s", rec, w.flavorName("small.vgpu"), gpuPCI, w.host)
	}

	// Tuned: the operator rule's set_vm_limits went to the host's agent,
	// which applied it to the domain's cgroup.
	var reqID uuid.UUID
	deadline = time.Now().Add(2 * time.Minute)
	for {
		err := w.pool.QueryRow(w.ctx, `SELECT id FROM requests WHERE instance_uuid = $1 AND source = 'nova' AND kind = 'instance.resize_finish.end'`, vm).Scan(&reqID)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request for the tuning of %s after 2m: %v", vm, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := w.waitFinal(reqID)
	if r.State != "succeeded" {
		t.Fatalf("tuning request %s: %s (%s): %s", reqID, r.State, r.Code, r.Reason)
	}
	var host, status string
	var params []byte
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT host, coalesce(result_status,''), body->'params' FROM commands WHERE request_id = $1 AND kind = 'set_vm_limits'`,
		reqID).Scan(&host, &status, &params), "tuning command")
	var p struct {
		CPUMax     string `json:"cpu_max"`
		MemoryHigh string `json:"memory_high"`
	}
	testsvc.Must(t, json.Unmarshal(params, &p), "params")
	if host != w.host || status != "succeeded" || p.CPUMax != "800000 100000" || p.MemoryHigh != "68719476736" {
		t.Errorf("set_vm_limits to %s (%s) with %+v; want %s succeeded, 800000 100000 and 64 GiB", host, status, p, w.host)
	}
	fh := w.n.FakeHost(w.host)
	dom, _ := fh.Domain(t, vm)
	cpu, mem, err := fh.Drivers.Cgroup.Limits(w.ctx, dom.Name)
	testsvc.Must(t, err, "domain cgroup")
	if cpu != "800000 100000" || mem != "68719476736" {
		t.Errorf("the domain's cgroup has cpu.max %q, memory.high %q; want the rule's limits", cpu, mem)
	}

	// The bridge called Nova for nothing: the resize was the tenant's.
	var calls int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM nova_resizes WHERE instance_uuid = $1`, vm).Scan(&calls), "nova_resizes")
	if calls != 0 {
		t.Errorf("the bridge recorded %d resizes of its own for a tenant's resize", calls)
	}
	if got := w.novaActions(vm); got["resize"] != 1 || got["confirmResize"] != 1 {
		t.Errorf("Nova's instance actions %v, want the tenant's resize and confirmResize only", got)
	}
}

// systemdScope plays systemd for the domain on the fake host: the scope
// libvirt's QEMU domains run in (machine.slice), where the agent sets
// limits. The harness's libvirt driver does not make it; the domain keeps
// its name across Nova's resize, and so the scope.
func (w *world) systemdScope(domain string) {
	w.t.Helper()
	dir := filepath.Join(w.n.FakeHost(w.host).Dir, "cgroup", "machine.slice", fakehost.ScopeName(1, domain))
	testsvc.Must(w.t, os.MkdirAll(filepath.Join(dir, "libvirt"), 0o755), "scope")
	for f, c := range map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n", "cpu.max": "max 100000\n",
		"memory.high": "max\n", "memory.max": "max\n", "libvirt/cgroup.controllers": "cpuset cpu io memory pids\n"} {
		testsvc.Must(w.t, os.WriteFile(filepath.Join(dir, f), []byte(c), 0o644), "scope file")
	}
}
