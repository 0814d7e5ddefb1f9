package executor

import (
	"context"
	"fmt"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/journal"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// Recover finishes the commands a previous run of the agent left in the
// middle (begun, no result), before any new command is taken. A command
// still within its expiry (and every remove_mdev and detach_vgpu, whose
// completion is always safe) is resumed from its first step not done; an
// expired one is rolled back — what it attached is detached, what it
// created is removed, a domain it shut down is started — and answered
// failed with code "interrupted". The results are returned so the caller
// can publish them (the redelivered commands get the same answer).
func (e *Executor) Recover(ctx context.Context) []protocol.Result {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []protocol.Result
	for _, ent := range e.j.Pending() {
		c := ent.Command
		log := e.log.With(logkey.Command, c.ID, logkey.Kind, string(c.Kind))
		var res protocol.Result
		if c.Kind == protocol.RemoveMdev || c.Kind == protocol.DetachVGPU || !c.Expired(e.cfg.Now(), e.cfg.ClockSkew) {
			log.Info("recovery: resuming an interrupted command", "steps_done", len(ent.Steps))
			res = e.resume(ctx, ent)
		} else {
			log.Warn("recovery: rolling back an interrupted command that has expired", "steps_done", len(ent.Steps))
			res = e.rollback(ctx, ent)
		}
		if res.CommandID != "" {
			out = append(out, res)
		}
	}
	return out
}

// rollback undoes what an interrupted, expired command did.
func (e *Executor) rollback(ctx context.Context, ent journal.Entry) protocol.Result {
	c := ent.Command
	var undone []string
	var problems []string
	note := func(what string, err error) {
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", what, err))
			return
		}
		undone = append(undone, what)
	}
	d := e.cfg.Domains
	if c.Kind == protocol.AttachVGPU {
		var p protocol.AttachParams
		if err := c.DecodeParams(&p); err == nil {
			dev := Hostdev{MdevUUID: p.MdevUUID}
			if p.VendorVFIO {
				if a, err := pci.Parse(p.ParentPCI); err == nil {
					dev = Hostdev{PCI: a}
				}
			}
			_, attached := ent.Done(stepAttached)
			_, defined := ent.Done(stepDefined)
			if attached {
				note("detach live "+dev.String(), ignoreNotFound(d.DetachLive(ctx, c.InstanceUUID, dev)))
			}
			if attached || defined {
				note("remove from config "+dev.String(), d.RemoveHostdevConfig(ctx, c.InstanceUUID, dev))
			}
		}
	}
	if s, ok := ent.Done(stepShutdown); ok && s.Data == dataRunning {
		if _, started := ent.Done(stepStarted); !started {
			note("start domain "+c.InstanceUUID, d.Start(ctx, c.InstanceUUID))
		}
	}
	// Devices this command created (owned with its id), recorded as a
	// step or not (a crash between owning and the step record).
	for _, dev := range e.j.Devices() {
		if dev.CommandID != c.ID {
			continue
		}
		switch dev.Kind {
		case journal.KindMdev:
			err := e.notInUse(ctx, dev.UUID) // a detach above that failed leaves it in the guest
			if err == nil {
				err = ignoreNotFound(e.cfg.Sysfs.RemoveMdev(ctx, dev.UUID))
			}
			note("remove mdev "+dev.UUID, err)
		case journal.KindVF:
			if a, err := pci.Parse(dev.Parent); err == nil {
				note("clear vf "+dev.Parent, e.cfg.Sysfs.SetVFType(ctx, a, "0"))
			}
		}
		if len(problems) == 0 {
			_ = e.j.Release(dev.Key())
		}
	}
	res := protocol.NewResult(&c, e.cfg.Host, protocol.Failed)
	res.Code = protocol.CodeInterrupted
	res.Message = "the agent stopped in the middle of the command and it expired before the agent was back; rolled back"
	res.Remediation = "Re-issue the command if it is still wanted."
	det := map[string]any{"steps_done": len(ent.Steps), "rolled_back": undone}
	if len(problems) > 0 {
		det["rollback_problems"] = problems
		res.Message += " (partly: see details)"
	}
	res.Details = mustJSON(det)
	return e.finish(c, res)
}

func ignoreNotFound(err error) error {
	if hosterr.Is(err, hosterr.NotFound) {
		return nil
	}
	return err
}

// Reconciled is what Reconcile did.
type Reconciled struct {
	Present   []string `json:"present"`   // owned and found
	Recreated []string `json:"recreated"` // owned, missing, created again
	Failed    []string `json:"failed"`    // owned, missing, could not be recreated
	Skipped   []string `json:"skipped"`   // owned, no longer allowed or in conflict: left alone
}

// Reconcile is the reboot recovery: every mdev and VF type the journal owns
// that is missing on the host is created again (same UUID, parent and
// type), so the instances using them can start. Devices that are no longer
// on the allow-list, or whose VF now has another type, are left alone and
// listed as skipped. Run it after Recover.
func (e *Executor) Reconcile(ctx context.Context) (Reconciled, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out Reconciled
	devs := e.j.Devices()
	if len(devs) == 0 {
		return out, nil
	}
	mdevs, err := e.cfg.Sysfs.Mdevs(ctx)
	if err != nil {
		return out, err
	}
	have := map[string]bool{}
	for _, m := range mdevs {
		have[journal.MdevKey(m.UUID)] = true
	}
	var vfType map[pci.Addr]string
	for _, d := range devs {
		parent, perr := pci.Parse(d.Parent)
		log := e.log.With(logkey.Device, d.Key())
		switch {
		case perr != nil:
			out.Skipped = append(out.Skipped, d.Key())
			continue
		case !e.cfg.Allow.AllowType(parent, d.Type):
			log.Warn("reconcile: owned device no longer on the allow-list; left alone")
			out.Skipped = append(out.Skipped, d.Key())
			continue
		}
		switch d.Kind {
		case journal.KindMdev:
			if have[d.Key()] {
				out.Present = append(out.Present, d.Key())
				continue
			}
			if err := e.cfg.Sysfs.CreateMdev(ctx, parent, d.Type, d.UUID); err != nil {
				log.Error("reconcile: cannot recreate mdev", logkey.Err, err)
				out.Failed = append(out.Failed, d.Key())
				continue
			}
			log.Info("reconcile: recreated mdev", "parent", d.Parent, "type", d.Type)
			out.Recreated = append(out.Recreated, d.Key())
		case journal.KindVF:
			if vfType == nil {
				vfs, err := e.cfg.Sysfs.VFs(ctx)
				if err != nil {
					return out, err
				}
				vfType = map[pci.Addr]string{}
				for _, v := range vfs {
					vfType[v.Addr] = v.Current
				}
			}
			cur, ok := vfType[parent]
			switch {
			case !ok:
				log.Error("reconcile: VF not found")
				out.Failed = append(out.Failed, d.Key())
			case cur == d.Type:
				out.Present = append(out.Present, d.Key())
			case cur != "":
				log.Warn("reconcile: VF has another type now; left alone", "current", cur)
				out.Skipped = append(out.Skipped, d.Key())
			default:
				if err := e.cfg.Sysfs.SetVFType(ctx, parent, d.Type); err != nil {
					log.Error("reconcile: cannot set VF type", logkey.Err, err)
					out.Failed = append(out.Failed, d.Key())
					continue
				}
				log.Info("reconcile: set VF type again", "type", d.Type)
				out.Recreated = append(out.Recreated, d.Key())
			}
		}
	}
	if len(out.Recreated) > 0 {
		e.signalChange()
	}
	return out, nil
}
