package agent

var optLibvirtURI = Options.String("libvirt", "connection_uri", "qemu:///system",
	"libvirt connection URI of this host's hypervisor; the same as nova-compute's [libvirt] connection_uri. "+
		"libvirt's test driver with a node description serves tests and the fake host. Example: test:///var/lib/vgpu-bridge/fake/libvirt.xml")

func init() {
	Options.SectionHelp("libvirt", "The hypervisor the agent defines, attaches to and starts domains through.")
}
