package agent

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/cgroup"
	"github.com/vgpu-bridge/vgpu-bridge/agent/executor"
	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/inventory"
	"github.com/vgpu-bridge/vgpu-bridge/agent/journal"
	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

// domains adapts agent/libvirt to executor.Domains.
type domains struct {
	conn *libvirt.Conn
	hp   libvirt.HotPlugger
}

var _ executor.Domains = domains{}

func hostdevXML(h executor.Hostdev) string {
	if h.IsMdev() {
		return libvirt.MdevHostdevXML(h.MdevUUID)
	}
	return libvirt.PCIHostdevXML(h.PCI)
}

func (d domains) Domain(ctx context.Context, uuid string) (executor.Domain, error) {
	dom, err := d.conn.Domain(ctx, uuid)
	if err != nil {
		return executor.Domain{}, err
	}
	return executorDomain(dom), nil
}

func (d domains) List(ctx context.Context) ([]executor.Domain, error) {
	doms, err := d.conn.Domains(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]executor.Domain, len(doms))
	for i, dom := range doms {
		out[i] = executorDomain(dom)
	}
	return out, nil
}

func executorDomain(dom libvirt.Domain) executor.Domain {
	out := executor.Domain{UUID: dom.UUID, Running: dom.Running()}
	for _, h := range dom.Hostdevs {
		x := executor.Hostdev{Live: h.Live, Config: h.Config}
		switch h.Type {
		case "mdev":
			x.MdevUUID = h.MdevUUID
		case "pci":
			x.PCI = h.Addr
		default:
			continue
		}
		out.Hostdevs = append(out.Hostdevs, x)
	}
	return out
}

func (d domains) DefineHostdev(ctx context.Context, uuid string, h executor.Hostdev) error {
	return d.conn.DefineHostdevXML(ctx, uuid, hostdevXML(h))
}

func (d domains) RemoveHostdevConfig(ctx context.Context, uuid string, h executor.Hostdev) error {
	return d.conn.RemoveHostdevXML(ctx, uuid, hostdevXML(h))
}

func (d domains) AttachLive(ctx context.Context, uuid string, h executor.Hostdev) error {
	return d.hp.AttachLive(ctx, uuid, hostdevXML(h))
}

func (d domains) DetachLive(ctx context.Context, uuid string, h executor.Hostdev) error {
	return d.hp.DetachLive(ctx, uuid, hostdevXML(h))
}

func (d domains) Shutdown(ctx context.Context, uuid string, timeout time.Duration) error {
	return d.conn.Shutdown(ctx, uuid, timeout)
}

func (d domains) Start(ctx context.Context, uuid string) error { return d.conn.Start(ctx, uuid) }

// limiter sets VM limits through libvirt tunables and falls back to the
// cgroup v2 files of the VM's scope when libvirt refuses.
type limiter struct {
	conn *libvirt.Conn
	cg   *cgroup.FS
}

var _ executor.Limiter = limiter{}

// tunables converts cgroup v2 forms ("QUOTA PERIOD" | "max PERIOD", bytes |
// "max") to libvirt tunables.
func tunables(l protocol.LimitParams) (libvirt.Tunables, error) {
	var t libvirt.Tunables
	if l.CPUMax != "" {
		q, p, _ := strings.Cut(l.CPUMax, " ")
		if q == "max" {
			t.CPUQuotaUs = -1
		} else {
			n, err := strconv.ParseInt(q, 10, 64)
			if err != nil {
				return t, err
			}
			t.CPUQuotaUs = n
		}
		if p != "" {
			n, err := strconv.ParseUint(p, 10, 64)
			if err != nil {
				return t, err
			}
			t.CPUPeriodUs = n
		}
	}
	if l.MemoryHigh != "" && l.MemoryHigh != "max" {
		n, err := strconv.ParseUint(l.MemoryHigh, 10, 64)
		if err != nil {
			return t, err
		}
		t.MemoryHighKiB = max(n/1024, 1)
	}
	return t, nil
}

func (l limiter) SetVMLimits(ctx context.Context, uuid string, p protocol.LimitParams) (string, error) {
	t, err := tunables(p)
	if err != nil {
		return "", hosterr.New(hosterr.Invalid, "set vm limits", err)
	}
	// libvirt's soft limit cannot say "max": that goes to the cgroup file.
	if p.MemoryHigh != "max" {
		err = l.conn.SetTunables(ctx, uuid, t)
		if err == nil {
			return "libvirt", nil
		}
		if !hosterr.Is(err, hosterr.Unsupported) && !hosterr.Is(err, hosterr.Internal) {
			return "", err
		}
	}
	if l.cg == nil {
		return "", err
	}
	dom, derr := l.conn.Domain(ctx, uuid)
	if derr != nil {
		return "", derr
	}
	if cerr := l.cg.SetLimits(ctx, dom.Name, p.CPUMax, p.MemoryHigh); cerr != nil {
		return "", cerr
	}
	return "cgroup", nil
}

// reporter turns inventory scans into reports.
type reporter struct {
	scan    *inventory.Scanner
	journal *journal.Journal
}

