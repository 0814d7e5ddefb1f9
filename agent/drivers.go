package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/agent/cgroup"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/inventory"
	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// Drivers are the host drivers the agent runs on: the real ones from the
// configuration, or a fake host's.
type Drivers struct {
	Sysfs     *sysfs.Host
	Libvirt   *libvirt.Conn
	HotPlug   libvirt.HotPlugger
	GPU       gpu.Backend
	NVMLError string
	// LibvirtError is why libvirt could not be reached, when the drivers
	// were opened to inspect the host (Libvirt and HotPlug are nil then).
	LibvirtError string
	Cgroup       *cgroup.FS
	ProcRoot     string
	Allow        inventory.AllowList
	// Fake is the fake host when running with --fake-host.
	Fake *fakehost.Host
	// NVMLMock is the fake host's NVML mock (GPU is over it): tests
	// inject GPU faults through it (gpu.Mock InjectXid, InjectECC, …).
	NVMLMock *gpu.Mock
}

// Close releases the drivers.
func (d *Drivers) Close() {
	if d.GPU != nil {
		d.GPU.Close()
	}
	if d.Libvirt != nil {
		d.Libvirt.Close()
	}
}

// OpenFakeHost opens (building it first when dir has none) the simulated
// host under dir: fake sysfs and cgroup trees the agent really writes,
// libvirt's test driver on dir/libvirt.xml with an emulated hot-plug, and
// the NVML mock reading the fake sysfs.
func OpenFakeHost(dir string) (*Drivers, error) {
	h, err := fakehost.LoadOrBuild(dir)
	if err != nil {
		return nil, err
	}
	conn, err := libvirt.Open(h.LibvirtURI())
	if err != nil {
		return nil, fmt.Errorf("fake host libvirt: %w", err)
	}
	// NVML's view of which VM uses a vGPU follows libvirt's domains.
	h.SetVMLookup(func(key string) string {
		doms, err := conn.Domains(context.Background())
		if err != nil {
			return ""
		}
		for _, d := range doms {
			for _, hd := range d.Hostdevs {
				if (hd.Type == "mdev" && key == "mdev:"+hd.MdevUUID) || (hd.Type == "pci" && key == "pci:"+hd.Addr.String()) {
					return d.UUID
				}
			}
		}
		return ""
	})
	// As on a real host, removing an mdev a running domain holds waits
	// until the domain lets it go.
	h.Kernel.InUse = func(uuid string) bool {
		doms, err := conn.Domains(context.Background())
		if err != nil {
			return false
		}
		for _, d := range doms {
			for _, hd := range d.Hostdevs {
				if d.Running() && hd.Live && hd.Type == "mdev" && strings.EqualFold(hd.MdevUUID, uuid) {
					return true
				}
			}
		}
		return false
	}
	backend, mock := h.NVML()
	return &Drivers{Sysfs: h.Sysfs, Libvirt: conn, HotPlug: &libvirt.FakeHotPlugger{Conn: conn}, GPU: backend,
		Cgroup: cgroup.New(h.CgroupRoot), ProcRoot: h.ProcRoot, Allow: inventory.AllowList{All: true}, Fake: h, NVMLMock: mock}, nil
}

// hostSettings are the host-driver options ([libvirt] [sysfs] [nvml]
// [devices] [mdev_*]); hostSettingsFrom reads them.
type hostSettings struct {
	LibvirtURI  string
	SysfsRoot   string
	CgroupRoot  string
	ProcRoot    string
	NVMLBackend string // nvml | mock | none
	Allow       inventory.AllowList
}

// OpenDrivers opens the host drivers the configuration names. NVML is
// optional: when it cannot start, the agent runs on without GPUs (and says
// why in its reports).
func OpenDrivers(v *conf.Values, log *slog.Logger) (*Drivers, error) {
	return openDrivers(v, log, false)
}

// OpenDriversToInspect opens the drivers for inventory and diagnose: a
// libvirt that cannot be reached is what they report (LibvirtError), not
// a reason to stop.
func OpenDriversToInspect(v *conf.Values, log *slog.Logger) (*Drivers, error) {
	return openDrivers(v, log, true)
}

func openDrivers(v *conf.Values, log *slog.Logger, inspect bool) (*Drivers, error) {
	s, err := hostSettingsFrom(v)
	if err != nil {
		return nil, err
	}
	if s.NVMLBackend == "mock" {
		return nil, conf.Errors{&conf.Error{Section: "nvml", Option: "backend", Value: "mock",
			Problem: "the NVML mock mirrors a simulated host; use `--fake-host DIR`, or backend = nvml | none on a real host"}}
	}
	if err := s.Allow.Validate(); err != nil {
		return nil, conf.Errors{&conf.Error{Section: "devices", Option: "enabled_mdev_types", Problem: err.Error()}}
	}
	d := &Drivers{Sysfs: sysfs.New(s.SysfsRoot), Cgroup: cgroup.New(s.CgroupRoot), ProcRoot: s.ProcRoot, Allow: s.Allow}
	conn, err := libvirt.Open(s.LibvirtURI)
	switch {
	case err == nil:
		d.Libvirt, d.HotPlug = conn, libvirt.LiveHotPlugger{Conn: conn}
	case inspect:
		d.LibvirtError = err.Error()
	default:
		return nil, err
	}
	d.Allow.PhysFn = physFn(d.Sysfs)
	switch s.NVMLBackend {
	case "none":
		d.GPU, d.NVMLError = gpu.None{Reason: gpu.DisabledByConfig}, gpu.DisabledByConfig
	default:
		b, err := gpu.Open()
		if err != nil {
			log.Warn("NVML unavailable; running without GPU data", "err", err)
			d.GPU, d.NVMLError = gpu.None{Reason: err.Error()}, err.Error()
		} else {
			d.GPU = b
		}
	}
	return d, nil
}

// physFn maps a VF to its PF through sysfs.
func physFn(h *sysfs.Host) func(pci.Addr) (pci.Addr, bool) {
	return func(a pci.Addr) (pci.Addr, bool) {
		vfs, err := h.VFs(context.Background())
		if err != nil {
			return pci.Addr{}, false
		}
		for _, v := range vfs {
			if v.Addr == a && !v.PhysFn.IsZero() {
				return v.PhysFn, true
			}
		}
		return pci.Addr{}, false
	}
}

func nodeName(v *conf.Values) string {
	if n := optNode.Get(v); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}
