package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestGPUFaultKeepsNovaOff: an Xid 79 injected into the host's only T4
// through the agent's NVML mock reaches the bridge in the agent's report;
// the bridge drains the GPU and writes CUSTOM_VGPU_BRIDGE_GPU_FAULT on
// its provider (Nova's own, with no opt-in). Nova's scheduler then finds
// no valid host for a flavor that forbids the trait (as `flavor plan`
// makes them), and the bridge's direct path places no vGPU there. After
// `gpu undrain` the trait is gone and both place on the GPU again.
func TestGPUFaultKeepsNovaOff(t *testing.T) {
	w := newDirectWorld(t, "fault")
	t0 := time.Now()
	vm := w.bootServer(testsvc.Name("fault") + "-direct")
	// The VGPU in a numbered group, as `flavor plan` proposes it: the
	// trait is forbidden on the provider of the VGPU only. (Placement 8.0's
	// unnumbered group passes forbidden traits by name: a 500 on
	// PostgreSQL, ignored on MySQL.)
	flavor := w.n.CreateFlavor(t, testsvc.Name("fault")+".t4-4q", 2, 2048, 10, map[string]string{"resources1:VGPU": "1",
		"trait1:" + directTrait: "required", "trait1:" + nova.GPUFaultTrait: "forbidden"})
	hasTrait := func() bool {
		var out struct {
			Traits []string `json:"traits"`
		}
		testsvc.Must(t, w.n.PlacementCall(w.ctx, http.MethodGet, "/resource_providers/"+w.gpu+"/traits", nil, &out), "provider traits")
		return slices.Contains(out.Traits, nova.GPUFaultTrait)
	}
	vgpuTotal := func() int {
		var out struct {
			Inventories map[string]struct {
				Total int `json:"total"`
			} `json:"inventories"`
		}
		testsvc.Must(t, w.n.PlacementCall(w.ctx, http.MethodGet, "/resource_providers/"+w.gpu+"/inventories", nil, &out), "inventories")
		return out.Inventories["VGPU"].Total
	}

	mock := w.n.FakeHost(w.host).Drivers.NVMLMock
	w.waitFor(30*time.Second, "the agent watching the T4's Xid events", func() bool {
		return mock.InjectXid(pci.MustParse(directGPU), 79) // posted only once the agent registered
	})
	w.waitFor(60*time.Second, "the fault trait on the T4's provider", hasTrait)
	if n := vgpuTotal(); n != 4 {
		t.Errorf("the fault changed the Nova-owned provider's inventory: VGPU total %d, want 4", n)
	}
	t.Logf("fault injected → trait on the provider in %s", time.Since(t0).Round(100*time.Millisecond))

	// Nova: no valid host (the host's only GPU is faulted).
	refused := w.n.CreateServer(t, testsvc.Name("fault")+"-nova", flavor, w.host)
	if s := w.n.WaitServer(t, refused, "ERROR"); !strings.Contains(s.Fault, "No valid host") {
		t.Errorf("server on the faulted GPU: %s, fault %q; want ERROR with NoValidHost", s.Status, s.Fault)
	}
	// The direct path: nothing placed on the faulted GPU.
	id := w.gpuRequest(vm, "T4-4Q")
	if r := w.waitFinal(id); r.State == "succeeded" {
		t.Errorf("direct request %s succeeded with the host's only GPU faulted", id)
	}
	if al := w.n.Allocations(t, vm); al[w.gpu]["VGPU"] != 0 {
		t.Errorf("the direct path claimed on the faulted GPU: %v", al)
	}

	// The operator undrains: the trait goes, both paths place again.
	d, err := w.api.SetDrain(w.ctx, apiclient.DrainGPU, w.gpu, "GPU reset after Xid 79", false)
	testsvc.Must(t, err, "undrain")
	if d.Drained {
		t.Fatalf("undrain: %s", d.Raw)
	}
	w.waitFor(60*time.Second, "the fault trait removed", func() bool { return !hasTrait() })
	served := w.n.CreateServer(t, testsvc.Name("fault")+"-nova2", flavor, w.host)
	if s := w.n.WaitServer(t, served, "ACTIVE"); s.Host != w.host {
		t.Errorf("server after undrain on %q, want %s", s.Host, w.host)
	}
	if al := w.n.Allocations(t, served); al[w.gpu]["VGPU"] != 1 {
		t.Errorf("allocations after undrain: %v, want VGPU 1 on %s", al, w.gpu)
	}
	if r := w.waitFinal(w.gpuRequest(vm, "T4-4Q")); r.State != "succeeded" {
		t.Errorf("direct request after undrain: %s (%s) %s", r.State, r.Code, r.Reason)
	}
	if al := w.n.Allocations(t, vm); al[w.gpu]["VGPU"] != 1 {
		t.Errorf("direct claim after undrain: %v, want VGPU 1 on %s", al, w.gpu)
	}
	w.n.DeleteServer(t, refused)
	w.n.DeleteServer(t, served)
	t.Logf("whole scenario: %s", time.Since(t0).Round(100*time.Millisecond))
}

