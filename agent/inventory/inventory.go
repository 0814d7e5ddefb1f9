// Package inventory combines what sysfs, libvirt and NVML say about a host
// into one Inventory snapshot: the agent's report body (package agent/protocol) and the
// output of `vgpu-agent inventory`. Each source is optional; a source that
// fails is named in Inventory.Errors and the rest is still reported.
package inventory

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
)

// Sysfs is what the scanner reads from sysfs (*sysfs.Host).
type Sysfs interface {
	MdevParents(ctx context.Context) ([]sysfs.Parent, error)
	Types(ctx context.Context, parent pci.Addr) ([]sysfs.MdevType, error)
	Mdevs(ctx context.Context) ([]sysfs.Mdev, error)
	VFs(ctx context.Context) ([]sysfs.VF, error)
	PFs(ctx context.Context) ([]sysfs.PF, error)
}

// Domains is what the scanner reads from libvirt (*libvirt.Conn).
type Domains interface {
	Domains(ctx context.Context) ([]libvirt.Domain, error)
}

// Hypervisor is what a Domains may also tell: the hypervisor libvirt
// runs (libvirt.Conn).
type Hypervisor interface {
	Hypervisor(ctx context.Context) (string, error)
}

// GPUs is what the scanner reads from NVML (gpu.Backend).
type GPUs interface {
	GPUs(ctx context.Context) ([]gpu.GPU, error)
}

// Scanner builds Inventories.
type Scanner struct {
	Host          string
	Node          string // hypervisor node name (Placement's root provider)
	AgentVersion  string
	Sysfs         Sysfs   // may be nil
	Domains       Domains // may be nil
	GPUs          GPUs    // may be nil
	NVMLError     string  // why NVML is not there, when GPUs is nil or gpu.None
	LibvirtError  string  // why libvirt is not there, when Domains is nil
	CgroupVersion func() string
	Allow         AllowList
	Now           func() time.Time
}

// Inventory is one snapshot of the host.
type Inventory struct {
	Host           string    `json:"host"`
	Node           string    `json:"node,omitempty"`
	AgentVersion   string    `json:"agent_version,omitempty"`
	CollectedAt    time.Time `json:"collected_at"`
	DriverVersions []string  `json:"driver_versions"`
	NVML           bool      `json:"nvml"`
	NVMLError      string    `json:"nvml_error,omitempty"`
	CgroupVersion  string    `json:"cgroup_version,omitempty"`
	// Hypervisor is what libvirt runs, for NVIDIA's compatibility matrix:
	// "KVM (QEMU 8.2.2)".
	Hypervisor string      `json:"hypervisor,omitempty"`
	GPUs       []GPU       `json:"gpus"`
	Domains    []DomainRef `json:"domains"`
	// Orphans are mdevs (UUIDs) and VFs with a type that no domain uses.
	Orphans []string `json:"orphans"`
	Errors  []string `json:"errors,omitempty"`
}

// GPU is a physical GPU with its vGPU view.
type GPU struct {
	Addr          pci.Addr `json:"pci_address"`
	Name          string   `json:"name,omitempty"`
	UUID          string   `json:"uuid,omitempty"`
	DeviceID      string   `json:"device_id,omitempty"`
	Driver        string   `json:"driver,omitempty"` // kernel driver bound
	DriverVersion string   `json:"driver_version,omitempty"`
	// Mode: "mdev" (mediated devices), "vendor_vfio" (SR-IOV VFs) or "none".
	Mode          string   `json:"mode"`
	HostVGPUMode  string   `json:"host_vgpu_mode,omitempty"`
	Heterogeneous *bool    `json:"heterogeneous,omitempty"`
	Health        string   `json:"health"` // ok, degraded, unknown
	HealthReasons []string `json:"health_reasons,omitempty"`
	// Fault is set when NVML says the GPU must take no new vGPU (Health
	// is then "failed", its reason first in HealthReasons).
	Fault        *gpu.Fault     `json:"fault,omitempty"`
	Allowed      bool           `json:"allowed"`
	EnabledType  string         `json:"enabled_type,omitempty"`
	Types        []Type         `json:"types"`
	VGPUs        []VGPU         `json:"vgpus"`
	VFs          []VF           `json:"vfs,omitempty"`
	Utilization  gpu.Util       `json:"utilization"`
	Memory       gpu.Memory     `json:"memory"`
	TemperatureC uint32         `json:"temperature_c"`
	PowerMW      uint32         `json:"power_mw"`
	Clocks       gpu.Clocks     `json:"clocks"`
	Scheduler    *gpu.Scheduler `json:"scheduler,omitempty"`
	License      gpu.License    `json:"license"`
}

