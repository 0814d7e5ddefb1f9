package fakehost

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// vmRegistry maps a hostdev key ("mdev:<uuid>", "pci:<addr>") to the domain
// UUID NVML reports as the vGPU's VM id.
type vmRegistry struct {
	mu       sync.Mutex
	lookup   func(key string) string
	unlicens map[string]bool
	guest    map[string]string
}

func (h *Host) reg() *vmRegistry { return &h.vms }

// SetVMLookup sets how the NVML mock finds the VM of a vGPU; key is
// "mdev:<uuid>" or "pci:<vf address>". The default reads Spec.Domains; the
// agent's fake-host mode points it at libvirt so attachments show up.
func (h *Host) SetVMLookup(f func(key string) string) {
	r := h.reg()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lookup = f
}

// SetLicensed marks a vGPU (by mdev UUID or VF address) licensed or not, as
// the guest's licence client would report it.
func (h *Host) SetLicensed(id string, licensed bool) {
	r := h.reg()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unlicens == nil {
		r.unlicens = map[string]bool{}
	}
	r.unlicens[id] = !licensed
}

// SetGuestDriver sets the guest driver version NVML reports for a vGPU
// (by mdev UUID or VF address), e.g. a newer branch than the host's.
func (h *Host) SetGuestDriver(id, version string) {
	r := h.reg()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.guest == nil {
		r.guest = map[string]string{}
	}
	r.guest[id] = version
}

// LoadDir is where a test scripts the load of the fake host's vGPUs:
// DIR/nvml/vgpu_util/<mdev uuid> holds the SM utilisation (0–100) NVML
// reports for that vGPU, optionally followed by its encoder and decoder
// utilisation ("85 30 10"); without the file it reports a steady 40 (and
// 0 for the codecs). A file, not memory, so that a test can drive the load
// an agent process reads.
func LoadDir(dir string) string { return filepath.Join(dir, "nvml", "vgpu_util") }

// SetVGPULoad scripts the SM utilisation NVML reports for a vGPU of the
// fake host in dir (LoadDir).
func SetVGPULoad(dir, id string, pct int) error { return SetVGPUCodecLoad(dir, id, pct, 0, 0) }

// SetVGPUCodecLoad scripts a vGPU's SM, encoder and decoder utilisation.
func SetVGPUCodecLoad(dir, id string, sm, enc, dec int) error {
	if err := os.MkdirAll(LoadDir(dir), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(LoadDir(dir), id), fmt.Appendf(nil, "%d %d %d\n", sm, enc, dec), 0o644)
}

// vgpuLoad is the scripted SM, encoder and decoder utilisation of vGPU
// id, or def for SM and 0 for the codecs.
func (h *Host) vgpuLoad(id string, def uint32) (sm, enc, dec uint32) {
	b, err := os.ReadFile(filepath.Join(LoadDir(h.Dir), id))
	if err != nil {
		return def, 0, 0
	}
	var v [3]uint32
	for i, f := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(f)
		if i >= len(v) || err != nil || n < 0 || n > 100 {
			return def, 0, 0
		}
		v[i] = uint32(n)
	}
	return v[0], v[1], v[2]
}

func (h *Host) guestDriver(id string) string {
	r := h.reg()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.guest[id]
}

func (h *Host) vmOf(key string) string {
	r := h.reg()
	r.mu.Lock()
	f := r.lookup
	r.mu.Unlock()
	if f != nil {
		return f(key)
	}
	for _, d := range h.Spec.Domains {
		for _, m := range d.Mdevs {
			if "mdev:"+m == key {
				return d.UUID
			}
		}
		for _, a := range d.VFs {
			if "pci:"+a.String() == key {
				return d.UUID
			}
		}
	}
	return ""
}

func (h *Host) licensed(id string) bool {
	r := h.reg()
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.unlicens[id]
}

func gpuUUID(a pci.Addr) string {
	s := sha256.Sum256([]byte("fakehost-gpu-" + a.String()))
	x := fmt.Sprintf("%x", s[:16])
	return "GPU-" + x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}

func typeNum(id string) uint32 {
	n, _ := strconv.ParseUint(strings.TrimPrefix(id, "nvidia-"), 10, 32)
	return uint32(n)
}

func vgpuTypes(ts []Type) []gpu.VGPUType {
	out := make([]gpu.VGPUType, 0, len(ts))
	for _, t := range ts {
		out = append(out, gpu.VGPUType{ID: typeNum(t.ID), Name: t.Name, Class: t.Class, FramebufferMB: t.FramebufferMB, MaxInstances: t.MaxInstance})
	}
	return out
}

func devID(s string) uint32 {
	n, _ := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 16)
	return uint32(n)<<16 | 0x10de
}

