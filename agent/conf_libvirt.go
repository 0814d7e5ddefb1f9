package agent

import "github.com/vgpu-bridge/vgpu-bridge/internal/conf"

var optLibvirtURI = libvirtOptions.String("libvirt", "connection_uri", "qemu:///system",
	"libvirt connection URI of this host's hypervisor; the same as nova-compute's [libvirt] connection_uri. "+
		"libvirt's test driver with a node description serves tests and the fake host. Example: test:///var/lib/vgpu-bridge/fake/libvirt.xml")

// libvirtOptions are the options declared in this file; Options assembles them
// into the daemon's set.
var libvirtOptions = conf.NewGroup().
	SectionHelp("libvirt", "The hypervisor the agent defines, attaches to and starts domains through.")