// Type is a vGPU type of a GPU with its capacity.
type Type struct {
	ID            string `json:"id"` // "nvidia-232", or "1428" for vendor VFIO
	Name          string `json:"name"`
	Class         string `json:"class,omitempty"`
	FramebufferMB uint64 `json:"framebuffer_mb,omitempty"`
	MaxInstances  int    `json:"max_instances,omitempty"`
	Available     int    `json:"available"`
	InUse         int    `json:"in_use"`
	Allowed       bool   `json:"allowed"`
	// Refused says why the agent never offers this type, whatever the
	// allow-list says (sysfs.MIGRefusal).
	Refused string `json:"refused,omitempty"`
}

// VGPU is a vGPU that exists on a GPU, with the instance using it.
type VGPU struct {
	ID         string   `json:"id"`   // mdev UUID, or VF address
	Kind       string   `json:"kind"` // "mdev" | "vf"
	VF         pci.Addr `json:"vf,omitzero"`
	Type       string   `json:"type"`
	TypeName   string   `json:"type_name,omitempty"`
	Instance   string   `json:"instance_uuid,omitempty"` // = domain UUID
	DomainName string   `json:"domain_name,omitempty"`
	Live       bool     `json:"live"`
	FBUsage    uint64   `json:"fb_usage_bytes,omitempty"`
	// GuestDriver is the guest's NVIDIA driver version as NVML reports it.
	GuestDriver string `json:"guest_driver_version,omitempty"`
	Licensed    *bool  `json:"licensed,omitempty"`
	UtilPct     uint32 `json:"utilization_pct,omitempty"`
	EncoderPct  uint32 `json:"encoder_pct,omitempty"`
	DecoderPct  uint32 `json:"decoder_pct,omitempty"`
	// Running: NVML lists the vGPU as active (a guest runs on it), so
	// UtilPct and FBUsage are its load.
	Running bool `json:"running,omitempty"`
}

// VF is a vendor-VFIO virtual function of a GPU.
type VF struct {
	Addr      pci.Addr `json:"address"`
	Current   string   `json:"current,omitempty"`
	Creatable []string `json:"creatable"`
	DeviceID  string   `json:"device_id,omitempty"` // the VF's PCI device id, "0x2335"
}

// DomainRef is a domain and its vGPU devices.
type DomainRef struct {
	Name  string     `json:"name"`
	UUID  string     `json:"uuid"`
	State string     `json:"state"`
	Mdevs []string   `json:"mdevs,omitempty"`
	VFs   []pci.Addr `json:"vfs,omitempty"`
}

func typeNum(id string) (uint32, bool) {
	n, err := strconv.ParseUint(strings.TrimPrefix(id, "nvidia-"), 10, 32)
	return uint32(n), err == nil
}

