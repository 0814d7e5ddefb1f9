package inventory

import (
	"fmt"
	"slices"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// AllowList is Nova's vocabulary for which vGPU types the host offers on
// which GPUs: [devices] enabled_mdev_types and, per type,
// [mdev_<type>] device_addresses. As in Nova: with one enabled type every GPU
// gets it; with several, a GPU gets the type whose device_addresses list it
// and GPUs listed nowhere get none; an address listed for two types is a
// configuration error. All, when set, allows everything (the fake host's
// default when nothing is configured).
type AllowList struct {
	All             bool
	EnabledTypes    []string
	DeviceAddresses map[string][]pci.Addr // type id → GPUs (PF or VF addresses)
	// PhysFn maps a VF to its PF so an allow-list naming the PF covers its VFs.
	PhysFn func(pci.Addr) (pci.Addr, bool)
}

// Validate reports configuration errors Nova would refuse to start with.
func (a AllowList) Validate() error {
	seen := map[pci.Addr]string{}
	for typ, addrs := range a.DeviceAddresses {
		if !slices.ContainsFunc(a.EnabledTypes, func(t string) bool { return sameType(t, typ) }) {
			return fmt.Errorf("[mdev_%s] device_addresses given but %s is not in [devices] enabled_mdev_types", typ, typ)
		}
		for _, ad := range addrs {
			if other, dup := seen[ad]; dup && other != typ {
				return fmt.Errorf("%s is listed in [mdev_%s] and [mdev_%s] device_addresses", ad, other, typ)
			}
			seen[ad] = typ
		}
	}
	return nil
}

// sameType compares type ids, treating vendor-VFIO "1428" and "nvidia-1428" alike.
func sameType(a, b string) bool {
	return strings.TrimPrefix(a, "nvidia-") == strings.TrimPrefix(b, "nvidia-")
}

// TypeFor returns the type Nova would offer on gpu, or "".
func (a AllowList) TypeFor(gpu pci.Addr) string {
	if len(a.EnabledTypes) == 0 {
		return ""
	}
	if len(a.EnabledTypes) == 1 {
		return a.EnabledTypes[0]
	}
	pf, hasPF := pci.Addr{}, false
	if a.PhysFn != nil {
		pf, hasPF = a.PhysFn(gpu)
	}
	for _, t := range a.EnabledTypes {
		for typ, addrs := range a.DeviceAddresses {
			if !sameType(t, typ) {
				continue
			}
			if slices.Contains(addrs, gpu) || (hasPF && slices.Contains(addrs, pf)) {
				return t
			}
		}
	}
	return ""
}

// AllowType reports whether typeID may be created on parent (a GPU or a VF).
func (a AllowList) AllowType(parent pci.Addr, typeID string) bool {
	if a.All {
		return true
	}
	t := a.TypeFor(parent)
	return t != "" && sameType(t, typeID)
}

// AllowGPU reports whether the physical GPU may be touched (tuned).
func (a AllowList) AllowGPU(gpu pci.Addr) bool {
	return a.All || a.TypeFor(gpu) != ""
}
