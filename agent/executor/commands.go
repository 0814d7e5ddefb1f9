package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	agpu "github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/journal"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// Step names (they appear in journals and in result details).
const (
	stepMdevCreated = "mdev_created"
	stepVFTypeSet   = "vf_type_set"
	stepRemoved     = "removed"
	stepReleased    = "released"
	stepAttached    = "attached"
	stepDetached    = "detached"
	stepDefined     = "defined"
	stepUndefined   = "undefined"
	stepShutdown    = "shutdown"
	stepStarted     = "started"
	stepApplied     = "applied"
	stepParamsSet   = "params_set"
)

// Step data.
const (
	dataCreated = "created" // this command created the device
	dataExisted = "existed" // the device was there already
	dataRunning = "running" // the domain ran before a cold change
	dataShutoff = "shutoff"
)

func parseAddr(field, s string) (pci.Addr, error) {
	a, err := pci.Parse(s)
	if err != nil {
		return pci.Addr{}, refuse(protocol.CodeInvalidCommand, "%s: %v", field, err)
	}
	return a, nil
}

func needInstance(c protocol.Command) error {
	if c.InstanceUUID == "" {
		return refuse(protocol.CodeInvalidCommand, "%s needs instance_uuid (the libvirt domain)", c.Kind)
	}
	return nil
}

