package agent

import "github.com/vgpu-bridge/vgpu-bridge/internal/conf"

var (
	optSysfsRoot = sysfsOptions.String("sysfs", "root", "/sys",
		"Root of sysfs: mediated devices (class/mdev_bus, bus/mdev), NVIDIA vendor VFIO files (bus/pci/devices/*/nvidia), "+
			"IOMMU groups and modules are read and written under it. Example: /var/lib/vgpu-bridge/fake/sys")
	optProcRoot = sysfsOptions.String("sysfs", "proc_root", "/proc",
		"Root of procfs; diagnostics read its cmdline (IOMMU and pci=realloc flags). Example: /var/lib/vgpu-bridge/fake/proc")
	optCgroupRoot = sysfsOptions.String("sysfs", "cgroup_root", "/sys/fs/cgroup",
		"Root of the cgroup v2 hierarchy; set_vm_limits writes cpu.max and memory.high of "+
			"machine.slice/machine-qemu\\x2d<id>\\x2d<name>.scope under it when libvirt's tunables cannot. Example: /sys/fs/cgroup")
)

// sysfsOptions are the options declared in this file; Options assembles them
// into the daemon's set.
var sysfsOptions = conf.NewGroup().
	SectionHelp("sysfs", "Where the kernel's device, process and cgroup files are (injectable for tests and the fake host).")

// hostSettingsFrom reads the host-driver options.
func hostSettingsFrom(v *conf.Values) (hostSettings, error) {
	allow, err := AllowList(v)
	return hostSettings{LibvirtURI: optLibvirtURI.Get(v), SysfsRoot: optSysfsRoot.Get(v), CgroupRoot: optCgroupRoot.Get(v),
		ProcRoot: optProcRoot.Get(v), NVMLBackend: optNVMLBackend.Get(v), Allow: allow}, err
}
