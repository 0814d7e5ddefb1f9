package agent

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/vgpu-bridge/vgpu-bridge/agent/executor"
	"github.com/vgpu-bridge/vgpu-bridge/agent/journal"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// RestoreDevices is the part of the reboot recovery that needs no
// libvirtd: the mdevs and VF vGPU types the journal owns and the host
// lacks are created again (same UUID, parent and type), through sysfs
// alone, and the agent exits. It must run before libvirtd starts guests
// (its autostart domains, libvirt-guests, Nova's resume of guests at boot):
// a guest whose mdev is missing does not start. vgpu-agent serve cannot be
// ordered so — it needs libvirtd, and it is ready only once RabbitMQ is
// reached — hence vgpu-agent-restore.service, ordered before libvirtd,
// runs this (`vgpu-agent restore-devices`); serve's own reconcile then
// finds the devices present. The journal's lock keeps it from running
// while an agent does.
func RestoreDevices(ctx context.Context, v *conf.Values, log *slog.Logger) (executor.Reconciled, error) {
	s, err := hostSettingsFrom(v)
	if err != nil {
		return executor.Reconciled{}, err
	}
	h := sysfs.New(s.SysfsRoot)
	s.Allow.PhysFn = physFn(h)
	j, err := journal.Open(JournalPath(v), journal.OptionsFrom(v))
	if err != nil {
		return executor.Reconciled{}, err
	}
	defer j.Close()
	ex, err := executor.New(executor.Config{Host: Host(v), Journal: j, Sysfs: h, Domains: noLibvirt{}, Allow: s.Allow, Log: log})
	if err != nil {
		return executor.Reconciled{}, err
	}
	rec, err := ex.Reconcile(ctx)
	if err != nil {
		return rec, fmt.Errorf("restore devices: %w", err)
	}
	return rec, nil
}

// noLibvirt is the executor's libvirt where there is none: Reconcile,
// the one executor call RestoreDevices makes, touches sysfs and the
// journal only, so no method of it is ever called (each would panic on
// the nil interface).
type noLibvirt struct{ executor.Domains }