// prepare decodes a command's params, checks what can be checked before
// anything is done (allow-list, required fields) and returns its handler.
func (e *Executor) prepare(c protocol.Command) (handler, error) {
	switch c.Kind {
	case protocol.CreateMdev, protocol.RemoveMdev:
		var p protocol.MdevParams
		if err := c.DecodeParams(&p); err != nil {
			return nil, err
		}
		var parent pci.Addr
		if p.ParentPCI != "" {
			var err error
			if parent, err = parseAddr("parent_pci", p.ParentPCI); err != nil {
				return nil, err
			}
		}
		if c.Kind == protocol.CreateMdev {
			if !e.cfg.Allow.AllowType(parent, p.TypeID) {
				return nil, refuse(protocol.CodeNotAllowed, "type %s on %s is not on the agent's allow-list", p.TypeID, parent)
			}
			return func(ctx context.Context, r *run) (any, error) {
				if p.VendorVFIO {
					_, err := e.ensureVF(ctx, r, parent, p.TypeID, p.MdevUUID, true)
					return map[string]any{"vf": parent.String(), "type_id": p.TypeID}, err
				}
				_, err := e.ensureMdev(ctx, r, parent, p.TypeID, p.MdevUUID, true)
				return map[string]any{"mdev_uuid": p.MdevUUID, "parent_pci": parent.String(), "type_id": p.TypeID}, err
			}, nil
		}
		return func(ctx context.Context, r *run) (any, error) {
			if p.VendorVFIO {
				return nil, e.removeVF(ctx, r, parent, p.MdevUUID)
			}
			return nil, e.removeMdev(ctx, r, p.MdevUUID)
		}, nil

	case protocol.AttachVGPU, protocol.DetachVGPU:
		var p protocol.AttachParams
		if err := c.DecodeParams(&p); err != nil {
			return nil, err
		}
		if err := needInstance(c); err != nil {
			return nil, err
		}
		dev := Hostdev{MdevUUID: p.MdevUUID}
		var parent pci.Addr
		if p.ParentPCI != "" {
			var err error
			if parent, err = parseAddr("parent_pci", p.ParentPCI); err != nil {
				return nil, err
			}
		}
		if p.VendorVFIO {
			dev = Hostdev{PCI: parent}
		}
		if c.Kind == protocol.AttachVGPU && p.TypeID != "" && !e.cfg.Allow.AllowType(parent, p.TypeID) {
			return nil, refuse(protocol.CodeNotAllowed, "type %s on %s is not on the agent's allow-list", p.TypeID, parent)
		}
		timeout := e.cfg.ColdShutdownTimeout
		if p.ShutdownTimeoutSeconds > 0 {
			timeout = time.Duration(p.ShutdownTimeoutSeconds) * time.Second
		}
		if c.Kind == protocol.DetachVGPU {
			return func(ctx context.Context, r *run) (any, error) {
				if p.VendorVFIO && p.MdevUUID != "" && !r.done(stepDetached) {
					// The VF went to a later vGPU since: this detach is late,
					// and its vGPU is gone already.
					if d, ok := e.j.Owned(journal.VFKey(parent.String())); ok && d.UUID != "" && !strings.EqualFold(d.UUID, p.MdevUUID) {
						return map[string]any{"device": dev.String(), "mode": p.Mode, "skipped": "vf owned by vGPU " + d.UUID}, nil
					}
				}
				return map[string]any{"device": dev.String(), "mode": p.Mode},
					e.detach(ctx, r, c.InstanceUUID, dev, p.Mode, timeout)
			}, nil
		}
		return func(ctx context.Context, r *run) (any, error) {
			out := map[string]any{"device": dev.String(), "mode": p.Mode}
			if p.FrameRateLimit != nil {
				out["vgpu_params"] = protocol.VGPUParams(*p.FrameRateLimit)
			}
			return out, e.attachVGPU(ctx, r, p, parent, dev, timeout)
		}, nil

	case protocol.SetVGPUScheduler:
		var p protocol.SchedulerParams
		if err := c.DecodeParams(&p); err != nil {
			return nil, err
		}
		gpu, err := e.tunable(p.GPUPCI)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, r *run) (any, error) {
			out := map[string]any{"gpu_pci": gpu.String(), "policy": p.Policy, "timeslice_us": p.TimesliceUs}
			return tuned(r, out, func() (agpu.Applied, error) {
				if e.cfg.GPUs == nil {
					return agpu.Applied{}, hosterr.Errorf(hosterr.NVMLUnavailable, "set vgpu scheduler", "no NVML backend")
				}
				return e.cfg.GPUs.SetVGPUScheduler(ctx, gpu, p.Policy, p.TimesliceUs)
			})
		}, nil

	case protocol.SetClocks, protocol.ResetClocks:
		var p protocol.ClockParams
		if err := c.DecodeParams(&p); err != nil {
			return nil, err
		}
		gpu, err := e.tunable(p.GPUPCI)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, r *run) (any, error) {
			out := map[string]any{"gpu_pci": gpu.String()}
			if c.Kind == protocol.SetClocks {
				out["memory_mhz"], out["sm_mhz"] = p.MemoryMHz, p.SMMHz
			}
			return tuned(r, out, func() (agpu.Applied, error) {
				if e.cfg.GPUs == nil {
					return agpu.Applied{}, hosterr.Errorf(hosterr.NVMLUnavailable, string(c.Kind), "no NVML backend")
				}
				if c.Kind == protocol.ResetClocks {
					return e.cfg.GPUs.ResetApplicationClocks(ctx, gpu)
				}
				return e.cfg.GPUs.SetApplicationClocks(ctx, gpu, p.MemoryMHz, p.SMMHz)
			})
		}, nil

	case protocol.SetVMLimits:
		var p protocol.LimitParams
		if err := c.DecodeParams(&p); err != nil {
			return nil, err
		}
		if err := needInstance(c); err != nil {
			return nil, err
		}
		return func(ctx context.Context, r *run) (any, error) {
			how, err := r.step(stepApplied, func() (string, error) {
				if e.cfg.Limiter == nil {
					return "", hosterr.Errorf(hosterr.Unsupported, "set vm limits", "no limiter configured")
				}
				return e.cfg.Limiter.SetVMLimits(ctx, c.InstanceUUID, p)
			})
			return map[string]any{"cpu_max": p.CPUMax, "memory_high": p.MemoryHigh, "via": how}, err
		}, nil

	case protocol.VerifyVGPU:
		var p protocol.VerifyParams
		if err := c.DecodeParams(&p); err != nil {
			return nil, err
		}
		if err := needInstance(c); err != nil {
			return nil, err
		}
		return func(ctx context.Context, r *run) (any, error) { return e.verify(ctx, c.InstanceUUID, p) }, nil

	case protocol.CollectDiagnostics:
		var p protocol.DiagnosticsParams
		if err := c.DecodeParams(&p); err != nil {
			return nil, err
		}
		if p.Bundle {
			return func(ctx context.Context, r *run) (any, error) {
				if e.cfg.Bundler == nil {
					return nil, hosterr.Errorf(hosterr.Unsupported, "collect diagnostics bundle", "no bundler configured")
				}
				b, err := e.cfg.Bundler.Bundle(ctx, c.InstanceUUID, p.Checks)
				if err != nil {
					return nil, err
				}
				return map[string]any{"bundle": b.Bundle, "bundle_sha256": b.BundleSHA256, "manifest": b.Manifest}, nil
			}, nil
		}
		return func(ctx context.Context, r *run) (any, error) {
			if e.cfg.Diagnoser == nil {
				return nil, hosterr.Errorf(hosterr.Unsupported, "collect diagnostics", "no diagnoser configured")
			}
			raw, err := e.cfg.Diagnoser.Diagnose(ctx, p.Checks)
			if err != nil {
				return nil, err
			}
			return map[string]any{"diagnostics": raw}, nil
		}, nil

	case protocol.UpgradeDriver:
		var p protocol.UpgradeParams
		if err := c.DecodeParams(&p); err != nil {
			return nil, err
		}
		if len(e.cfg.UpgradeCommand) == 0 || e.cfg.UpgradeCommand[0] == "" {
			return nil, refuse(protocol.CodeNotConfigured,
				"this agent has no driver-upgrade command ([DEFAULT] driver_upgrade_command is empty)")
		}
		return func(ctx context.Context, r *run) (any, error) { return e.upgradeDriver(ctx, r, p) }, nil

	case protocol.RetypeGPUs:
		var p protocol.RetypeParams
		if err := c.DecodeParams(&p); err != nil {
			return nil, err
		}
		if len(e.cfg.RetypeCommand) == 0 || e.cfg.RetypeCommand[0] == "" {
			return nil, refuse(protocol.CodeNotConfigured,
				"this agent has no re-type command ([DEFAULT] gpu_retype_command is empty)")
		}
		return func(ctx context.Context, r *run) (any, error) { return e.retypeGPUs(ctx, r, p) }, nil
	}
	return nil, refuse(protocol.CodeInvalidCommand, "kind %q is not handled", c.Kind)
}

