// SPDX-License-Identifier: Apache-2.0

package main

import (
	"cmp"
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
	Host                string            `json:"host,omitempty"`
	Proposal            *layoutProposal   `json:"proposal,omitempty"`
	Missing             []string          `json:"missing,omitempty"` // facts the report lacks, and the flag that gives each
	PF                  string            `json:"pf"`
	VFs                 []string          `json:"vfs"`
	TypeID              string            `json:"type_id"`
	VFLayout            string            `json:"vf_layout"`
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

  * the agent's boot layout, agent.conf [devices] vf_layout = PF=TYPE:COUNT,
    which types the VFs before nova-compute starts;
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

With HOST, the layout is proposed from the host's last agent report, read
from the bridge (GET /v1/hosts/{name}/report): the GPU (--pf, else the
vendor-VFIO GPU that holds the most VFs of the type), the VFs (those of the
type already, then the first free ones in address order, as the agent's
layout types them), how many (--count, else as many as the GPU holds: the
type's max instances and the VFs free; a count it cannot hold is refused
with the reason), the VFs' PCI device id, the alias name (from the type's
name) and the node. A fact the report lacks is named with the flag that
gives it (an agent before the device ids were reported: --product).

Without HOST (a host with no agent), every fact is given: --pf, --vf,
--product, --type, --alias.

Nothing is changed. No more VFs may be typed than the type allows on the
GPU. Nova 26's alias selects VFs by vendor, product and device type only:
give each product id one vGPU type across the cloud. For GPUs Nova does
not manage, see [placement] bridge_owned_gpus.`

const hostLayoutExample = `  vgpuctl host layout compute-7 --type 1430 --count 4
  vgpuctl host layout compute-7 --pf 0000:c1:00.0 --type 1430 -o json
  vgpuctl host layout --pf 0000:c1:00.0 --vf 0000:c1:00.4,0000:c1:00.5,0000:c1:00.6,0000:c1:00.7 \
      --product 2335 --type 1430 --alias h200x-35c --node compute-7`

func hostLayoutCmd(g *globals) *cobra.Command {
	var v nova.VFPassthrough
	var typeID, node string
	var count int
	cmd := &cobra.Command{
		Use:     "layout [HOST] [--pf PF] --type TYPE [--count N] | layout --pf PF --vf VF,... --product ID --type TYPE --alias NAME",
		Short:   "Propose a Nova-owned VF layout from a host's report and print its vf_layout, nova.conf [pci] device_spec and alias, flavor extra spec and bridge options",
		Long:    hostLayoutLong,
		Example: hostLayoutExample,
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			typeID = strings.TrimPrefix(typeID, "nvidia-")
			if typeID == "" {
				return usageErr(fmt.Errorf("--type is required"))
			}
			if _, err := strconv.ParseUint(typeID, 10, 32); err != nil {
				return usageErr(fmt.Errorf("--type %q: want a numeric vendor-VFIO type id, e.g. 1430", typeID))
			}
			if count < 0 {
				return usageErr(fmt.Errorf("--count %d: want a number of VFs", count))
			}
			var l hostLayout
			if len(args) == 1 {
				if len(v.VFs) > 0 {
					return usageErr(fmt.Errorf("--vf with HOST: the proposal chooses the VFs (leave HOST out to give them)"))
				}
				rep, err := g.api().HostReport(cmd.Context(), args[0])
				if err != nil {
					return fmt.Errorf("host %s's agent report: %w", args[0], err)
				}
				p, err := proposeLayout(rep.Report, layoutAsk{PF: v.PF, Type: typeID, Count: count})
				if err != nil {
					return err
				}
				l.Host, l.Proposal, l.Missing = rep.Name, &p, []string{}
				v.PF, v.VFs = p.PF, p.VFs
				if v.ProductID == "" {
					v.ProductID = p.ProductID
				}
				if v.Alias == "" {
					v.Alias = aliasName(p.TypeName, typeID)
				}
				if node == "" {
					node = cmp.Or(rep.Report.Node, rep.Node)
				}
				if v.ProductID == "" {
					return usageErr(fmt.Errorf("host %s's report lacks the VFs' PCI device id (an agent before it was reported), which "+
						"device_spec and alias match as product_id: give --product (lspci -n -s %s); proposed: %s, VFs %s",
						args[0], p.VFs[0], p.VFLayout, strings.Join(p.VFs, ",")))
				}
				if node == "" {
					l.Missing = append(l.Missing, "the compute node's name (the provider Nova makes): give --node")
				}
			} else {
				if count != 0 {
					return usageErr(fmt.Errorf("--count needs HOST (without it, --vf lists the VFs)"))
				}
				if v.PF == "" || len(v.VFs) == 0 || v.ProductID == "" || v.Alias == "" {
					return usageErr(fmt.Errorf("without HOST, --pf, --vf, --product, --type and --alias are required"))
				}
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
			l.PF, l.VFs, l.TypeID, l.ResourceClass, l.Trait = strings.ToLower(v.PF), v.VFs, typeID, v.ResourceClass, v.TypeTrait
			l.VFLayout = l.PF + "=" + typeID + ":" + strconv.Itoa(len(v.VFs))
			l.DeviceSpec, l.Alias, l.ExtraSpecs, l.ReportInPlacement = specs, v.AliasSpec(), v.ExtraSpecs(), true
			l.BridgeOption, l.BridgeAliasOption = v.ResourceClass+"="+typeID, v.Alias+"="+v.ResourceClass
			l.UpdateResourcesNote = "Nova 26 allocates the VF in Placement at its next update_available_resource " +
				"([DEFAULT] update_resources_interval), not when it schedules"
			if node != "" {
				l.Provider = nova.PCIProviderName(node, v.PF)
			}
			raw, err := json.Marshal(l)
			if err != nil {
				return err
			}
			return g.emit(raw, func(w io.Writer) {
				header(w, "WHERE", "SECTION", "OPTION", "VALUE")
				if p := l.Proposal; p != nil {
					row(w, "proposal", l.Host, "gpu", fmt.Sprintf("%s: %d VFs of %s (%s)", p.PF, p.Count, typeID, p.Reason))
					for _, o := range p.Others {
						row(w, "proposal", l.Host, "other gpu", o)
					}
				}
				for _, m := range l.Missing {
					row(w, "missing", "", "", m)
				}
				row(w, "vgpu-agent", "devices", "vf_layout", l.VFLayout)
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
	fl.StringVar(&v.PF, "pf", "", "the GPU's physical function, e.g. 0000:c1:00.0 (with HOST: default the GPU that holds the most VFs of the type)")
	fl.StringSliceVar(&v.VFs, "vf", nil, "without HOST: the VFs Nova owns, typed by the boot layout (repeat or comma-separate)")
	fl.IntVar(&count, "count", 0, "with HOST: how many VFs to type (default: as many as the GPU holds)")
	fl.StringVar(&v.VendorID, "vendor", "10de", "the VFs' PCI vendor id")
	fl.StringVar(&v.ProductID, "product", "", "the VFs' PCI device id (lspci -n), e.g. 2335 (with HOST: default the reported one)")
	fl.StringVar(&typeID, "type", "", "the numeric vGPU type id the VFs are typed for, e.g. 1430")
	fl.StringVar(&v.Alias, "alias", "", "the [pci] alias name the flavors ask for (with HOST: default from the type's name, e.g. h200x-35c)")
	fl.StringVar(&node, "node", "", "the compute node's name, to print the provider Nova makes (with HOST: default the reported one)")
	return cmd
}
