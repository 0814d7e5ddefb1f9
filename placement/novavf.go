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