// faultMigratePolicy: a vGPU that came with the flavor (the Nova path)
// leaves a faulted GPU by a cold migration through Nova (move()), and its
// tenant is told (notify()).
const faultMigratePolicy = `version: 1
defaults:
  attach_mode: direct-live
rules:
  - name: gpu-fault-migrate
    on: [bridge.GPU_FAULT]
    when: instance.vgpus.exists(v, v.gpu == event.labels.gpu && v.path == "nova")
    then: ['move()']
  - name: gpu-fault-tell
    on: [bridge.GPU_FAULT]
    when: instance.vgpus.exists(v, v.gpu == event.labels.gpu && v.path == "nova")
    then: ['notify("the GPU of your vGPU failed (" + event.labels.reason + "); the VM moves to a healthy one")']
`

// TestGPUFaultMigratesFlavorVGPU: a server of a vGPU flavor that forbids
// the fault trait (as `flavor plan` makes them) runs on host a's T4. An
// Xid 79 injected there: the bridge marks the GPU, and the rule's move()
// cold-migrates the server through Nova (the migrate action, the flavor
// kept): Nova's scheduler picks host b's T4 (a's carries the trait now),
// b's agent verifies the vGPU, the bridge confirms. Afterwards the server
// holds one vGPU on b in Nova, Placement, the bridge and the host, none
// on a; Nova's actions are one migrate and one confirmResize. The
// server's tenant is told by the rule's notify(): the bridge's
// vgpu.policy.notify notification on RabbitMQ (a fault has no request of
// the tenant's, so no callback).
func TestGPUFaultMigratesFlavorVGPU(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "nova-token")
	n := sharedNova(t)
	testsvc.Must(t, os.WriteFile(tok, []byte(n.Token()+"\n"), 0o600), "nova token")
	topic := testsvc.Name("fmig-notify") // the bridge's own notifications: exchange and topic of the test's
	t.Cleanup(func() {
		for _, p := range []notify.Priority{notify.Info, notify.Error} {
			testsvc.DeleteQueue(n.AMQPURL(), topic, notify.RoutingKey(topic, p))
		}
	})
	w := newMoveWorldWith(t, "fmig", faultMigratePolicy, "nova.endpoint_override="+n.ComputeEndpoint(), "nova.token_file="+tok,
		"nova.poll_interval=100ms", "oslo_messaging_notifications.exchange="+topic, "oslo_messaging_notifications.topics="+topic,
		"oslo_messaging_notifications.declare_queues=true", "oslo_messaging_notifications.poll_interval=200ms")
	flavor := w.n.CreateFlavor(t, testsvc.Name("fmig")+".t4-4q", 2, 2048, 10, map[string]string{"resources1:VGPU": "1",
		"trait1:" + directTrait: "required", "trait1:" + nova.GPUFaultTrait: "forbidden"})
	vm := w.n.CreateServer(t, testsvc.Name("fmig")+"-vm", flavor, w.host)
	w.n.WaitServer(t, vm, "ACTIVE")
	w.assertOneVGPU("boot", vm, w.host, false)
	// The bridge hears of the fault for the instances the agent's report
	// puts on the GPU: wait for the report to list this one.
	w.waitFor(time.Minute, "the agent's report listing the server's vGPU", func() bool {
		var report string
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT coalesce(report::text, '') FROM hosts WHERE name = $1`, w.host).Scan(&report), "report")
		return strings.Contains(report, vm)
	})

	t0 := time.Now()
	mock := w.n.FakeHost(w.host).Drivers.NVMLMock
	w.waitFor(30*time.Second, "the agent watching the T4's Xid events", func() bool {
		return mock.InjectXid(pci.MustParse(directGPU), 79)
	})
	var moved apiclient.Request
	w.waitFor(5*time.Minute, "the bridge's move of "+vm+" to end", func() bool {
		l, err := w.api.Requests(w.ctx, apiclient.RequestFilter{InstanceUUID: vm})
		testsvc.Must(t, err, "requests")
		for _, r := range l.Requests {
			if r.State == "succeeded" || r.State == "failed" || r.State == "rejected" {
				moved = r
				return true
			}
		}
		return false
	})
	t.Logf("fault injected → migrated and confirmed in %s", time.Since(t0).Round(100*time.Millisecond))
	if moved.State != "succeeded" || !strings.Contains(moved.Reason, "cold-migrated through Nova") || !strings.Contains(moved.Reason, "to host "+w.b) {
		t.Fatalf("the move: %s (%s) %s; want succeeded, cold-migrated to %s", moved.State, moved.Code, moved.Reason, w.b)
	}
	// Nova drops the migration consumer (the source's VGPU) as it
	// confirms, after the notification the bridge ends the request on.
	w.waitFor(time.Minute, "the migration consumer to be dropped after the confirm", func() bool {
		ms := w.n.Migrations(t, vm)
		return len(ms) > 0 && ms[0].Status == "confirmed" && len(w.n.Allocations(t, ms[0].UUID)) == 0
	})
	w.assertOneVGPU("after the fault", vm, w.b, false)
	acts := w.n.InstanceActions(t, vm)
	if acts["migrate"] != 1 || acts["confirmResize"] != 1 || acts["resize"] != 0 || acts["revertResize"] != 0 {
		t.Errorf("Nova's instance actions %v, want one migrate and one confirmResize", acts)
	}

	// The tenant is told.
	in, err := w.api.Instance(w.ctx, vm)
	testsvc.Must(t, err, "bridge instance")
	name, data := testsvc.ConsumeNotification(t, n.AMQPURL(), notify.RoutingKey(topic, notify.Info), notify.PolicyNotify, 30*time.Second)
	var p notify.NotifyPayload
	testsvc.Must(t, json.Unmarshal(data, &p), "notification payload")
	const told = "the GPU of your vGPU failed (Xid 79: GPU has fallen off the bus); the VM moves to a healthy one"
	if name != "VGPUNotifyPayload" || p.Message != told || p.InstanceUUID != vm || in.ProjectID == nil || p.ProjectID != *in.ProjectID ||
		p.Rule != "gpu-fault-tell" || p.RequestKind != requests.EventGPUFault || p.Source != "bridge" {
		t.Errorf("%s %s %+v, want %q of rule gpu-fault-tell for %s of project %s", notify.PolicyNotify, name, p, told, vm,
			ptrString(in.ProjectID))
	}
	w.n.DeleteServer(t, vm)
}

// TestGPUFaultMovesDirectVGPUWithNova: with the real Nova, a direct-path
// T4-4Q the bridge attached to a server on host a's first T4; the host's
// second T4 gets its provider (Nova's tree, as a GPU added to the host).
// An Xid 79 on the first T4: the rule's move() takes the vGPU to the
// second (the claim first, on the other provider, in the instance's
// consumer, beside Nova's unchanged allocations; then the old mdev
// detached and removed, the new one made and attached by the agent).
func TestGPUFaultMovesDirectVGPUWithNova(t *testing.T) {
	w := newDirectWorldWith(t, "fmov", testsvc.DirectPolicy(testsvc.RuleReleaseOnDelete, `  - name: gpu-fault-move
    on: [bridge.GPU_FAULT]
    when: instance.vgpus.exists(v, v.gpu == event.labels.gpu && v.path == "direct")
    then: ['move()']
`))
	vm := w.bootServer(testsvc.Name("fmov") + "-vm")
	w.attachDirect(vm)
	before := w.n.Allocations(t, vm)
	gpu2 := w.n.AddVGPUChild(t, w.host, gpu2PCI, directTrait, 4)
	w.waitFor(time.Minute, "the bridge's mirror to list the second T4", func() bool {
		l, err := w.api.GPUs(w.ctx, apiclient.GPUFilter{Host: w.host})
		return err == nil && strings.Contains(string(l.Raw), gpu2)
	})

	t0 := time.Now()
	fh := w.n.FakeHost(w.host)
	w.waitFor(30*time.Second, "the agent watching the T4's Xid events", func() bool {
		return fh.Drivers.NVMLMock.InjectXid(pci.MustParse(directGPU), 79)
	})
	var moved apiclient.Request
	w.waitFor(3*time.Minute, "the bridge's GPU_FAULT request for "+vm+" to end", func() bool {
		l, err := w.api.Requests(w.ctx, apiclient.RequestFilter{InstanceUUID: vm})
		testsvc.Must(t, err, "requests")
		for _, r := range l.Requests {
			if r.Kind == "GPU_FAULT" && (r.State == "succeeded" || r.State == "failed" || r.State == "rejected") {
				moved = r
				return true
			}
		}
		return false
	})
	if moved.State != "succeeded" {
		t.Fatalf("the move: %s (%s) %s", moved.State, moved.Code, moved.Reason)
	}
	t.Logf("fault injected → vGPU moved in %s", time.Since(t0).Round(100*time.Millisecond))
	al := w.n.Allocations(t, vm)
	if al[gpu2]["VGPU"] != 1 || al[w.gpu]["VGPU"] != 0 {
		t.Errorf("allocations after the move %v, want VGPU 1 on the second T4 %s, none on %s", al, gpu2, w.gpu)
	}
	for class, amount := range before[w.root] {
		if al[w.root][class] != amount {
			t.Errorf("Nova's allocation on the compute node changed: %s %d → %d", class, amount, al[w.root][class])
		}
	}
	w.waitFor(time.Minute, "one mdev, on the second T4, in the running domain", func() bool {
		d, ok := fh.Domain(t, vm)
		if !ok || d.State != "running" || len(d.Mdevs()) != 1 {
			return false
		}
		ms := fh.Mdevs(t)
		m, ok := ms[d.Mdevs()[0]]
		return ok && len(ms) == 1 && m.Parent == gpu2PCI && m.Type == directType
	})
	w.n.DeleteServer(t, vm)
}