func (r reporter) Report(ctx context.Context) (protocol.Report, error) {
	inv, err := r.scan.Scan(ctx)
	if err != nil {
		return protocol.Report{}, err
	}
	return ToReport(inv, r.journal), nil
}

// ToReport converts an inventory to the report body; vGPUs whose device
// the journal owns are marked owner "agent", the others "nova".
func ToReport(inv *inventory.Inventory, j *journal.Journal) protocol.Report {
	rep := protocol.Report{V: protocol.Version, Minor: protocol.Minor, Host: inv.Host, Node: inv.Node, AgentVersion: inv.AgentVersion,
		Hypervisor: inv.Hypervisor, GPUs: []protocol.GPU{}, Errors: inv.Errors}
	if len(inv.DriverVersions) > 0 {
		rep.DriverVersion = inv.DriverVersions[0]
	}
	if n, err := strconv.Atoi(strings.TrimPrefix(inv.CgroupVersion, "v")); err == nil {
		rep.CgroupVersion = n
	}
	if !inv.NVML && inv.NVMLError != "" {
		rep.Errors = append(rep.Errors, "nvml: "+inv.NVMLError)
	}
	for _, g := range inv.GPUs {
		pg := protocol.GPU{PCI: g.Addr.String(), UUID: g.UUID, Name: g.Name, VendorVFIO: g.Mode == "vendor_vfio",
			DriverVersion: g.DriverVersion, Health: g.Health, EnabledType: g.EnabledType,
			Types: []protocol.VGPUType{}, Active: []protocol.VGPU{}}
		if pg.Health == "" {
			pg.Health = protocol.HealthUnknown
		}
		if g.Fault != nil {
			pg.Health = protocol.HealthFailed
			pg.Fault = &protocol.GPUFault{Source: g.Fault.Source, Xid: g.Fault.Xid, Reason: g.Fault.Reason}
		}
		for _, t := range g.Types {
			if t.Refused != "" || !t.Allowed && !g.Allowed {
				continue
			}
			pg.Types = append(pg.Types, protocol.VGPUType{ID: t.ID, Name: t.Name, FramebufferMiB: int(t.FramebufferMB),
				MaxInstances: t.MaxInstances, AvailableInstances: t.Available})
		}
		pg.DeviceID = pciID(g.DeviceID)
		for _, vf := range g.VFs {
			if pg.VFDeviceID == "" {
				pg.VFDeviceID = pciID(vf.DeviceID)
			}
			if vf.Current == "" {
				pg.FreeVFs = append(pg.FreeVFs, vf.Addr.String())
			}
		}
		for _, v := range g.VGPUs {
			a := protocol.VGPU{TypeID: v.Type, InstanceUUID: v.Instance, Owner: protocol.OwnerNova, GuestDriver: v.GuestDriver}
			if v.Running {
				util, fb, enc, dec := float64(v.UtilPct), v.FBUsage>>20, float64(v.EncoderPct), float64(v.DecoderPct)
				a.UtilPercent, a.FBUsedMiB, a.EncoderPercent, a.DecoderPercent = &util, &fb, &enc, &dec
			}
			key := journal.MdevKey(v.ID)
			if v.Kind == "vf" {
				a.PCI = v.VF.String()
				key = journal.VFKey(a.PCI)
			} else {
				a.MdevUUID = v.ID
			}
			if j != nil {
				if _, ok := j.Owned(key); ok {
					a.Owner = protocol.OwnerAgent
				}
			}
			pg.Active = append(pg.Active, a)
		}
		if inv.NVML && g.Memory.Total > 0 {
			util := float64(g.Utilization.GPU)
			used, total := g.Memory.Used>>20, g.Memory.Total>>20
			temp := int(g.TemperatureC)
			power := float64(g.PowerMW) / 1000
			pg.UtilPercent, pg.MemoryUsedMiB, pg.MemoryTotalMiB, pg.TemperatureC, pg.PowerW = &util, &used, &total, &temp, &power
		}
		rep.GPUs = append(rep.GPUs, pg)
	}
	return rep
}

// pciID is a sysfs PCI id ("0x2335") as Nova writes product_id: 4 lower
// hex digits; "" when id is not one.
func pciID(id string) string {
	id = strings.ToLower(strings.TrimPrefix(strings.TrimSpace(id), "0x"))
	if len(id) != 4 || strings.Trim(id, "0123456789abcdef") != "" {
		return ""
	}
	return id
}

// healthCache answers GPU health from an inventory scan at most ttl old:
// a scan reads every source (tens of ms) and health changes slowly.
type healthCache struct {
	scan *inventory.Scanner
	ttl  time.Duration

	mu  sync.Mutex
	inv *inventory.Inventory
	at  time.Time
}

var _ executor.Health = (*healthCache)(nil)

func (h *healthCache) GPUHealth(ctx context.Context, a pci.Addr) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inv == nil || time.Since(h.at) > h.ttl {
		inv, err := h.scan.Scan(ctx)
		if err != nil {
			return protocol.HealthUnknown
		}
		h.inv, h.at = inv, time.Now()
	}
	for _, g := range h.inv.GPUs {
		if g.Addr == a {
			return g.Health
		}
	}
	return protocol.HealthUnknown
}
