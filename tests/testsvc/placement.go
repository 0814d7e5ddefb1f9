package testsvc

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"
)

// GPUProviderName is the name Nova's libvirt driver gives a GPU's child
// resource provider: the node name, "_pci_", and the PCI address with
// ':' and '.' turned into '_' ("node_pci_0000_3b_00_0").
func GPUProviderName(node, pciAddr string) string {
	return node + "_pci_" + strings.NewReplacer(":", "_", ".", "_").Replace(pciAddr)
}

// FleetGPU is a GPU child provider of a FleetHost: inventory of Class
// (default VGPU) of Total units with Trait (none when empty); Used > 0
// puts that many units under a consumer of their own, as another instance
// would.
type FleetGPU struct {
	PCI   string
	Trait string
	Class string
	Total int
	Used  int
}

func (g FleetGPU) class() string {
	if g.Class == "" {
		return "VGPU"
	}
	return g.Class
}

// FleetHost is a compute node in Placement, as Nova's resource tracker
// makes it, and an instance (VM) holding VCPU and MEMORY_MB on it.
type FleetHost struct {
	Node string
	VM   string
	GPUs []FleetGPU
}

// FleetProviders is what PlacementFleet made for one FleetHost.
type FleetProviders struct {
	Root string
	GPUs map[string]string // PCI address → provider uuid
}

// PlacementFleet creates hosts in Placement: the traits, a root provider
// per host with VCPU and MEMORY_MB, a child per GPU (named as Nova names
// it) with VGPU inventory and its trait, and the allocations. Everything
// it made is removed when the test ends.
func PlacementFleet(ctx context.Context, t testing.TB, sc *gophercloud.ServiceClient, hosts []FleetHost) []FleetProviders {
	t.Helper()
	seen := map[string]bool{}
	var classes []string
	for _, h := range hosts {
		for _, g := range h.GPUs {
			if g.Trait != "" && !seen[g.Trait] {
				seen[g.Trait] = true
				Must(t, traits.Create(ctx, sc, g.Trait).ExtractErr(), "create trait "+g.Trait)
			}
			if c := g.class(); strings.HasPrefix(c, "CUSTOM_") && !seen[c] {
				seen[c] = true
				classes = append(classes, c)
				_, err := sc.Put(ctx, sc.ServiceURL("resource_classes", c), nil, nil, &gophercloud.RequestOpts{OkCodes: []int{201, 204}})
				Must(t, err, "create resource class "+c)
			}
		}
	}
	var consumers, providers []string
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		defer func() { // after the inventories that use them
			for _, c := range classes {
				if _, err := sc.Delete(ctx, sc.ServiceURL("resource_classes", c), nil); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
					t.Logf("cleanup: resource class %s: %v", c, err)
				}
			}
		}()
		for _, c := range consumers {
			if err := allocations.Delete(ctx, sc, c).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
				t.Logf("cleanup: allocations of %s: %v", c, err)
			}
		}
		for i := len(providers) - 1; i >= 0; i-- { // children before their root
			if err := resourceproviders.Delete(ctx, sc, providers[i]).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
				t.Logf("cleanup: provider %s: %v", providers[i], err)
			}
		}
	})
	project, user := strings.ReplaceAll(uuid.NewString(), "-", ""), strings.ReplaceAll(uuid.NewString(), "-", "")
	onRoot := map[string]int{"VCPU": 2, "MEMORY_MB": 2048}
	out := make([]FleetProviders, len(hosts))
	for i, h := range hosts {
		root := uuid.NewString()
		out[i] = FleetProviders{Root: root, GPUs: map[string]string{}}
		_, err := resourceproviders.Create(ctx, sc, resourceproviders.CreateOpts{Name: h.Node, UUID: root}).Extract()
		Must(t, err, "create root provider")
		providers = append(providers, root)
		_, err = resourceproviders.UpdateInventories(ctx, sc, root, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
			"VCPU":      {Total: 64, MinUnit: 1, MaxUnit: 64, StepSize: 1, AllocationRatio: 4},
			"MEMORY_MB": {Total: 262144, MinUnit: 1, MaxUnit: 262144, StepSize: 1, AllocationRatio: 1},
		}}).Extract()
		Must(t, err, "root inventory")
		for _, g := range h.GPUs {
			id := uuid.NewString()
			_, err := resourceproviders.Create(ctx, sc, resourceproviders.CreateOpts{Name: GPUProviderName(h.Node, g.PCI), UUID: id, ParentProviderUUID: root}).Extract()
			Must(t, err, "create GPU provider")
			providers = append(providers, id)
			out[i].GPUs[g.PCI] = id
			r, err := resourceproviders.UpdateInventories(ctx, sc, id, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
				g.class(): {Total: g.Total, MinUnit: 1, MaxUnit: g.Total, StepSize: 1, AllocationRatio: 1},
			}}).Extract()
			Must(t, err, "GPU inventory")
			if g.Trait != "" {
				_, err = resourceproviders.UpdateTraits(ctx, sc, id, resourceproviders.UpdateTraitsOpts{
					ResourceProviderGeneration: r.ResourceProviderGeneration, Traits: []string{g.Trait}}).Extract()
				Must(t, err, "GPU traits")
			}
			if g.Used > 0 {
				c := uuid.NewString()
				err := allocations.Update(ctx, sc, c, allocations.UpdateOpts{Allocations: map[string]allocations.ProviderAllocationsOpts{
					root: {Resources: onRoot},
					id:   {Resources: map[string]int{g.class(): g.Used}},
				}, ProjectID: project, UserID: user, ConsumerType: "INSTANCE"}).ExtractErr()
				Must(t, err, "GPU consumer")
				consumers = append(consumers, c)
			}
		}
		err = allocations.Update(ctx, sc, h.VM, allocations.UpdateOpts{Allocations: map[string]allocations.ProviderAllocationsOpts{
			root: {Resources: onRoot},
		}, ProjectID: project, UserID: user, ConsumerType: "INSTANCE"}).ExtractErr()
		Must(t, err, "instance allocations")
		consumers = append(consumers, h.VM)
	}
	return out
}
