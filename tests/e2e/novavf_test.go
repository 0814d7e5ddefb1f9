package e2e

import (
	"context"
	"encoding/json"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Nova-owned VF GPUs: the fake host's H200-like GPU with its first four
// VFs typed 1430 (H200X-35C, four per GPU) in Nova's [pci] device_spec.
const (
	novaVFType    = "1430"
	novaVFProfile = "H200X-35C"
	novaVFTrait   = "CUSTOM_1430"
)

// novaOwnedVFs is the GPU as `vgpuctl host layout` describes it: the
// device_spec entries, the alias (every Nova service's: sharedNova) and
// the flavor's extra spec.
func novaOwnedVFs() nova.VFPassthrough {
	g := fakehost.DefaultSpec().VFIOGPUs[0]
	v := nova.VFPassthrough{PF: g.Addr.String(), VendorID: "10de", ProductID: strings.TrimPrefix(g.DeviceID, "0x"),
		ResourceClass: nova.VFResourceClass(novaVFType), TypeTrait: novaVFTrait, Alias: "e2e-h200x-35c"}
	for _, vf := range g.VFs()[:4] {
		v.VFs = append(v.VFs, vf.String())
	}
	return v
}

// TestNovaOwnedVFs: a compute whose driver reports the H200-like GPU's PF
// and VFs, with the VFs in its [pci] device_spec (report_in_placement),
// gets from Nova's own resource tracker a provider for the PF with one
// unit per VF; the bridge mirrors it as a GPU of type 1430. A server
// booted by the real Nova with the alias flavor gets a VF, and once Nova's
// periodic update_available_resource has healed its allocation, the
// bridge shows that usage (GET /v1/gpus, and a dry run counts it). A
// direct-path request for the same profile on that host, whose only free
// VFs are Nova's, is refused no_capacity: the bridge never claims on
// Nova's PCI providers.
func TestNovaOwnedVFs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	v := novaOwnedVFs()
	// What vgpuctl host layout prints for the GPU is what the test
	// configures: the compute's device_spec, the alias (sharedNova's),
	// the flavor's extra spec and the bridge's option.
	out, err := exec.CommandContext(ctx, testsvc.Binary(t, "vgpuctl"), "host", "layout", "--pf", v.PF, "--vf", strings.Join(v.VFs, ","),
		"--product", v.ProductID, "--type", novaVFType, "--alias", v.Alias, "-o", "json").Output()
	testsvc.Must(t, err, "vgpuctl host layout")
	var layout struct {
		DeviceSpec   []string          `json:"device_spec"`
		Alias        string            `json:"alias"`
		ExtraSpecs   map[string]string `json:"extra_specs"`
		BridgeOption string            `json:"bridge_nova_vf_resource_classes"`
	}
	testsvc.Must(t, json.Unmarshal(out, &layout), "vgpuctl host layout -o json")
	specs, err := v.DeviceSpecs()
	testsvc.Must(t, err, "device_spec")
	if !slices.Equal(layout.DeviceSpec, specs) || layout.Alias != v.AliasSpec() || !maps.Equal(layout.ExtraSpecs, v.ExtraSpecs()) ||
		layout.BridgeOption != v.ResourceClass+"="+novaVFType {
		t.Fatalf("vgpuctl host layout printed %+v; the test configures device_spec %v, alias %s, extra specs %v", layout, specs, v.AliasSpec(), v.ExtraSpecs())
	}
	w := &directWorld{t: t, ctx: ctx, n: sharedNova(t)}
	w.host = w.n.AddPCIHost(t, "nova-vf", novaharness.PCIPassthrough{VFIOGPUs: []string{v.PF}, DeviceSpec: specs, UpdateResourcesInterval: 2})
	w.root = w.n.ComputeNodeProvider(t, w.host)
	w.flavor = w.n.CreateFlavor(t, w.host+".small", 1, 512, 1, nil)
	// The boot layout: the VFs in Nova's device_spec are typed before
	// Nova hands them out.
	fh := w.n.FakeHost(w.host)
	for _, vf := range v.VFs {
		testsvc.Must(t, fh.Drivers.Sysfs.SetVFType(ctx, pci.MustParse(vf), novaVFType), "type "+vf)
	}
	w.n.StartAgent(t, w.host)
	w.startBridge("placement.nova_vf_resource_classes=" + layout.BridgeOption)

	// Nova's provider, mirrored by the bridge as a GPU of the type.
	var rp string
	w.waitFor(time.Minute, "Nova's PCI provider of "+v.PF, func() bool {
		rp = w.n.PCIProvider(t, w.host, v.PF)
		return rp != ""
	})
	gpu := func() apiclient.GPU {
		t.Helper()
		l, err := w.api.GPUs(ctx, apiclient.GPUFilter{Host: w.host})
		testsvc.Must(t, err, "the bridge's GPUs")
		for _, g := range l.GPUs {
			if g.ProviderUUID == rp {
				return g
			}
		}
		return apiclient.GPU{}
	}
	w.waitFor(time.Minute, "the bridge mirrors "+rp, func() bool { return gpu().ProviderUUID == rp })
	if g := gpu(); g.ResourceClass != v.ResourceClass || g.Trait != novaVFTrait || g.Total != len(v.VFs) || g.Used != 0 ||
		g.PCIAddress != v.PF || g.Name != nova.PCIProviderName(w.host, v.PF) {
		t.Errorf("the bridge's GPU %+v; want %s of class %s, type %s, %d VFs none used, PCI %s", g, nova.PCIProviderName(w.host, v.PF),
			v.ResourceClass, novaVFTrait, len(v.VFs), v.PF)
	}

	// (a) Nova's server with the alias flavor gets a VF.
	vfFlavor := w.n.CreateFlavor(t, w.host+".vf", 1, 512, 1, layout.ExtraSpecs)
	vm := w.n.CreateServer(t, "e2e-nova-vf", vfFlavor, w.host)
	w.n.WaitServer(t, vm, "ACTIVE")
	devs := w.n.PCIDevices(t, vm)
	if len(devs) != 1 || !slices.Contains(v.VFs, devs[0]) {
		t.Fatalf("Nova's PCI devices of %s: %v, want one of %v", vm, devs, v.VFs)
	}
	if d, ok := fh.Domain(t, vm); !ok || len(d.Hostdevs) != 1 || d.Hostdevs[0].Type != "pci" || d.Hostdevs[0].Addr.String() != devs[0] {
		t.Errorf("domain of %s (found %v): %+v, want the VF %s (Nova's libvirt driver's hostdev)", vm, ok, d.Hostdevs, devs[0])
	}
	w.waitFor(2*time.Minute, "Nova's update_available_resource heals the allocation of "+vm, func() bool {
		return w.n.Allocations(t, vm)[rp][v.ResourceClass] == 1
	})
	w.waitFor(time.Minute, "the bridge's mirror shows the VF in use", func() bool { return gpu().Used == 1 })
	dr, err := w.api.DryRun(ctx, apiclient.DryRunRequest{Profile: novaVFProfile, Host: w.host})
	testsvc.Must(t, err, "dry run")
	if len(dr.Candidates) != 1 || dr.Candidates[0].ProviderUUID != rp || dr.Candidates[0].FreeAfter != len(v.VFs)-2 {
		t.Errorf("dry run for %s on %s: %+v; want Nova's GPU %s with %d free after", novaVFProfile, w.host, dr.Candidates, rp, len(v.VFs)-2)
	}

	// Flavor choice: the profile's GPUs count the Nova-owned one as such
	// (vgpuctl flavor plan plans no resources:VGPU flavor for it).
	pl, err := w.api.Profiles(ctx, "", "")
	testsvc.Must(t, err, "profiles")
	i := slices.IndexFunc(pl.Profiles, func(p apiclient.Profile) bool { return p.Name == novaVFProfile })
	if i < 0 {
		t.Errorf("profiles: no %s", novaVFProfile)
	} else if p := pl.Profiles[i]; p.NovaVF < 1 || p.GPUs < p.NovaVF || p.Trait != novaVFTrait {
		t.Errorf("profiles: %s is %+v, want at least one Nova-owned VF GPU", novaVFProfile, p)
	}

	// (b) The direct path never takes a Nova-owned VF.
	other := w.bootServer("e2e-nova-vf-direct")
	before := w.n.Allocations(t, other)
	r := w.waitFinal(w.gpuRequest(other, novaVFProfile))
	if r.State != "failed" || r.Code != "no_capacity" {
		t.Errorf("direct request on %s: %s/%s (%s): %s; want failed with no_capacity", w.host, r.State, r.Phase, r.Code, r.Reason)
	}
	if al := w.n.Allocations(t, other); len(al) != len(before) || al[rp] != nil {
		t.Errorf("allocations of %s after the refused request: %v (before %v)", other, al, before)
	}
	if u := w.n.Usages(t, rp); u[v.ResourceClass] != 1 {
		t.Errorf("usage of Nova's provider after the refused request: %v, want 1 (Nova's server)", u)
	}
	if d, ok := fh.Domain(t, other); !ok || len(d.Hostdevs) != 0 {
		t.Errorf("domain of %s (found %v): %+v, want one without hostdevs", other, ok, d)
	}
	w.n.DeleteServer(t, vm)
	w.n.DeleteServer(t, other)
}

