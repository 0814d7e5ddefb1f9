package novaharness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// PCIDevice is one PCI device a compute host's driver reports to Nova: a
// dict of the pci_passthrough_devices that
// nova.virt.fake.FakeDriverWithPciResources.get_available_resource (and
// libvirt's _get_pcidev_info) returns.
type PCIDevice struct {
	Address    string `json:"address"`    // 0000:c1:00.4
	VendorID   string `json:"vendor_id"`  // 10de
	ProductID  string `json:"product_id"` // 2335
	DevType    string `json:"dev_type"`   // type-PF, type-VF, type-PCI
	ParentAddr string `json:"parent_addr,omitempty"`
	NUMANode   int    `json:"numa_node"`
	Label      string `json:"label"`  // label_<vendor>_<product>, as libvirt's
	DevID      string `json:"dev_id"` // pci_0000_c1_00_4, as libvirt's
}

// PCIPassthrough is what AddPCIHost gives a compute host: the devices its
// driver reports and its nova.conf [pci] device_spec entries (JSON
// objects; they may carry resource_class and traits, which Nova 26's
// pci_placement_translator puts on the PF's provider). The [pci] aliases
// are every service's (Options.PCIAliases).
type PCIPassthrough struct {
	// VFIOGPUs are PFs of the host's fake host's vendor-VFIO GPUs: the
	// driver reports each with its VFs (FakeHost.VFIODevices).
	VFIOGPUs []string
	// Devices are more devices the driver reports.
	Devices    []PCIDevice
	DeviceSpec []string
	// UpdateResourcesInterval is the compute's [DEFAULT]
	// update_resources_interval in seconds: how often its resource
	// tracker's update_available_resource runs, which heals the PCI
	// allocations in Placement. 0: Nova's default (the periodic task's 60 s).
	UpdateResourcesInterval int
}

// VFIODevices are the fake host's vendor-VFIO GPU pf and its VFs as its
// driver would report them: the PF (type-PF) and each VF (type-VF, parent
// pf), vendor 10de, the GPU's device id (the fake host gives VFs the
// PF's), NUMA node 0.
func (h *FakeHost) VFIODevices(pf string) ([]PCIDevice, error) {
	for _, g := range h.Drivers.Fake.Spec.VFIOGPUs {
		if g.Addr.String() != pf {
			continue
		}
		product := strings.TrimPrefix(strings.ToLower(g.DeviceID), "0x")
		dev := func(addr, typ, parent string) PCIDevice {
			return PCIDevice{Address: addr, VendorID: "10de", ProductID: product, DevType: typ, ParentAddr: parent,
				Label: "label_10de_" + product, DevID: "pci_" + strings.NewReplacer(":", "_", ".", "_").Replace(addr)}
		}
		out := []PCIDevice{dev(pf, "type-PF", "")}
		for _, vf := range g.VFs() {
			out = append(out, dev(vf.String(), "type-VF", pf))
		}
		return out, nil
	}
	return nil, fmt.Errorf("the fake host %s has no vendor-VFIO GPU %s", h.Name, pf)
}

// AddPCIHost is AddHost for a compute whose driver also reports p's PCI
// devices (launcher.py, as FakeDriverWithPciResources does) with [pci]
// device_spec = p.DeviceSpec and report_in_placement = true: Nova's
// resource tracker then tracks the devices the specs match and creates
// one provider per PF under the compute node (<host>_<PF address
// upper-cased>), with the devices' resource class. No test writes those
// providers.
func (n *Nova) AddPCIHost(t testing.TB, prefix string, p PCIPassthrough) string {
	t.Helper()
	return n.addHost(t, prefix, func(h string) error {
		n.mu.Lock()
		if n.pciHosts == nil {
			n.pciHosts = map[string]bool{}
		}
		n.pciHosts[h] = true
		n.mu.Unlock()
		all := slices.Clone(p.Devices)
		for _, pf := range p.VFIOGPUs {
			d, err := n.FakeHost(h).VFIODevices(pf)
			if err != nil {
				return err
			}
			all = append(all, d...)
		}
		devs, err := json.Marshal(all)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(n.dir, "pci-devices-"+h+".json"), devs, 0o644); err != nil {
			return err
		}
		var b bytes.Buffer
		fmt.Fprintf(&b, "[DEFAULT]\nhost = %s\n", h)
		if p.UpdateResourcesInterval > 0 {
			fmt.Fprintf(&b, "update_resources_interval = %d\n", p.UpdateResourcesInterval)
		}
		b.WriteString("[pci]\nreport_in_placement = true\n")
		for _, s := range p.DeviceSpec {
			fmt.Fprintf(&b, "device_spec = %s\n", s)
		}
		return os.WriteFile(filepath.Join(n.dir, "compute-"+h+".conf"), b.Bytes(), 0o644)
	})
}

// writePCIConfig adds Options.PCIAliases to nova.conf, and the
// PciPassthroughFilter to Nova's default filters (nova.conf.scheduler's
// enabled_filters default) when there are aliases.
func writePCIConfig(b *bytes.Buffer, aliases []string) {
	if len(aliases) == 0 {
		return
	}
	b.WriteString("[filter_scheduler]\nenabled_filters = ComputeFilter,ComputeCapabilitiesFilter,ImagePropertiesFilter," +
		"ServerGroupAntiAffinityFilter,ServerGroupAffinityFilter,PciPassthroughFilter\n[pci]\n")
	for _, a := range aliases {
		fmt.Fprintf(b, "alias = %s\n", a)
	}
}

// PCIDevices are the addresses of the PCI devices Nova claimed or
// allocated for an instance (its cell database's pci_devices rows).
func (n *Nova) PCIDevices(t testing.TB, instance string) []string {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	out, err := n.pciDevices(ctx, instance)
	if err != nil {
		t.Fatalf("PCI devices of %s: %v", instance, err)
	}
	return out
}

func (n *Nova) pciDevices(ctx context.Context, instance string) ([]string, error) {
	u, err := url.Parse(testsvc.PostgresAdminURL())
	if err != nil {
		return nil, err
	}
	u.Path = "/" + n.dbName("cell1")
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT address FROM pci_devices WHERE instance_uuid = $1 AND status IN ('claimed', 'allocated') AND deleted = 0 ORDER BY address`, instance)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// passthrough are the PCI devices Nova gave an instance on a host added
// with AddPCIHost (none elsewhere): what Nova's libvirt driver puts in the
// guest's domain as <hostdev type='pci'> (LibvirtDriver._guest_add_pci_devices).
func (n *Nova) passthrough(ctx context.Context, host, instance string) ([]pci.Addr, error) {
	n.mu.Lock()
	ok := n.pciHosts[host]
	n.mu.Unlock()
	if !ok {
		return nil, nil
	}
	addrs, err := n.pciDevices(ctx, instance)
	if err != nil {
		return nil, fmt.Errorf("PCI devices of %s: %w", instance, err)
	}
	var out []pci.Addr
	for _, a := range addrs {
		p, err := pci.Parse(a)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// PCIProvider is the uuid of the provider Nova's resource tracker made
// for a PF's devices on host ("" while there is none).
func (n *Nova) PCIProvider(t testing.TB, host, pf string) string {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	name := host + "_" + strings.ToUpper(pf)
	var out struct {
		ResourceProviders []provider `json:"resource_providers"`
	}
	if err := n.placementDo(ctx, http.MethodGet, "/resource_providers?name="+url.QueryEscape(name), nil, &out); err != nil {
		t.Fatalf("provider %s: %v", name, err)
	}
	if len(out.ResourceProviders) == 0 {
		return ""
	}
	return out.ResourceProviders[0].UUID
}
