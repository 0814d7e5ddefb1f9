package executor

import (
	"context"
	"encoding/json"
	"time"

	agpu "github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
)

// Sysfs is the mediated-device and vendor-VFIO side of the host
// (agent/sysfs.Host implements it).
type Sysfs interface {
	CreateMdev(ctx context.Context, parent pci.Addr, typeID, uuid string) error
	RemoveMdev(ctx context.Context, uuid string) error
	Mdevs(ctx context.Context) ([]sysfs.Mdev, error)
	// Types lists a parent's mdev types with their names.
	Types(ctx context.Context, parent pci.Addr) ([]sysfs.MdevType, error)
	VFs(ctx context.Context) ([]sysfs.VF, error)
	// SetVFType writes a VF's current_vgpu_type; "0" clears it.
	SetVFType(ctx context.Context, vf pci.Addr, typeID string) error
	// SetVGPUParams writes a vGPU's nvidia/vgpu_params: the mdev's when
	// mdevUUID is set, else the VF's.
	SetVGPUParams(ctx context.Context, mdevUUID string, vf pci.Addr, params string) error
}

// Hostdev is a vGPU device of a domain: an mdev (MdevUUID) or a
// vendor-VFIO VF (PCI).
type Hostdev struct {
	MdevUUID string
	PCI      pci.Addr
	// Live and Config say where the device is defined.
	Live, Config bool
}

// IsMdev reports whether h is an mdev hostdev.
func (h Hostdev) IsMdev() bool { return h.MdevUUID != "" }

func (h Hostdev) same(o Hostdev) bool {
	if h.IsMdev() || o.IsMdev() {
		return equalFoldUUID(h.MdevUUID, o.MdevUUID)
	}
	return h.PCI == o.PCI
}

func (h Hostdev) String() string {
	if h.IsMdev() {
		return "mdev " + h.MdevUUID
	}
	return "pci " + h.PCI.String()
}

// Domain is a libvirt domain as the executor needs it.
type Domain struct {
	UUID    string
	Running bool
	// Hostdevs of the live and persistent definitions (see Hostdev.Live/Config).
	Hostdevs []Hostdev
}

// Has returns the domain's hostdev matching h.
func (d Domain) Has(h Hostdev) (Hostdev, bool) {
	for _, x := range d.Hostdevs {
		if x.same(h) {
			return x, true
		}
	}
	return Hostdev{}, false
}

// Domains is libvirt (an adapter over agent/libvirt in package agent).
type Domains interface {
	Domain(ctx context.Context, uuid string) (Domain, error)
	// List returns every domain (running or only defined), as Domain does.
	List(ctx context.Context) ([]Domain, error)
	// DefineHostdev adds h to the persistent config (no-op when present).
	DefineHostdev(ctx context.Context, domainUUID string, h Hostdev) error
	// RemoveHostdevConfig removes h from the persistent config (no-op when absent).
	RemoveHostdevConfig(ctx context.Context, domainUUID string, h Hostdev) error
	// AttachLive hot-adds h (live and config).
	AttachLive(ctx context.Context, domainUUID string, h Hostdev) error
	// DetachLive hot-removes h (live and config).
	DetachLive(ctx context.Context, domainUUID string, h Hostdev) error
	// Shutdown shuts the guest down gracefully within timeout.
	Shutdown(ctx context.Context, uuid string, timeout time.Duration) error
	// Start starts a defined domain (no-op when running).
	Start(ctx context.Context, uuid string) error
}

// GPUs tunes physical GPUs (agent/gpu.Backend implements it).
type GPUs interface {
	SetVGPUScheduler(ctx context.Context, gpu pci.Addr, policy string, timesliceUs uint32) (agpu.Applied, error)
	SetApplicationClocks(ctx context.Context, gpu pci.Addr, memMHz, smMHz uint32) (agpu.Applied, error)
	ResetApplicationClocks(ctx context.Context, gpu pci.Addr) (agpu.Applied, error)
}

// Limiter applies a VM's CPU and memory limits (libvirt tunables, else
// cgroup v2 files).
type Limiter interface {
	SetVMLimits(ctx context.Context, domainUUID string, l protocol.LimitParams) (how string, err error)
}

// Diagnoser runs the host's diagnostic checks; the answer becomes the
// result's details.
type Diagnoser interface {
	Diagnose(ctx context.Context, checks []string) (json.RawMessage, error)
}

// Bundler gathers a diagnostics bundle (agent/diagbundle) for instance
// (empty: every domain with a vGPU).
type Bundler interface {
	Bundle(ctx context.Context, instance string, checks []string) (protocol.BundleDetails, error)
}

// Health tells a GPU's health ("ok", "degraded", "failed", "unknown").
type Health interface {
	GPUHealth(ctx context.Context, gpu pci.Addr) string
}

// AllowList says which devices and types the agent may touch
// ([devices] enabled_mdev_types, [mdev_<type>] device_addresses).
type AllowList interface {
	// AllowType reports whether typeID may be created on parent (a GPU, or a VF).
	AllowType(parent pci.Addr, typeID string) bool
	// AllowGPU reports whether the physical GPU may be tuned.
	AllowGPU(gpu pci.Addr) bool
}

type allowAll struct{}

func (allowAll) AllowType(pci.Addr, string) bool { return true }
func (allowAll) AllowGPU(pci.Addr) bool          { return true }
