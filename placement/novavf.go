package placement

import (
	"fmt"
	"regexp"
	"strings"
)

// Nova-owned VF GPUs: vendor-VFIO GPUs (SR-IOV, vGPU 17+) whose VFs are
// in Nova's [pci] device_spec with a resource_class and [pci]
// report_in_placement = true. Nova's resource tracker then keeps one
// provider per physical function under the compute node
// (<node>_<PF address upper-cased>, nova.compute.pci_placement_translator)
// with one unit of the class per VF, and heals the allocations of the
// servers that got a VF in its periodic update_available_resource (Nova
// 26's scheduler does not allocate PCI devices in Placement). The bridge
// mirrors those providers as GPUs of the type [placement]
// nova_vf_resource_classes gives their class; it never writes them and
// its direct path never claims on them (Claim excludes their classes).

var reNovaVFClass = regexp.MustCompile(`^CUSTOM_[A-Z0-9_]+$`)

// ParseNovaVFClass parses "CLASS=TYPE" (CUSTOM_VGPU_VF_1430=1430).
func ParseNovaVFClass(s string) (class, typeID string, err error) {
	class, typeID, ok := strings.Cut(strings.TrimSpace(s), "=")
	if !ok {
		return "", "", fmt.Errorf("%q: want CLASS=TYPE", s)
	}
	if !reNovaVFClass.MatchString(class) {
		return "", "", fmt.Errorf("%q: %q is not a custom resource class (CUSTOM_[A-Z0-9_]+)", s, class)
	}
	if class == BridgeClass {
		return "", "", fmt.Errorf("%q: %s is the class of bridge-owned GPUs", s, BridgeClass)
	}
	if typeID == "" || strings.Trim(typeID, "0123456789") != "" {
		return "", "", fmt.Errorf("%q: %q is not a numeric vendor-VFIO type id", s, typeID)
	}
	return class, typeID, nil
}

// IsNovaVF reports whether class is the class of Nova-owned VF GPUs.
func (s *Service) IsNovaVF(class string) bool {
	_, ok := s.cfg.NovaVFClasses[class]
	return ok
}

// NovaVFAlias is a Nova PCI alias ([pci] alias) whose devices are the VFs
// of Nova-owned VF GPUs: a flavor's pci_passthrough:alias naming it gives
// its servers that many VFs of Class, typed TypeID. The bridge counts them
// in its usage accounting and its per-profile quota ([placement]
// nova_vf_aliases).
type NovaVFAlias struct {
	Class  string // the device_spec's resource_class (nova_vf_resource_classes)
	TypeID string // the numeric vGPU type the class's VFs are typed for
}

// ParseNovaVFAlias parses "ALIAS=CLASS" (h200x-35c=CUSTOM_VGPU_VF_1430).
// An alias name is what Nova's pci_passthrough:alias can name: no ':' or
// ',' (nova.pci.request._translate_alias_to_requests splits on them).
func ParseNovaVFAlias(s string) (alias, class string, err error) {
	alias, class, ok := strings.Cut(strings.TrimSpace(s), "=")
	alias, class = strings.TrimSpace(alias), strings.TrimSpace(class)
	if !ok || alias == "" {
		return "", "", fmt.Errorf("%q: want ALIAS=CLASS", s)
	}
	if strings.ContainsAny(alias, ":,") {
		return "", "", fmt.Errorf("%q: an alias name has no ':' or ','", s)
	}
	if !reNovaVFClass.MatchString(class) {
		return "", "", fmt.Errorf("%q: %q is not a custom resource class (CUSTOM_[A-Z0-9_]+)", s, class)
	}
	return alias, class, nil
}
