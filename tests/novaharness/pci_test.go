package novaharness_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
)

// h200VFs is the fake host's H200-like GPU as Nova-owned VFs of type
// 1430: its VFs (not the PF) in the device_spec, with the class and the
// type's trait.
func h200VFs() nova.VFPassthrough {
	g := fakehost.DefaultSpec().VFIOGPUs[0]
	v := nova.VFPassthrough{PF: g.Addr.String(), VendorID: "10de", ProductID: strings.TrimPrefix(g.DeviceID, "0x"),
		ResourceClass: nova.VFResourceClass("1430"), TypeTrait: "CUSTOM_1430", Alias: "h200-vf"}
	for _, vf := range g.VFs() {
		v.VFs = append(v.VFs, vf.String())
	}
	return v
}

// TestPCIHostReportsVFs: a compute added with AddPCIHost reports the fake
// host's PF and VFs to Nova; Nova's own resource tracker (report_in_placement)
// makes the PF's provider under the compute node with one unit of the
// device_spec's class per VF and its traits; a server of a flavor with
// the alias gets a VF in Nova, and Nova's periodic
// update_available_resource heals its allocation onto that provider.
func TestPCIHostReportsVFs(t *testing.T) {
	v := h200VFs()
	specs, err := v.DeviceSpecs()
	if err != nil {
		t.Fatal(err)
	}
	n := novaharness.Start(t, novaharness.Options{PCIAliases: []string{v.AliasSpec()}})
	host := n.AddPCIHost(t, "nt-pci", novaharness.PCIPassthrough{VFIOGPUs: []string{v.PF}, DeviceSpec: specs, UpdateResourcesInterval: 2})
	root := n.ComputeNodeProvider(t, host)

	var rp string
	wait(t, time.Minute, "Nova's provider of "+v.PF, func() bool {
		rp = n.PCIProvider(t, host, v.PF)
		return rp != ""
	})
	var prov struct {
		Parent string `json:"parent_provider_uuid"`
		Name   string `json:"name"`
	}
	call(t, n, "/resource_providers/"+rp, &prov)
	if prov.Parent != root || prov.Name != host+"_0000:C1:00.0" {
		t.Errorf("provider %s under %s, want %s_0000:C1:00.0 under the compute node %s", prov.Name, prov.Parent, host, root)
	}
	var inv struct {
		Inventories map[string]struct {
			Total int `json:"total"`
		} `json:"inventories"`
	}
	call(t, n, "/resource_providers/"+rp+"/inventories", &inv)
	if len(inv.Inventories) != 1 || inv.Inventories[v.ResourceClass].Total != len(v.VFs) {
		t.Errorf("inventories %+v, want %s total %d (the VFs, not the PF)", inv.Inventories, v.ResourceClass, len(v.VFs))
	}
	var tr struct {
		Traits []string `json:"traits"`
	}
	call(t, n, "/resource_providers/"+rp+"/traits", &tr)
	slices.Sort(tr.Traits)
	if want := []string{"COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_1430"}; !slices.Equal(tr.Traits, want) {
		t.Errorf("traits %v, want %v", tr.Traits, want)
	}

	flavor := n.CreateFlavor(t, "vf-1430", 1, 512, 1, v.ExtraSpecs())
	id := n.CreateServer(t, "vm-vf", flavor, host)
	n.WaitServer(t, id, "ACTIVE")
	devs := n.PCIDevices(t, id)
	if len(devs) != 1 || !slices.Contains(v.VFs, devs[0]) {
		t.Fatalf("Nova's PCI devices of the server %v, want one of the VFs %v", devs, v.VFs)
	}
	// The harness, as Nova's libvirt driver, gave the guest the VF.
	fh := n.FakeHost(host)
	dom, ok := fh.Domain(t, id)
	if !ok || !slices.ContainsFunc(dom.Hostdevs, func(h libvirt.Hostdev) bool { return h.Type == "pci" && h.Addr.String() == devs[0] }) {
		t.Errorf("domain of %s (found %v): %+v, want the VF %s as a PCI hostdev", id, ok, dom.Hostdevs, devs[0])
	}
	wait(t, 2*time.Minute, "the server's allocation healed onto "+rp, func() bool {
		return n.Allocations(t, id)[rp][v.ResourceClass] == 1
	})
	if u := n.Usages(t, rp); u[v.ResourceClass] != 1 {
		t.Errorf("usages of %s = %v, want %s 1", rp, u, v.ResourceClass)
	}
	n.DeleteServer(t, id)
	if u := n.Usages(t, rp); u[v.ResourceClass] != 0 {
		t.Errorf("usages of %s after delete = %v, want none", rp, u)
	}
}

func call(t *testing.T, n *novaharness.Nova, path string, out any) {
	t.Helper()
	var raw json.RawMessage
	if err := n.PlacementCall(t.Context(), http.MethodGet, path, nil, &raw); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

func wait(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", d, what)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