// Scan collects one Inventory.
func (s *Scanner) Scan(ctx context.Context) (*Inventory, error) {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	inv := &Inventory{Host: s.Host, Node: s.Node, AgentVersion: s.AgentVersion, CollectedAt: now().UTC(),
		DriverVersions: []string{}, GPUs: []GPU{}, Domains: []DomainRef{}, Orphans: []string{}, NVMLError: s.NVMLError}
	if s.CgroupVersion != nil {
		inv.CgroupVersion = s.CgroupVersion()
	}
	fail := func(src string, err error) { inv.Errors = append(inv.Errors, src+": "+err.Error()) }
	if h, ok := s.Domains.(Hypervisor); ok {
		if v, err := h.Hypervisor(ctx); err != nil {
			fail("libvirt", err)
		} else {
			inv.Hypervisor = v
		}
	}

	// NVML
	byAddr := map[pci.Addr]*GPU{}
	var order []pci.Addr
	get := func(a pci.Addr) *GPU {
		if g, ok := byAddr[a]; ok {
			return g
		}
		g := &GPU{Addr: a, Mode: "none", Types: []Type{}, VGPUs: []VGPU{}}
		byAddr[a] = g
		order = append(order, a)
		return g
	}
	nvmlGPUs := map[pci.Addr]gpu.GPU{}
	if s.GPUs != nil {
		gs, err := s.GPUs.GPUs(ctx)
		if err != nil {
			fail("nvml", err)
		}
		_, none := s.GPUs.(gpu.None)
		inv.NVML = err == nil && !none
		for _, ng := range gs {
			nvmlGPUs[ng.Addr] = ng
			g := get(ng.Addr)
			g.Name, g.UUID, g.DriverVersion = ng.Name, ng.UUID, ng.DriverVersion
			g.HostVGPUMode, g.Heterogeneous = ng.HostVGPUMode, ng.Heterogeneous
			g.Utilization, g.Memory, g.TemperatureC, g.PowerMW = ng.Utilization, ng.Memory, ng.TemperatureC, ng.PowerMW
			g.Clocks, g.Scheduler, g.License = ng.Clocks, ng.Scheduler, ng.License
			if ng.DriverVersion != "" && !slices.Contains(inv.DriverVersions, ng.DriverVersion) {
				inv.DriverVersions = append(inv.DriverVersions, ng.DriverVersion)
			}
		}
	}

	// libvirt
	owner := map[string]libvirt.Domain{} // "mdev:<uuid>" / "pci:<addr>" → domain
	live := map[string]bool{}
	// A vGPU is an orphan only when libvirt said which domains hold what:
	// with no answer from it (libvirt down, restarting), every vGPU would
	// look unowned, and the drift it reports would release in-use vGPUs.
	domainsRead := false
	switch {
	case s.Domains == nil && s.LibvirtError != "":
		fail("libvirt", errors.New(s.LibvirtError))
	case s.Domains != nil:
		doms, err := s.Domains.Domains(ctx)
		if err != nil {
			fail("libvirt", err)
		}
		domainsRead = err == nil
		for _, d := range doms {
			ref := DomainRef{Name: d.Name, UUID: d.UUID, State: d.State}
			for _, h := range d.Hostdevs {
				key := "pci:" + h.Addr.String()
				if h.Type == "mdev" {
					key = "mdev:" + h.MdevUUID
					ref.Mdevs = append(ref.Mdevs, h.MdevUUID)
				} else {
					ref.VFs = append(ref.VFs, h.Addr)
				}
				owner[key] = d
				live[key] = live[key] || h.Live
			}
			inv.Domains = append(inv.Domains, ref)
		}
	}

	if !domainsRead {
		owner = nil // no one is known to hold anything, or not to
	}

	// sysfs: mdev parents
	parentsKnown := true // whether sysfs said which GPUs are mdev parents
	if s.Sysfs != nil {
		parentsKnown = s.scanMdev(ctx, inv, get, nvmlGPUs, owner, live, fail)
		s.scanVFIO(ctx, inv, get, nvmlGPUs, owner, live, fail)
	}

	// NVML-only GPUs keep their NVML types. A GPU sysfs lists as an mdev
	// parent or a vendor-VFIO PF never does, nor does any GPU when the mdev
	// parents could not be listed: NVML's numeric ids ("230") are not mdev
	// type ids ("nvidia-230"), and reporting them would re-key the bridge's
	// profile catalog. A GPU whose types could not be read is reported
	// without types, with the error in Errors.
	for _, a := range order {
		g := byAddr[a]
		if ng, ok := nvmlGPUs[a]; ok && parentsKnown && g.Mode == "none" && len(g.Types) == 0 {
			for _, t := range ng.SupportedTypes {
				g.Types = append(g.Types, Type{ID: strconv.FormatUint(uint64(t.ID), 10), Name: t.Name, Class: t.Class,
					FramebufferMB: t.FramebufferMB, MaxInstances: t.MaxInstances})
			}
		}
		g.EnabledType = s.Allow.TypeFor(a)
		g.Allowed = s.Allow.AllowGPU(a)
		for i := range g.Types {
			t := &g.Types[i]
			t.Allowed = s.Allow.AllowType(a, t.ID)
			if sysfs.MIGBacked(t.Name) {
				t.Allowed, t.Refused = false, sysfs.MIGRefusal
			}
		}
		health(g, nvmlGPUs[a], s.GPUs != nil && inv.NVML)
	}
	slices.SortFunc(order, func(a, b pci.Addr) int { return strings.Compare(a.String(), b.String()) })
	for _, a := range order {
		inv.GPUs = append(inv.GPUs, *byAddr[a])
	}
	slices.Sort(inv.Orphans)
	return inv, nil
}

