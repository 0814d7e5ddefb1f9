package agent

import (
	"fmt"
	"slices"

	"github.com/vgpu-bridge/vgpu-bridge/agent/inventory"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var (
	optEnabledTypes = devicesOptions.List("devices", "enabled_types", "",
		"vGPU types the agent may create and attach, in Nova's vocabulary (copy nova-compute's [devices] "+
			"enabled_mdev_types). With one type every GPU offers it; with several, each type needs a [mdev_<type>] "+
			"section listing its GPUs, and GPUs listed nowhere are not touched. Empty: the agent reports the host but "+
			"creates nothing (with --fake-host: everything is allowed). Vendor-VFIO types may be given as 1428 or nvidia-1428. "+
			"Example: nvidia-232,nvidia-233")
	optEnabledMdevTypes = devicesOptions.List("devices", "enabled_mdev_types", "",
		"Nova's name for enabled_types, accepted so nova.conf's [devices] section can be copied as is; "+
			"the two lists are merged. Example: nvidia-232")
	optVFLayout = devicesOptions.List("devices", "vf_layout", "",
		"Boot layout of Nova-owned vendor-VFIO GPUs (VFs listed in Nova's [pci] device_spec), applied by "+
			"`vgpu-agent layout apply` (vgpu-agent-layout.service, before nova-compute): PF=TYPE:COUNT entries, "+
			"each enabling VFs of the PF (sriov_numvfs) and typing COUNT of them, in address order, with the vGPU "+
			"type id TYPE (1429 or nvidia-1429). One type per GPU. Empty: no layout. "+
			"Example: 0000:c1:00.0=1430:4,0000:c2:00.0=1429:2")
)

// devicesOptions are the options declared in this file; Options assembles them
// into the daemon's set with checkDevices.
var devicesOptions = conf.NewGroup().
	SectionHelp("devices", "Which vGPU types this host offers, with Nova's option names.").
	Template("mdev_", "Per-type GPU list, as Nova's [mdev_<type>] sections: [mdev_nvidia-232] device_addresses = 0000:3b:00.0.",
		conf.Option{Name: "device_addresses", Kind: conf.KindList, Default: "",
			Help: "PCI addresses of the GPUs (or vendor-VFIO VFs/PFs) that offer this type; any of the sysfs, NVML or libvirt spellings. Example: 0000:84:00.0,0000:85:00.0"},
		conf.Option{Name: "max_instances", Kind: conf.KindInt, Default: "0", Min: 0, Max: 1024, HasRange: true,
			Help: "Accepted for compatibility with Nova's section; the agent reads capacity from the driver. Example: 24"},
	)

// checkDevices tests relations between the options of this file.
func checkDevices(v *conf.Values) conf.Errors {
	if _, err := AllowList(v); err != nil {
		return conf.Errors{{Section: "devices", Option: "enabled_types", Problem: err.Error()}}
	}
	if _, err := VFLayoutFrom(v); err != nil {
		return conf.Errors{{Section: "devices", Option: "vf_layout", Problem: err.Error()}}
	}
	return nil
}

// AllowList builds the device allow-list from [devices] and [mdev_<type>].
func AllowList(v *conf.Values) (inventory.AllowList, error) {
	var a inventory.AllowList
	for _, t := range append(optEnabledTypes.Get(v), optEnabledMdevTypes.Get(v)...) {
		if !slices.Contains(a.EnabledTypes, t) {
			a.EnabledTypes = append(a.EnabledTypes, t)
		}
	}
	for _, in := range v.Instances("mdev_") {
		for _, s := range in.List("device_addresses") {
			addr, err := pci.Parse(s)
			if err != nil {
				return a, fmt.Errorf("[mdev_%s] device_addresses: %w", in.Name, err)
			}
			if a.DeviceAddresses == nil {
				a.DeviceAddresses = map[string][]pci.Addr{}
			}
			a.DeviceAddresses[in.Name] = append(a.DeviceAddresses[in.Name], addr)
		}
	}
	return a, a.Validate()
}