// TestBridgeOwnedVFNoValidHost: on a host whose only GPU is bridge-owned
// (the fake host's H200-like GPU declared in [placement]
// bridge_owned_gpus, its provider published by the bridge with free
// CUSTOM_VGPU_BRIDGE units), a server of a resources:VGPU=1 flavor booted
// by the real Nova ends NoValidHost: Nova's scheduler never chooses a
// bridge-owned GPU.
func TestBridgeOwnedVFNoValidHost(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &directWorld{t: t, ctx: ctx, n: sharedNova(t)}
	w.host = w.n.AddHost(t, "bridge-vf")
	w.root = w.n.ComputeNodeProvider(t, w.host)
	w.n.StartAgent(t, w.host)
	pf := fakehost.DefaultSpec().VFIOGPUs[0].Addr.String()
	w.startBridge("placement.bridge_owned_gpus=" + w.host + "/" + pf + "=" + novaVFType)

	name := testsvc.GPUProviderName(w.host, pf)
	var rp string
	w.waitFor(2*time.Minute, "the bridge publishes "+name+" with free units", func() bool {
		var out struct {
			Providers []struct {
				UUID string `json:"uuid"`
			} `json:"resource_providers"`
		}
		testsvc.Must(t, w.n.PlacementCall(ctx, "GET", "/resource_providers?name="+name, nil, &out), "provider "+name)
		if len(out.Providers) == 0 {
			return false
		}
		rp = out.Providers[0].UUID
		var inv struct {
			Inventories map[string]struct {
				Total int `json:"total"`
			} `json:"inventories"`
		}
		testsvc.Must(t, w.n.PlacementCall(ctx, "GET", "/resource_providers/"+rp+"/inventories", nil, &inv), "inventories of "+name)
		return inv.Inventories["CUSTOM_VGPU_BRIDGE"].Total > 0
	})
	if u := w.n.Usages(t, rp); u["CUSTOM_VGPU_BRIDGE"] != 0 {
		t.Fatalf("usages of the bridge-owned GPU %v, want none used", u)
	}

	flavor := w.n.CreateFlavor(t, w.host+".vgpu", 1, 512, 1, map[string]string{"resources:VGPU": "1"})
	vm := w.n.CreateServer(t, "e2e-bridge-vf-novalidhost", flavor, w.host)
	if s := w.n.WaitServer(t, vm, "ERROR"); !strings.Contains(s.Fault, "No valid host") {
		t.Errorf("server of a resources:VGPU=1 flavor on %s: %s, fault %q; want ERROR with NoValidHost", w.host, s.Status, s.Fault)
	}
	if al := w.n.Allocations(t, vm); len(al) != 0 {
		t.Errorf("allocations of the failed server: %v", al)
	}
	if u := w.n.Usages(t, rp); u["CUSTOM_VGPU_BRIDGE"] != 0 {
		t.Errorf("usages of the bridge-owned GPU after Nova's boot %v, want none used", u)
	}
	w.n.DeleteServer(t, vm)
}
