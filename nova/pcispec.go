package nova

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// VFPassthrough is a vendor-VFIO GPU (SR-IOV, vGPU 17+) whose VFs Nova
// owns as PCI passthrough devices ("Nova-owned VFs"): what nova.conf's
// [pci] device_spec and alias and a flavor's extra spec need so that
// Nova's resource tracker reports the VFs in Placement (one provider per
// PF, named <hypervisor hostname>_<PF address upper-cased>, with
// ResourceClass and Traits: nova.compute.pci_placement_translator) and a
// server of the flavor gets one.
type VFPassthrough struct {
	PF        string   // the physical function, 0000:c1:00.0
	VFs       []string // its VFs, 0000:c1:00.4 …
	VendorID  string   // 10de
	ProductID string   // the VFs' PCI device id, 2335
	// ResourceClass is the device_spec's resource_class: the class of the
	// PF's provider, which the bridge mirrors as Nova-owned VF GPUs when
	// it is in [placement] nova_vf_resource_classes. CUSTOM_VGPU_VF_1430.
	ResourceClass string
	// TypeTrait is the vGPU type's trait (CUSTOM_1430 for type 1430, as the
	// bridge names the types of vendor-VFIO GPUs), put in the device_spec's
	// traits so that the provider says which type its VFs have.
	TypeTrait string
	// Alias is the [pci] alias name the flavor asks for.
	Alias string
}

// VFResourceClass is the resource class the bridge proposes for the VFs
// of a vendor-VFIO type id: CUSTOM_VGPU_VF_<type id>.
func VFResourceClass(typeID string) string { return "CUSTOM_VGPU_VF_" + strings.ToUpper(typeID) }

// DeviceSpecs are the [pci] device_spec entries that match the VFs and
// nothing else (not the PF: Nova 26 refuses a PF and its VFs both in
// Placement), one per PCI slot the VFs span: an address of regular
// expressions ({"domain", "bus", "slot", "function"}, as
// nova.pci.devspec.PciAddressRegexSpec takes them) with the vendor and
// product ids, the resource_class and the type trait.
func (v VFPassthrough) DeviceSpecs() ([]string, error) {
	type slotKey struct{ domain, bus, slot string }
	funcs := map[slotKey][]string{}
	var order []slotKey
	for _, a := range v.VFs {
		d, b, s, f, err := splitPCI(a)
		if err != nil {
			return nil, err
		}
		k := slotKey{d, b, s}
		if _, ok := funcs[k]; !ok {
			order = append(order, k)
		}
		funcs[k] = append(funcs[k], f)
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("no VFs of %s", v.PF)
	}
	var out []string
	for _, k := range order {
		fs := funcs[k]
		slices.Sort(fs)
		fs = slices.Compact(fs)
		spec := map[string]any{
			"vendor_id":  v.VendorID,
			"product_id": v.ProductID,
			"address": map[string]string{
				"domain": k.domain, "bus": k.bus, "slot": k.slot,
				"function": "[" + strings.Join(fs, "") + "]",
			},
		}
		if v.ResourceClass != "" {
			spec["resource_class"] = v.ResourceClass
		}
		if v.TypeTrait != "" {
			spec["traits"] = v.TypeTrait
		}
		b, err := json.Marshal(spec)
		if err != nil {
			return nil, err
		}
		out = append(out, string(b))
	}
	return out, nil
}

// AliasSpec is the [pci] alias entry: Nova 26's alias selects devices by
// vendor, product and device type only (nova.pci.request._ALIAS_SCHEMA),
// so VFs of one product id are one alias whatever their type.
func (v VFPassthrough) AliasSpec() string {
	b, _ := json.Marshal(map[string]string{"name": v.Alias, "vendor_id": v.VendorID, "product_id": v.ProductID, "device_type": "type-VF"})
	return string(b)
}

// ExtraSpecs are the flavor extra specs that ask for one VF of the alias.
func (v VFPassthrough) ExtraSpecs() map[string]string {
	return map[string]string{"pci_passthrough:alias": v.Alias + ":1"}
}

// PCIProviderName is the name Nova's resource tracker gives the provider
// of a PF's VFs: the compute node's name, '_', the PF's address
// upper-cased (pci_placement_translator.PlacementView._get_rp_name_for_address).
func PCIProviderName(node, pf string) string { return node + "_" + strings.ToUpper(pf) }

// splitPCI splits DDDD:BB:SS.F into its lower-case fields.
func splitPCI(a string) (domain, bus, slot, fn string, err error) {
	a = strings.ToLower(a)
	d, rest, ok1 := strings.Cut(a, ":")
	b, rest, ok2 := strings.Cut(rest, ":")
	s, f, ok3 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 || len(d) != 4 || len(b) != 2 || len(s) != 2 || len(f) != 1 || !isHexString(d+b+s) || f[0] < '0' || f[0] > '7' {
		return "", "", "", "", fmt.Errorf("%q is not a PCI address (DDDD:BB:SS.F)", a)
	}
	return d, b, s, f, nil
}

func isHexString(s string) bool {
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}