func (s *Scanner) scanMdev(ctx context.Context, inv *Inventory, get func(pci.Addr) *GPU, nvmlGPUs map[pci.Addr]gpu.GPU,
	owner map[string]libvirt.Domain, live map[string]bool, fail func(string, error)) (parentsKnown bool) {
	parents, err := s.Sysfs.MdevParents(ctx)
	if err != nil {
		fail("sysfs", err)
		return false
	}
	mdevs, err := s.Sysfs.Mdevs(ctx)
	if err != nil {
		fail("sysfs", err)
	}
	for _, p := range parents {
		g := get(p.Addr)
		g.Mode, g.Driver, g.DeviceID = "mdev", p.Driver, p.DeviceID
		ng := nvmlGPUs[p.Addr]
		nvTypes := map[uint32]gpu.VGPUType{}
		for _, t := range ng.SupportedTypes {
			nvTypes[t.ID] = t
		}
		nvActive := map[string]gpu.VGPUInstance{}
		for _, v := range ng.Active {
			nvActive[strings.ToLower(v.MdevUUID)] = v
		}
		types, err := s.types(ctx, p.Addr)
		if err != nil {
			// Still report its mdevs: the GPU is not empty because its
			// types could not be read.
			fail("sysfs "+p.Addr.String(), err)
		}
		names := map[string]string{}
		for _, t := range types {
			ty := Type{ID: t.ID, Name: t.Name, FramebufferMB: t.Desc.FramebufferMB, MaxInstances: t.Desc.MaxInstance,
				Available: t.AvailableInstances, InUse: len(t.Devices)}
			if n, ok := typeNum(t.ID); ok {
				if nt, ok := nvTypes[n]; ok {
					ty.Class = nt.Class
					if ty.FramebufferMB == 0 {
						ty.FramebufferMB = nt.FramebufferMB
					}
					if ty.MaxInstances == 0 {
						ty.MaxInstances = nt.MaxInstances
					}
				}
			}
			names[t.ID] = t.Name
			g.Types = append(g.Types, ty)
		}
		for _, m := range mdevs {
			if m.Parent != p.Addr {
				continue
			}
			v := VGPU{ID: m.UUID, Kind: "mdev", Type: m.Type, TypeName: names[m.Type]}
			key := "mdev:" + strings.ToLower(m.UUID)
			if d, ok := owner[key]; ok {
				v.Instance, v.DomainName, v.Live = d.UUID, d.Name, live[key]
			} else if owner != nil { // libvirt answered: nobody holds it
				inv.Orphans = append(inv.Orphans, m.UUID)
			}
			if a, ok := nvActive[strings.ToLower(m.UUID)]; ok {
				v.FBUsage, v.Licensed, v.UtilPct, v.GuestDriver = a.FBUsageBytes, a.Licensed, a.UtilizationPct, a.GuestDriverVersion
				v.EncoderPct, v.DecoderPct = a.EncoderPct, a.DecoderPct
				v.Running = true
			}
			g.VGPUs = append(g.VGPUs, v)
		}
	}
	return true
}

