package agent

import (
	"github.com/vgpu-bridge/vgpu-bridge/agent/diagnose"
	"github.com/vgpu-bridge/vgpu-bridge/agent/inventory"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// Scanner returns an inventory scanner over the drivers.
func (d *Drivers) Scanner(v *conf.Values) *inventory.Scanner {
	s := &inventory.Scanner{Host: Host(v), Node: nodeName(v), AgentVersion: Version, Sysfs: d.Sysfs, GPUs: d.GPU,
		NVMLError: d.NVMLError, LibvirtError: d.LibvirtError, Allow: d.Allow}
	if d.Cgroup != nil {
		s.CgroupVersion = d.Cgroup.VersionString
	}
	if d.Libvirt != nil {
		s.Domains = d.Libvirt
	}
	return s
}

// Diagnoser returns the host's diagnostics over the drivers.
func (d *Drivers) Diagnoser(v *conf.Values) *diagnose.Diagnoser {
	return &diagnose.Diagnoser{Scanner: d.Scanner(v), Host: d.Sysfs, ProcRoot: d.ProcRoot}
}
