// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

// hostLayout is what `vgpuctl host layout -o json` prints.
type hostLayout struct {
	PF                  string            `json:"pf"`
	VFs                 []string          `json:"vfs"`
	TypeID              string            `json:"type_id"`
	ResourceClass       string            `json:"resource_class"`
	Trait               string            `json:"trait"`
	DeviceSpec          []string          `json:"device_spec"`
	Alias               string            `json:"alias"`
	ExtraSpecs          map[string]string `json:"extra_specs"`
	BridgeOption        string            `json:"bridge_nova_vf_resource_classes"`
	BridgeAliasOption   string            `json:"bridge_nova_vf_aliases"`
	Provider            string            `json:"provider,omitempty"`
	ReportInPlacement   bool              `json:"report_in_placement"`
	UpdateResourcesNote string            `json:"note"`
}

const hostLayoutLong = `Print what nova.conf, the flavors and the bridge need so that Nova owns the VFs
of a vendor-VFIO GPU (SR-IOV, vGPU 17+) as PCI passthrough devices of one
vGPU type ("Nova-owned VF GPUs"):

  * nova-compute's [pci] device_spec entries, which match the listed VFs and
    not the PF, with resource_class CUSTOM_VGPU_VF_<type> and the type's
    trait, and [pci] report_in_placement = true: Nova's resource tracker
    then keeps one provider per PF under the compute node
    (<node>_<PF address upper-cased>) with one unit per VF;
  * the [pci] alias of every Nova service (nova-api reads it when a server
    is created) and the flavor extra spec pci_passthrough:alias=NAME:1;
  * the bridge's [placement] nova_vf_resource_classes entry, which makes the
    bridge mirror that provider as a GPU of the type (dry runs, flavor
    choice) and keeps its direct path off it, and its nova_vf_aliases entry,
    which counts the servers of the alias's flavors in the bridge's
    vGPU-second accounting and per-profile quota.

Nothing is changed. The VFs must be typed (nvidia/current_vgpu_type) before
nova-compute starts, by the host's boot layout, and no more VFs listed than
the type allows on the GPU. Nova 26's alias selects VFs by vendor, product
and device type only: give each product id one vGPU type across the cloud.
For GPUs Nova does not manage, see [placement] bridge_owned_vf_gpus.`

const hostLayoutExample = `  vgpuctl host layout --pf 0000:c1:00.0 --vf 0000:c1:00.4,0000:c1:00.5,0000:c1:00.6,0000:c1:00.7 \
      --product 2335 --type 1430 --alias h200x-35c --node compute-7`

func hostLayoutCmd(g *globals) *cobra.Command {
	var v nova.VFPassthrough
	var typeID, node string
	cmd := &cobra.Command{
		Use:     "layout --pf PF --vf VF,... --product ID --type TYPE --alias NAME",
		Short:   "Print the nova.conf [pci] device_spec and alias, the flavor extra spec and the bridge option for Nova-owned VFs",
		Long:    hostLayoutLong,
		Example: hostLayoutExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if v.PF == "" || len(v.VFs) == 0 || v.ProductID == "" || typeID == "" || v.Alias == "" {
				return usageErr(fmt.Errorf("--pf, --vf, --product, --type and --alias are required"))
			}
			if _, err := strconv.ParseUint(typeID, 10, 32); err != nil {
				return usageErr(fmt.Errorf("--type %q: want a numeric vendor-VFIO type id, e.g. 1430", typeID))
			}
			for _, id := range []*string{&v.VendorID, &v.ProductID} {
				*id = strings.TrimPrefix(strings.ToLower(*id), "0x")
				if len(*id) != 4 || strings.Trim(*id, "0123456789abcdef") != "" {
					return usageErr(fmt.Errorf("PCI id %q: want 4 hex digits, e.g. 2335", *id))
				}
			}
			v.ResourceClass, v.TypeTrait = nova.VFResourceClass(typeID), catalog.TraitFor(typeID)
			specs, err := v.DeviceSpecs()
			if err != nil {
				return usageErr(err)
			}
			l := hostLayout{PF: strings.ToLower(v.PF), VFs: v.VFs, TypeID: typeID, ResourceClass: v.ResourceClass, Trait: v.TypeTrait,
				DeviceSpec: specs, Alias: v.AliasSpec(), ExtraSpecs: v.ExtraSpecs(), ReportInPlacement: true,
				BridgeOption: v.ResourceClass + "=" + typeID, BridgeAliasOption: v.Alias + "=" + v.ResourceClass,
				UpdateResourcesNote: "Nova 26 allocates the VF in Placement at its next update_available_resource " +
					"([DEFAULT] update_resources_interval), not when it schedules"}
			if node != "" {
				l.Provider = nova.PCIProviderName(node, v.PF)
			}
			raw, err := json.Marshal(l)
			if err != nil {
				return err
			}
			return g.emit(raw, func(w io.Writer) {
				header(w, "WHERE", "SECTION", "OPTION", "VALUE")
				row(w, "nova-compute", "pci", "report_in_placement", "true")
				for _, s := range specs {
					row(w, "nova-compute", "pci", "device_spec", s)
				}
				row(w, "every Nova service", "pci", "alias", l.Alias)
				row(w, "flavor", "extra_specs", "pci_passthrough:alias", l.ExtraSpecs["pci_passthrough:alias"])
				row(w, "vgpu-bridge", "placement", "nova_vf_resource_classes", l.BridgeOption)
				row(w, "vgpu-bridge", "placement", "nova_vf_aliases", l.BridgeAliasOption)
				if l.Provider != "" {
					row(w, "placement (Nova writes it)", "provider", l.Provider, fmt.Sprintf("%s=%d, traits COMPUTE_MANAGED_PCI_DEVICE,%s",
						v.ResourceClass, len(v.VFs), v.TypeTrait))
				}
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&v.PF, "pf", "", "the GPU's physical function, e.g. 0000:c1:00.0")
	fl.StringSliceVar(&v.VFs, "vf", nil, "the VFs Nova owns, typed by the boot layout (repeat or comma-separate)")
	fl.StringVar(&v.VendorID, "vendor", "10de", "the VFs' PCI vendor id")
	fl.StringVar(&v.ProductID, "product", "", "the VFs' PCI device id (lspci -n), e.g. 2335")
	fl.StringVar(&typeID, "type", "", "the numeric vGPU type id the VFs are typed for, e.g. 1430")
	fl.StringVar(&v.Alias, "alias", "", "the [pci] alias name the flavors ask for")
	fl.StringVar(&node, "node", "", "the compute node's name, to print the provider Nova makes")
	return cmd
}
