// Package fakehost builds a complete simulated vGPU compute host under a
// directory, for tests, the demo and `vgpu-agent serve --fake-host DIR`:
//
//	DIR/sys          sysfs: mdev parents (e.g. 2× Tesla T4 with nvidia-222…234)
//	                 and a vendor-VFIO PF with SR-IOV VFs (H200-like), IOMMU
//	                 groups, modules, BARs
//	DIR/proc/cmdline the kernel command line
//	DIR/cgroup       a cgroup v2 hierarchy with machine.slice scopes per running domain
//	DIR/libvirt.xml  a libvirt test-driver node description (test:///DIR/libvirt.xml):
//	                 the GPUs as PCI node devices with mdev_types, and domains
//	DIR/spec.json    the Spec it was built from (Load reads it back)
//
// Writes through Host.Sysfs are applied the way the kernel would: writing a
// UUID to a type's create file makes the mdev appear (bus/mdev/devices
// symlink, the type's devices/ entry) and lowers available_instances;
// remove makes it disappear; current_vgpu_type sets or clears a VF's type
// and recomputes what the PF's VFs can still create. The NVML mock (Host.NVML)
// reads the same tree, so a created vGPU is visible through NVML too.
//
// Type ids, names and sizes in DefaultSpec are illustrative fixtures modelled
// on public driver listings (nvidia-232 = "GRID T4-4Q"), not a driver's data.
package fakehost

import (
	"strconv"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// Type is a vGPU type of a fake GPU. For mdev GPUs ID is "nvidia-<n>";
// for vendor-VFIO GPUs it is the decimal id ("1428").
type Type struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	Class         string `json:"class"`
	FramebufferMB uint64 `json:"framebuffer_mb"`
	MaxInstance   int    `json:"max_instance"`
	NumHeads      int    `json:"num_heads"`
	FRLConfig     int    `json:"frl_config"`
	MaxResolution string `json:"max_resolution"`
}

// Mdev is an mdev present when the host is built.
type Mdev struct {
	UUID string `json:"uuid"`
	Type string `json:"type"`
}

// MdevGPU is a GPU using the mdev framework (Turing, Ampere before vGPU 17).
type MdevGPU struct {
	Addr          pci.Addr `json:"address"`
	Name          string   `json:"name"`      // "Tesla T4"
	DeviceID      string   `json:"device_id"` // "0x1eb8"
	MemoryMB      uint64   `json:"memory_mb"`
	Heterogeneous bool     `json:"heterogeneous"`
	IOMMUGroup    int      `json:"iommu_group"`
	BAR1MB        uint64   `json:"bar1_mb"`
	Types         []Type   `json:"types"`
	Mdevs         []Mdev   `json:"mdevs"`
}

// VFIOGPU is an SR-IOV GPU with NVIDIA's vendor VFIO (vGPU 17+, Ada/Hopper).
type VFIOGPU struct {
	Addr     pci.Addr `json:"address"`
	Name     string   `json:"name"`      // "NVIDIA H200"
	DeviceID string   `json:"device_id"` // "0x2335"
	// VFDeviceID is the VFs' PCI device id when it is not the PF's.
	VFDeviceID string            `json:"vf_device_id,omitempty"`
	MemoryMB   uint64            `json:"memory_mb"`
	TotalVFs   int               `json:"total_vfs"`
	NumVFs     int               `json:"num_vfs"`
	IOMMUGroup int               `json:"iommu_group"` // the PF's; VFs follow
	BAR1MB     uint64            `json:"bar1_mb"`
	Types      []Type            `json:"types"`
	Current    map[string]string `json:"current,omitempty"` // VF address → type id at build time
	// Heterogeneous is the driver's mixed-size mode (vGPU 17+ on
	// Ada/Hopper): VFs of types of different framebuffer sizes coexist
	// on the GPU and framebuffer is the limit. Off, the GPU holds one
	// type at a time.
	Heterogeneous bool `json:"heterogeneous,omitempty"`
}

// VFDevice is the VFs' PCI device id: VFDeviceID, else the PF's.
func (g VFIOGPU) VFDevice() string {
	if g.VFDeviceID != "" {
		return g.VFDeviceID
	}
	return g.DeviceID
}

// VFs returns the VF addresses: PF function + 4 + i, continuing into the
// following slots (0000:c1:00.4 … 0000:c1:00.7, 0000:c1:01.0 …).
func (g VFIOGPU) VFs() []pci.Addr {
	out := make([]pci.Addr, 0, g.NumVFs)
	for i := range g.NumVFs {
		n := int(g.Addr.Func) + 4 + i
		out = append(out, pci.Addr{Domain: g.Addr.Domain, Bus: g.Addr.Bus, Slot: g.Addr.Slot + uint8(n/8), Func: uint8(n % 8)})
	}
	return out
}

// Domain is a libvirt domain of the fake host.
type Domain struct {
	Name    string     `json:"name"`
	UUID    string     `json:"uuid"`
	Running bool       `json:"running"`
	Mdevs   []string   `json:"mdevs,omitempty"`
	VFs     []pci.Addr `json:"vfs,omitempty"`
}