func (e *Executor) tunable(s string) (pci.Addr, error) {
	gpu, err := parseAddr("gpu_pci", s)
	if err != nil {
		return gpu, err
	}
	if !e.cfg.Allow.AllowGPU(gpu) {
		return gpu, refuse(protocol.CodeNotAllowed, "GPU %s is not on the agent's allow-list", gpu)
	}
	return gpu, nil
}

func (e *Executor) findMdev(ctx context.Context, uuid string) (sysfs.Mdev, bool, error) {
	ms, err := e.cfg.Sysfs.Mdevs(ctx)
	if err != nil {
		return sysfs.Mdev{}, false, err
	}
	for _, m := range ms {
		if equalFoldUUID(m.UUID, uuid) {
			return m, true, nil
		}
	}
	return sysfs.Mdev{}, false, nil
}

func (e *Executor) findVF(ctx context.Context, a pci.Addr) (sysfs.VF, error) {
	vfs, err := e.cfg.Sysfs.VFs(ctx)
	if err != nil {
		return sysfs.VF{}, err
	}
	for _, v := range vfs {
		if v.Addr == a {
			return v, nil
		}
	}
	return sysfs.VF{}, hosterr.Errorf(hosterr.NotFound, "find vf "+a.String(), "no vendor-VFIO VF at %s", a)
}

// ensureMdev makes the mdev exist (step mdev_created). The journal owns it
// before the kernel is asked, so a crash in between leaves an intent that
// restart completes or rolls back. strict (create_mdev) refuses an mdev
// that exists and is not the agent's.
func (e *Executor) ensureMdev(ctx context.Context, r *run, parent pci.Addr, typeID, uuid string, strict bool) (string, error) {
	return r.step(stepMdevCreated, func() (string, error) {
		op := fmt.Sprintf("create mdev %s on %s/%s", uuid, parent, typeID)
		key := journal.MdevKey(uuid)
		cur, found, err := e.findMdev(ctx, uuid)
		if err != nil {
			return "", err
		}
		owned, isOwned := e.j.Owned(key)
		if found {
			switch {
			case cur.Parent != parent || cur.Type != typeID:
				return "", hosterr.Errorf(hosterr.Exists, op, "mdev exists as %s/%s", cur.Parent, cur.Type)
			case isOwned && owned.CommandID == r.c.ID:
				return dataCreated, nil // created before a crash
			case strict && !isOwned:
				return "", hosterr.Errorf(hosterr.Exists, op, "mdev exists and is not the agent's (Nova's?)")
			}
			return dataExisted, nil
		}
		if err := e.refuseMIGMdev(ctx, op, parent, typeID); err != nil {
			return "", err
		}
		if !isOwned {
			owned = journal.Device{Kind: journal.KindMdev, UUID: uuid, Parent: parent.String(), Type: typeID, CommandID: r.c.ID}
			if err := e.j.Own(owned); err != nil {
				return "", hosterr.New(hosterr.Internal, "journal", err)
			}
		}
		if err := e.cfg.Sysfs.CreateMdev(ctx, parent, typeID, uuid); err != nil {
			if owned.CommandID == r.c.ID {
				_ = e.j.Release(key)
			}
			return "", err
		}
		if owned.CommandID != r.c.ID {
			return dataExisted, nil // recreated one the journal already owned
		}
		return dataCreated, nil
	})
}