// typeReadAttempts bounds how often types retries a failed read of a
// parent's mdev types.
const typeReadAttempts = 3

// types reads a parent's mdev types, retrying a failed read: a type's
// attributes (available_instances) can be read while they are being
// rewritten after an mdev was created or removed (an empty read), and a
// type's devices/ directory can change while it is listed.
func (s *Scanner) types(ctx context.Context, parent pci.Addr) ([]sysfs.MdevType, error) {
	var err error
	for range typeReadAttempts {
		var types []sysfs.MdevType
		if types, err = s.Sysfs.Types(ctx, parent); err == nil {
			return types, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
	}
	return nil, err
}

func (s *Scanner) scanVFIO(ctx context.Context, inv *Inventory, get func(pci.Addr) *GPU, nvmlGPUs map[pci.Addr]gpu.GPU,
	owner map[string]libvirt.Domain, live map[string]bool, fail func(string, error)) {
	pfs, err := s.Sysfs.PFs(ctx)
	if err != nil {
		fail("sysfs", err)
		return
	}
	vfs, err := s.Sysfs.VFs(ctx)
	if err != nil {
		fail("sysfs", err)
		return
	}
	if len(vfs) == 0 {
		return
	}
	byPF := map[pci.Addr][]sysfs.VF{}
	for _, vf := range vfs {
		byPF[vf.PhysFn] = append(byPF[vf.PhysFn], vf)
	}
	pfMeta := map[pci.Addr]sysfs.PF{}
	for _, pf := range pfs {
		pfMeta[pf.Addr] = pf
	}
	pfAddrs := make([]pci.Addr, 0, len(byPF))
	for a := range byPF {
		pfAddrs = append(pfAddrs, a)
	}
	for _, pfAddr := range pfAddrs {
		g := get(pfAddr)
		g.Mode = "vendor_vfio"
		if m, ok := pfMeta[pfAddr]; ok {
			g.Driver, g.DeviceID = m.Driver, m.DeviceID
		}
		ng := nvmlGPUs[pfAddr]
		nvTypes := map[uint32]gpu.VGPUType{}
		for _, t := range ng.SupportedTypes {
			nvTypes[t.ID] = t
		}
		inUse := map[string]int{}
		free := map[string]int{}
		names := map[string]string{}
		var ids []string
		for _, vf := range byPF[pfAddr] {
			info := VF{Addr: vf.Addr, Current: vf.Current, Creatable: []string{}, DeviceID: vf.DeviceID}
			for _, t := range vf.Creatable {
				info.Creatable = append(info.Creatable, t.ID)
				if _, ok := names[t.ID]; !ok {
					ids = append(ids, t.ID)
				}
				names[t.ID] = t.Name
				if vf.Current == "" {
					free[t.ID]++
				}
			}
			g.VFs = append(g.VFs, info)
			if vf.Current == "" {
				continue
			}
			inUse[vf.Current]++
			name := vf.CurrentName
			if n, ok := typeNum(vf.Current); ok && name == "" {
				name = nvTypes[n].Name
			}
			v := VGPU{ID: vf.Addr.String(), Kind: "vf", VF: vf.Addr, Type: vf.Current, TypeName: name}
			key := "pci:" + vf.Addr.String()
			if d, ok := owner[key]; ok {
				v.Instance, v.DomainName, v.Live = d.UUID, d.Name, live[key]
			} else if owner != nil { // libvirt answered: nobody holds it
				inv.Orphans = append(inv.Orphans, vf.Addr.String())
			}
			g.VGPUs = append(g.VGPUs, v)
		}
		// Types: NVML's list when known (it has the ones not creatable now), else what VFs list.
		if len(ng.SupportedTypes) > 0 {
			ids = ids[:0]
			for _, t := range ng.SupportedTypes {
				id := strconv.FormatUint(uint64(t.ID), 10)
				ids = append(ids, id)
				names[id] = t.Name
			}
		}
		for id := range inUse {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		slices.SortFunc(ids, func(a, b string) int { x, _ := typeNum(a); y, _ := typeNum(b); return int(x) - int(y) })
		// In heterogeneous mode every free VF lists each type that fits
		// once more: how many fit is the framebuffer the typed VFs leave.
		var leftMiB uint64
		hetero := ng.Heterogeneous != nil && *ng.Heterogeneous && ng.Memory.Total > 0
		if hetero {
			var used uint64
			for id, k := range inUse {
				if n, ok := typeNum(id); ok {
					used += uint64(k) * nvTypes[n].FramebufferMB
				}
			}
			leftMiB = ng.Memory.Total>>20 - min(used, ng.Memory.Total>>20)
		}
		for _, id := range ids {
			t := Type{ID: id, Name: names[id], InUse: inUse[id], Available: free[id]}
			if n, ok := typeNum(id); ok {
				if nt, ok := nvTypes[n]; ok {
					t.Class, t.FramebufferMB, t.MaxInstances = nt.Class, nt.FramebufferMB, nt.MaxInstances
					if nt.MaxInstances > 0 {
						t.Available = max(0, min(t.Available, nt.MaxInstances-t.InUse))
					}
					if hetero && nt.FramebufferMB > 0 {
						// The driver's list is the word on one more; the
						// framebuffer left caps how many beyond it.
						t.Available = max(min(t.Available, int(leftMiB/nt.FramebufferMB)), min(t.Available, 1))
					}
				}
			}
			g.Types = append(g.Types, t)
		}
	}
}

// health judges a GPU from what NVML says: failed when NVML tells a fault
// (gpu.Fault) or lost the GPU, degraded when NVML lists it but some
// queries fail or it is hot; unknown without NVML.
func health(g *GPU, ng gpu.GPU, nvmlOK bool) {
	if nvmlOK && ng.Fault != nil && ng.Fault.Source == gpu.FaultLost {
		g.Fault = ng.Fault
		g.Health = "failed"
		g.HealthReasons = append(g.HealthReasons, ng.Fault.Reason)
		return
	}
	if !nvmlOK || ng.UUID == "" && ng.Name == "" {
		g.Health = "unknown"
		return
	}
	g.Health = "ok"
	if ng.Fault != nil {
		f := *ng.Fault
		g.Fault = &f
		g.Health = "failed"
		g.HealthReasons = append(g.HealthReasons, f.Reason)
		return
	}
	if ng.TemperatureC >= 90 {
		g.Health = "degraded"
		g.HealthReasons = append(g.HealthReasons, "temperature "+strconv.Itoa(int(ng.TemperatureC))+"C")
	}
	for _, u := range ng.Unavailable {
		if strings.Contains(u, "GPU is lost") {
			g.Health = "failed"
			g.HealthReasons = append(g.HealthReasons, u)
		}
	}
	if ng.License.Unlicensed > 0 && g.Health == "ok" {
		g.Health = "degraded"
		g.HealthReasons = append(g.HealthReasons, strconv.Itoa(ng.License.Unlicensed)+" unlicensed vGPU(s)")
	}
}

// GPUHealth scans and returns one GPU's health ("ok", "degraded", "failed",
// "unknown"); a GPU the host does not have is "unknown".
func (s *Scanner) GPUHealth(ctx context.Context, a pci.Addr) string {
	inv, err := s.Scan(ctx)
	if err != nil {
		return "unknown"
	}
	for _, g := range inv.GPUs {
		if g.Addr == a {
			return g.Health
		}
	}
	return "unknown"
}