// Spec describes a fake host.
type Spec struct {
	Host          string    `json:"host"`
	DriverVersion string    `json:"driver_version"`
	KernelCmdline string    `json:"kernel_cmdline"`
	Modules       []string  `json:"modules"`
	CgroupV1      bool      `json:"cgroup_v1,omitempty"`
	MdevGPUs      []MdevGPU `json:"mdev_gpus"`
	VFIOGPUs      []VFIOGPU `json:"vfio_gpus"`
	Domains       []Domain  `json:"domains"`
}

// T4Types are Tesla T4 mdev types nvidia-222 … nvidia-234.
func T4Types() []Type {
	mk := func(n int, name, class string, fb uint64) Type {
		t := Type{ID: "nvidia-" + itoa(n), Name: "GRID T4-" + name, Class: class, FramebufferMB: fb, MaxInstance: int(16384 / fb)}
		switch class {
		case "NVS": // B profiles
			t.NumHeads, t.FRLConfig, t.MaxResolution = 4, 45, "5120x2880"
		case "GRID": // A profiles (virtual applications)
			t.NumHeads, t.FRLConfig, t.MaxResolution = 1, 60, "1280x1024"
		default: // Q profiles
			t.NumHeads, t.FRLConfig, t.MaxResolution = 4, 60, "7680x4320"
		}
		return t
	}
	return []Type{
		mk(222, "1B", "NVS", 1024), mk(223, "2B", "NVS", 2048), mk(224, "2B4", "NVS", 2048),
		mk(225, "1A", "GRID", 1024), mk(226, "2A", "GRID", 2048), mk(227, "4A", "GRID", 4096),
		mk(228, "8A", "GRID", 8192), mk(229, "16A", "GRID", 16384),
		mk(230, "1Q", "Quadro", 1024), mk(231, "2Q", "Quadro", 2048), mk(232, "4Q", "Quadro", 4096),
		mk(233, "8Q", "Quadro", 8192), mk(234, "16Q", "Quadro", 16384),
	}
}

// H200Types are vendor-VFIO types of an H200-like GPU (ids illustrative).
func H200Types() []Type {
	mk := func(id int, gb int, fb uint64, max int) Type {
		return Type{ID: itoa(id), Name: "NVIDIA H200X-" + itoa(gb) + "C", Class: "Compute", FramebufferMB: fb, MaxInstance: max,
			NumHeads: 0, FRLConfig: 60, MaxResolution: ""}
	}
	return []Type{mk(1428, 141, 143360, 1), mk(1429, 70, 71680, 2), mk(1430, 35, 35840, 4), mk(1431, 17, 17408, 8)}
}

// DefaultSpec is two Tesla T4 (mdev; one mdev of nvidia-232 used by a
// running domain) and one H200-like PF with 8 VFs (one VF with type 1429
// attached to a running domain), and a shut-off domain without vGPU.
func DefaultSpec() Spec {
	return Spec{
		Host:          "fake-compute-0",
		DriverVersion: "550.54.16",
		KernelCmdline: "BOOT_IMAGE=/vmlinuz-6.1.0 root=/dev/sda1 ro intel_iommu=on iommu=pt pci=realloc=off",
		Modules:       []string{"nvidia", "nvidia_vgpu_vfio", "mdev", "vfio", "vfio_pci", "vfio_iommu_type1", "kvm", "kvm_intel"},
		MdevGPUs: []MdevGPU{
			{Addr: pci.MustParse("0000:3b:00.0"), Name: "Tesla T4", DeviceID: "0x1eb8", MemoryMB: 16384, IOMMUGroup: 27, BAR1MB: 256,
				Types: T4Types(), Mdevs: []Mdev{{UUID: "4b20d080-1b54-4048-85b3-a6a62d165c01", Type: "nvidia-232"}}},
			{Addr: pci.MustParse("0000:d8:00.0"), Name: "Tesla T4", DeviceID: "0x1eb8", MemoryMB: 16384, IOMMUGroup: 91, BAR1MB: 256,
				Types: T4Types()},
		},
		VFIOGPUs: []VFIOGPU{
			{Addr: pci.MustParse("0000:c1:00.0"), Name: "NVIDIA H200", DeviceID: "0x2335", MemoryMB: 143771, TotalVFs: 16, NumVFs: 8,
				IOMMUGroup: 120, BAR1MB: 262144, Types: H200Types(), Current: map[string]string{"0000:c1:00.4": "1429"}},
		},
		Domains: []Domain{
			{Name: "instance-00000001", UUID: "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01", Running: true,
				Mdevs: []string{"4b20d080-1b54-4048-85b3-a6a62d165c01"}},
			{Name: "instance-00000002", UUID: "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c02", Running: true,
				VFs: []pci.Addr{pci.MustParse("0000:c1:00.4")}},
			{Name: "instance-00000003", UUID: "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c03", Running: false},
		},
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