// refuseMIGMdev refuses to create an mdev of a MIG-backed type: its GPU
// instance would have to exist first, and the agent makes none. A parent
// whose types cannot be listed is left to the kernel to refuse.
func (e *Executor) refuseMIGMdev(ctx context.Context, op string, parent pci.Addr, typeID string) error {
	types, err := e.cfg.Sysfs.Types(ctx, parent)
	if err != nil {
		return nil
	}
	for _, t := range types {
		if t.ID == typeID && sysfs.MIGBacked(t.Name) {
			return hosterr.Errorf(hosterr.Unsupported, op, "%s (%s)", sysfs.MIGRefusal, t.Name)
		}
	}
	return nil
}

// ensureVF sets a vendor-VFIO VF's vGPU type (step vf_type_set).
//
// owner, when given, names the vGPU (the bridge's attachment id) the type
// is set for; the journal keeps it so that a late release of an earlier
// owner of the same VF never clears it (removeVF).
func (e *Executor) ensureVF(ctx context.Context, r *run, vf pci.Addr, typeID, owner string, strict bool) (string, error) {
	return r.step(stepVFTypeSet, func() (string, error) {
		op := fmt.Sprintf("set vgpu type %s on vf %s", typeID, vf)
		key := journal.VFKey(vf.String())
		cur, err := e.findVF(ctx, vf)
		if err != nil {
			return "", err
		}
		owned, isOwned := e.j.Owned(key)
		if cur.Current != "" {
			switch {
			case cur.Current != typeID:
				return "", hosterr.Errorf(hosterr.Exists, op, "vf has vgpu type %s", cur.Current)
			case isOwned && owned.CommandID == r.c.ID:
				return dataCreated, nil
			case strict && !isOwned:
				return "", hosterr.Errorf(hosterr.Exists, op, "vf type is set and is not the agent's (Nova's?)")
			}
			return dataExisted, nil
		}
		for _, t := range cur.Creatable {
			if t.ID == typeID && sysfs.MIGBacked(t.Name) {
				return "", hosterr.Errorf(hosterr.Unsupported, op, "%s (%s)", sysfs.MIGRefusal, t.Name)
			}
		}
		if !isOwned {
			owned = journal.Device{Kind: journal.KindVF, UUID: owner, Parent: vf.String(), Type: typeID, CommandID: r.c.ID}
			if err := e.j.Own(owned); err != nil {
				return "", hosterr.New(hosterr.Internal, "journal", err)
			}
		}
		if err := e.cfg.Sysfs.SetVFType(ctx, vf, typeID); err != nil {
			if owned.CommandID == r.c.ID {
				_ = e.j.Release(key)
			}
			return "", err
		}
		if owned.CommandID != r.c.ID {
			return dataExisted, nil
		}
		return dataCreated, nil
	})
}

// removeMdev removes an mdev the journal owns, then releases it.
func (e *Executor) removeMdev(ctx context.Context, r *run, uuid string) error {
	key := journal.MdevKey(uuid)
	if !r.done(stepRemoved) {
		if _, ok := e.j.Owned(key); !ok {
			return refuse(protocol.CodeNotOwned, "mdev %s is not in the agent's journal; it is never removed by the agent", uuid)
		}
	}
	if _, err := r.step(stepRemoved, func() (string, error) {
		if err := e.notInUse(ctx, uuid); err != nil {
			return "", err
		}
		if err := e.cfg.Sysfs.RemoveMdev(ctx, uuid); err != nil && !hosterr.Is(err, hosterr.NotFound) {
			return "", err
		}
		return "", nil
	}); err != nil {
		return err
	}
	_, err := r.step(stepReleased, func() (string, error) { return "", e.j.Release(key) })
	return err
}

