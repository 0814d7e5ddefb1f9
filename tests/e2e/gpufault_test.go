package e2e

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
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