// MockGPUs describes the host's GPUs for gpu.NewMock: static data from the
// spec, active vGPUs and creatable types read from the sysfs tree at each call.
func (h *Host) MockGPUs() []gpu.MockGPU {
	ctx := context.Background()
	var out []gpu.MockGPU
	for i, g := range h.Spec.MdevGPUs {
		g := g
		fb := map[string]uint64{}
		for _, t := range g.Types {
			fb[t.ID] = t.FramebufferMB
		}
		out = append(out, gpu.MockGPU{
			Name: g.Name, UUID: gpuUUID(g.Addr), Addr: g.Addr, MemoryMB: g.MemoryMB, PciDeviceID: devID(g.DeviceID),
			HostVGPUMode: "non_sriov", Heterogeneous: g.Heterogeneous, Types: vgpuTypes(g.Types),
			UtilGPU: uint32(20 + 15*i), UtilMem: uint32(10 + 5*i), TempC: uint32(45 + 3*i), PowerMW: uint32(28000 + 4000*i),
			SMClockMHz: 1590, MemClockMHz: 5001,
			Active: func() []gpu.MockVGPU {
				ms, _ := h.Sysfs.Mdevs(ctx)
				var vs []gpu.MockVGPU
				for _, m := range ms {
					if m.Parent != g.Addr {
						continue
					}
					sm, enc, dec := h.vgpuLoad(m.UUID, 40)
					vs = append(vs, gpu.MockVGPU{MdevUUID: m.UUID, VMID: h.vmOf("mdev:" + m.UUID), TypeID: typeNum(m.Type),
						FBUsageBytes: fb[m.Type] << 20 / 4, Licensed: h.licensed(m.UUID), UtilPct: sm, EncPct: enc, DecPct: dec,
						GuestDriver: h.guestDriver(m.UUID)})
				}
				return vs
			},
			Creatable: func() []uint32 {
				ts, _ := h.Sysfs.Types(ctx, g.Addr)
				var ids []uint32
				for _, t := range ts {
					if t.AvailableInstances > 0 {
						ids = append(ids, typeNum(t.ID))
					}
				}
				return ids
			},
		})
	}
	for i, g := range h.Spec.VFIOGPUs {
		g := g
		fb := map[string]uint64{}
		for _, t := range g.Types {
			fb[t.ID] = t.FramebufferMB
		}
		vfs := map[pci.Addr]bool{}
		for _, a := range g.VFs() {
			vfs[a] = true
		}
		out = append(out, gpu.MockGPU{
			Name: g.Name, UUID: gpuUUID(g.Addr), Addr: g.Addr, MemoryMB: g.MemoryMB, PciDeviceID: devID(g.DeviceID),
			HostVGPUMode: "sriov", Heterogeneous: g.Heterogeneous, Types: vgpuTypes(g.Types),
			UtilGPU: uint32(55 + 5*i), UtilMem: 30, TempC: 38, PowerMW: 310000, SMClockMHz: 1980, MemClockMHz: 3201,
			Active: func() []gpu.MockVGPU {
				list, _ := h.Sysfs.VFs(ctx)
				var vs []gpu.MockVGPU
				for _, vf := range list {
					if !vfs[vf.Addr] || vf.Current == "" {
						continue
					}
					sm, enc, dec := h.vgpuLoad(vf.Addr.String(), 70)
					vs = append(vs, gpu.MockVGPU{VMID: h.vmOf("pci:" + vf.Addr.String()), TypeID: typeNum(vf.Current),
						FBUsageBytes: fb[vf.Current] << 20 / 2, Licensed: h.licensed(vf.Addr.String()), UtilPct: sm, EncPct: enc, DecPct: dec,
						GuestDriver: h.guestDriver(vf.Addr.String())})
				}
				return vs
			},
			Creatable: func() []uint32 {
				list, _ := h.Sysfs.VFs(ctx)
				seen := map[uint32]bool{}
				var ids []uint32
				for _, vf := range list {
					if !vfs[vf.Addr] || vf.Current != "" {
						continue
					}
					for _, t := range vf.Creatable {
						if n := typeNum(t.ID); !seen[n] {
							seen[n] = true
							ids = append(ids, n)
						}
					}
				}
				return ids
			},
		})
	}
	return out
}

// DriverVersionFile is the file under the host's directory that, when it
// exists, holds the loaded driver's version (the spec's driver_version
// otherwise): a simulated driver-upgrade command writes the new version
// there, and NVML reports it from the next scan on.
const DriverVersionFile = "driver_version"

// FaultsFile, in a fake host's directory, injects GPU faults into the NVML
// mock of the agent running on it (vgpu-agent serve --fake-host): one
// fault a line, "PCI xid N" (a critical Xid event, e.g. "0000:3b:00.0 xid
// 79") or "PCI lost" (NVML loses the GPU). The agent applies the lines and
// removes the file. Write it whole (another file renamed over it).
const FaultsFile = "inject-faults"

// NVML returns an NVML backend over go-nvml's mock that matches the host.
func (h *Host) NVML() (*gpu.NVML, *gpu.Mock) {
	backend, m := gpu.NewMockBackend(h.Spec.DriverVersion, h.MockGPUs())
	m.SystemGetDriverVersionFunc = func() (string, nvml.Return) {
		if b, err := os.ReadFile(filepath.Join(h.Dir, DriverVersionFile)); err == nil {
			if v := strings.TrimSpace(string(b)); v != "" {
				return v, nvml.SUCCESS
			}
		}
		return h.Spec.DriverVersion, nvml.SUCCESS
	}
	return backend, m
}