// notInUse refuses (code in_use) to remove an mdev that a running domain
// still has in its live definition. The kernel does not refuse it: the
// write to the mdev's remove file waits until QEMU lets the device go
// (vfio waits for its last user; after a signal, uninterruptibly), which a
// guest never does by itself, so the agent would hang with the command,
// and the guest's device would be half torn down. The bridge detaches the
// vGPU first (detach_vgpu); an mdev held by a domain the bridge does not
// know stays until that domain lets it go.
func (e *Executor) notInUse(ctx context.Context, uuid string) error {
	doms, err := e.cfg.Domains.List(ctx)
	if err != nil {
		return err
	}
	var users []string
	for _, d := range doms {
		if h, ok := d.Has(Hostdev{MdevUUID: uuid}); ok && h.Live && d.Running {
			users = append(users, d.UUID)
		}
	}
	if len(users) > 0 {
		return refuse(string(hosterr.InUse), "mdev %s is attached to running domain %s: detach it (detach_vgpu) before removing it",
			uuid, strings.Join(users, ", "))
	}
	return nil
}

// removeVF clears a VF type the journal owns, then releases it. When
// owner is given and the journal holds the VF for another owner (the VF
// was released and typed again for a later vGPU), it is refused: a late
// or repeated release never clears a later owner's vGPU.
func (e *Executor) removeVF(ctx context.Context, r *run, vf pci.Addr, owner string) error {
	key := journal.VFKey(vf.String())
	if !r.done(stepRemoved) {
		d, ok := e.j.Owned(key)
		if !ok {
			return refuse(protocol.CodeNotOwned, "vf %s type is not in the agent's journal; it is never cleared by the agent", vf)
		}
		if owner != "" && d.UUID != "" && !strings.EqualFold(d.UUID, owner) {
			return refuse(protocol.CodeNotOwned, "vf %s is typed for vGPU %s now, not %s; it is left alone", vf, d.UUID, owner)
		}
	}
	if _, err := r.step(stepRemoved, func() (string, error) {
		return "", e.cfg.Sysfs.SetVFType(ctx, vf, "0")
	}); err != nil {
		return err
	}
	_, err := r.step(stepReleased, func() (string, error) { return "", e.j.Release(key) })
	return err
}

// attachVGPU creates the device when asked to and attaches it. When the
// attach fails, a device this command created is removed again.
func (e *Executor) attachVGPU(ctx context.Context, r *run, p protocol.AttachParams, parent pci.Addr, dev Hostdev, timeout time.Duration) error {
	created := ""
	var err error
	switch {
	case p.VendorVFIO && p.TypeID != "":
		created, err = e.ensureVF(ctx, r, parent, p.TypeID, p.MdevUUID, false)
	case p.VendorVFIO:
		if _, err = e.findVF(ctx, parent); err != nil {
			return err
		}
	case p.TypeID != "":
		created, err = e.ensureMdev(ctx, r, parent, p.TypeID, p.MdevUUID, false)
	default:
		var found bool
		if _, found, err = e.findMdev(ctx, p.MdevUUID); err == nil && !found {
			err = hosterr.Errorf(hosterr.NotFound, "attach "+dev.String(), "mdev does not exist; give parent_pci and type_id to create it")
		}
	}
	if err != nil {
		return err
	}
	if p.FrameRateLimit != nil {
		// Before the attach: the vGPU manager reads vgpu_params when the
		// VM opens the device.
		params := protocol.VGPUParams(*p.FrameRateLimit)
		_, err = r.step(stepParamsSet, func() (string, error) {
			return params, e.cfg.Sysfs.SetVGPUParams(ctx, dev.MdevUUID, dev.PCI, params)
		})
	}
	if err == nil {
		err = e.attach(ctx, r, r.c.InstanceUUID, dev, p.Mode, timeout)
	}
	if err != nil && created == dataCreated && ctx.Err() == nil {
		e.log.Warn("attach failed; removing the device this command created", logkey.Command, r.c.ID, logkey.Device, dev.String(), logkey.Err, err)
		if rerr := e.undoCreate(ctx, dev); rerr != nil {
			e.log.Error("rollback failed", logkey.Command, r.c.ID, logkey.Err, rerr)
		}
	}
	return err
}

// undoCreate removes a device the agent created and releases it.
func (e *Executor) undoCreate(ctx context.Context, dev Hostdev) error {
	if dev.IsMdev() {
		if err := e.notInUse(ctx, dev.MdevUUID); err != nil {
			return err
		}
		if err := e.cfg.Sysfs.RemoveMdev(ctx, dev.MdevUUID); err != nil && !hosterr.Is(err, hosterr.NotFound) {
			return err
		}
		return e.j.Release(journal.MdevKey(dev.MdevUUID))
	}
	if err := e.cfg.Sysfs.SetVFType(ctx, dev.PCI, "0"); err != nil {
		return err
	}
	return e.j.Release(journal.VFKey(dev.PCI.String()))
}

// attach attaches dev to the domain in mode.
func (e *Executor) attach(ctx context.Context, r *run, dom string, dev Hostdev, mode string, timeout time.Duration) error {
	d := e.cfg.Domains
	switch mode {
	case protocol.ModeLive:
		_, err := r.step(stepAttached, func() (string, error) {
			cur, err := d.Domain(ctx, dom)
			if err != nil {
				return "", err
			}
			if h, ok := cur.Has(dev); ok && h.Live {
				return dataExisted, nil
			}
			if !cur.Running {
				return "", hosterr.Errorf(hosterr.DomainNotRunning, "attach live "+dev.String(), "domain %s is not running", dom)
			}
			return "", d.AttachLive(ctx, dom, dev)
		})
		return err
	case protocol.ModeConfig:
		_, err := r.step(stepDefined, func() (string, error) { return "", d.DefineHostdev(ctx, dom, dev) })
		return err
	}
	return e.cold(ctx, r, dom, timeout, stepDefined, func() error { return d.DefineHostdev(ctx, dom, dev) })
}

// detach detaches dev from the domain in mode.
func (e *Executor) detach(ctx context.Context, r *run, dom string, dev Hostdev, mode string, timeout time.Duration) error {
	d := e.cfg.Domains
	switch mode {
	case protocol.ModeLive:
		_, err := r.step(stepDetached, func() (string, error) {
			cur, err := d.Domain(ctx, dom)
			if hosterr.Is(err, hosterr.NotFound) {
				// No such domain (Nova destroyed the guest an evacuation
				// left on this host): nothing holds the device.
				return dataExisted, nil
			}
			if err != nil {
				return "", err
			}
			h, ok := cur.Has(dev)
			switch {
			case !ok:
				return dataExisted, nil // already gone
			case !h.Live:
				return "", d.RemoveHostdevConfig(ctx, dom, dev)
			case !cur.Running:
				return "", hosterr.Errorf(hosterr.DomainNotRunning, "detach live "+dev.String(), "domain %s is not running", dom)
			}
			return "", d.DetachLive(ctx, dom, dev)
		})
		return err
	case protocol.ModeConfig:
		_, err := r.step(stepUndefined, func() (string, error) { return "", d.RemoveHostdevConfig(ctx, dom, dev) })
		return err
	}
	return e.cold(ctx, r, dom, timeout, stepUndefined, func() error { return d.RemoveHostdevConfig(ctx, dom, dev) })
}

// cold is a cold change: graceful shutdown (bounded) → change the config →
// start again, when the domain ran before. When the change fails after the
// shutdown, the domain is started again unchanged.
func (e *Executor) cold(ctx context.Context, r *run, dom string, timeout time.Duration, name string, change func() error) error {
	d := e.cfg.Domains
	was, err := r.step(stepShutdown, func() (string, error) {
		cur, err := d.Domain(ctx, dom)
		if err != nil {
			return "", err
		}
		if !cur.Running {
			return dataShutoff, nil
		}
		if err := d.Shutdown(ctx, dom, timeout); err != nil {
			return "", err
		}
		return dataRunning, nil
	})
	if err != nil {
		return err
	}
	if _, err := r.step(name, func() (string, error) { return "", change() }); err != nil {
		if was == dataRunning && ctx.Err() == nil {
			if serr := d.Start(ctx, dom); serr != nil {
				e.log.Error("cold change failed and the domain did not start again", logkey.Command, r.c.ID, logkey.Err, serr)
			}
		}
		return err
	}
	if was != dataRunning {
		return nil
	}
	_, err = r.step(stepStarted, func() (string, error) { return "", d.Start(ctx, dom) })
	return err
}

// verifiedVGPU is one vGPU verify_vgpu found.
type verifiedVGPU struct {
	Device  string `json:"device"`
	TypeID  string `json:"type_id"`
	Parent  string `json:"parent,omitempty"`
	Live    bool   `json:"live"`
	Health  string `json:"health"`
	Problem string `json:"problem,omitempty"`
}

// verify checks the domain has the expected healthy vGPUs.
func (e *Executor) verify(ctx context.Context, dom string, p protocol.VerifyParams) (any, error) {
	want := max(p.Count, 1)
	cur, err := e.cfg.Domains.Domain(ctx, dom)
	if err != nil {
		return nil, err
	}
	mdevs, err := e.cfg.Sysfs.Mdevs(ctx)
	if err != nil {
		return nil, err
	}
	var vfs []sysfs.VF
	var found []verifiedVGPU
	healthy, sawNamed := 0, p.MdevUUID == ""
	for _, h := range cur.Hostdevs {
		if cur.Running && !h.Live {
			continue // only in the config: not in the running guest yet
		}
		v := verifiedVGPU{Device: h.String(), Live: h.Live, Health: protocol.HealthUnknown}
		var parent pci.Addr
		exists := false
		if h.IsMdev() {
			for _, m := range mdevs {
				if equalFoldUUID(m.UUID, h.MdevUUID) {
					v.TypeID, parent, exists = m.Type, m.Parent, true
				}
			}
		} else {
			if vfs == nil {
				if vfs, err = e.cfg.Sysfs.VFs(ctx); err != nil {
					return nil, err
				}
			}
			isVF := false
			for _, f := range vfs {
				if f.Addr == h.PCI {
					isVF = true
					v.TypeID, parent, exists = f.Current, f.PhysFn, f.Current != ""
				}
			}
			if !isVF {
				continue // a passed-through PCI device, not a vGPU
			}
		}
		if !parent.IsZero() {
			v.Parent = parent.String()
		}
		switch {
		case !exists:
			v.Problem, v.Health = "device missing on the host", protocol.HealthFailed
		case p.TypeID != "" && v.TypeID != p.TypeID:
			v.Problem = fmt.Sprintf("type %s, want %s", v.TypeID, p.TypeID)
		}
		if exists && e.cfg.Health != nil && !parent.IsZero() {
			v.Health = e.cfg.Health.GPUHealth(ctx, parent)
		} else if exists {
			v.Health = protocol.HealthOK
		}
		if v.Problem == "" && (v.Health == protocol.HealthOK || v.Health == protocol.HealthUnknown) {
			healthy++
			if equalFoldUUID(h.MdevUUID, p.MdevUUID) {
				sawNamed = true
			}
		}
		found = append(found, v)
	}
	details := map[string]any{"vgpus": found, "healthy": healthy, "want": want, "running": cur.Running}
	if healthy < want || !sawNamed {
		return details, codedError{code: protocol.CodeVerifyFailed,
			msg: fmt.Sprintf("domain %s has %d healthy vGPU(s) of type %q, want %d", dom, healthy, p.TypeID, want),
			remediation: "Check the domain's hostdevs (virsh dumpxml), the mdevs (`vgpu-agent inventory`) and the GPU " +
				"(`vgpu-agent diagnose`); re-attach or re-create the vGPU."}
	}
	return details, nil
}

// tuned runs a tuning call as the command's one step and puts what NVML
// read back after it in the result's details: "applied" (the scheduler or
// the application clocks, and whether they changed) and "verified" (the
// read-back matches what was asked). The step keeps the read-back, so a
// duplicate delivery answers the same.
func tuned(r *run, out map[string]any, fn func() (agpu.Applied, error)) (any, error) {
	data, err := r.step(stepApplied, func() (string, error) {
		a, err := fn()
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(a)
		return string(b), err
	})
	if err != nil {
		return out, err
	}
	var a agpu.Applied
	if data != "" && json.Unmarshal([]byte(data), &a) == nil {
		out["applied"], out["verified"] = a, true
	}
	return out, nil
}
