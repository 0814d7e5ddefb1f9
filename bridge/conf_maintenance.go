// SPDX-License-Identifier: Apache-2.0

package bridge

import (
	"context"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/fleetupgrade"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/maintenance"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

var (
	optMaintenanceLiveMigrateVGPU = maintenanceOptions.Bool("maintenance", "live_migrate_vgpu", false,
		"Live-migrate the VMs whose vGPU comes from their flavor (resources:VGPU) when `vgpuctl host migrate-all` "+
			"empties a host, instead of cold-migrating and confirming them. Only for stacks that live-migrate "+
			"vGPUs: Nova 2024.1 (Caracal) or later, libvirt 8.6 or later and QEMU 8.1 or later on every compute "+
			"host, with the NVIDIA driver's migration support; on older stacks Nova refuses the move or the VM "+
			"loses its vGPU. Direct-path VMs are live-migrated either way (their vGPU is detached first). Example: true")
)

// maintenanceOptions are the options declared in this file; Options assembles them
// into the daemon's set.
var maintenanceOptions = conf.NewGroup().
	SectionHelp("maintenance", "Host maintenance: `vgpuctl host migrate-all HOST` (POST "+
		"/v1/hosts/{name}/migrate-all) drains a host, moves every vGPU VM off it through Nova and undrains it.")

// MaintenanceRunConfig maps [maintenance] to the executor's timings
// (package maintenance's options).
func MaintenanceRunConfig(v *conf.Values) maintenance.RunConfig {
	return maintenance.RunConfigFrom(v)
}

// maintenanceNova is what host maintenance needs of Nova
// (computeapi.Client).
type maintenanceNova interface {
	maintenance.Nova
	maintenance.Lister
}

// setupMaintenance registers the host maintenance routes and returns the
// executor's loop; nova is nil when [nova] is not configured (the routes
// answer 503 then and no loop runs).
func setupMaintenance(w *wiring, nova any, pl *placement.Service, proc *pipeline.Processor, pol *policy.Holder) []component {
	store := maintenance.NewStore(w.pool, w.log.With("component", "maintenance"))
	cfg := MaintenanceRunConfig(w.v)
	a := &maintenance.API{Store: store, Pool: w.pool, Drain: w.ctl, Poll: cfg.Poll,
		Known: func(name string) bool { return len(pl.Index().HostGPUs(name)) > 0 },
		Chooser: func() maintenance.Chooser {
			return &maintenance.IndexChooser{GPUs: pl.Index().GPUs, Placeable: pl.Placeable}
		},
		Defaults: maintenance.Options{LiveMigrateVGPU: optMaintenanceLiveMigrateVGPU.Get(w.v)}}
	// Fleet upgrades (vgpuctl fleet upgrade) move the VMs with the host
	// maintenance operation.
	fs := fleetupgrade.NewStore(w.pool, w.log.With("component", "fleet-upgrade"))
	compat := func() fleetupgrade.Compat {
		if c := pol.Policy().Compat(); c != nil {
			return c
		}
		return nil
	}
	fr := &fleetupgrade.Runner{Store: fs, Pool: w.pool, Drain: w.ctl, Evac: a, Compat: compat,
		Who: controls.Actor{Name: "vgpu-bridge/" + w.replica}, Log: w.log.With("component", "fleet-upgrade"), Poll: cfg.Poll,
		// Re-type runs (vgpuctl fleet retype) verify in Placement itself.
		Placement: pl.Client()}
	fa := &fleetupgrade.API{Store: fs, Pool: w.pool, Compat: compat, Ready: func() string {
		if a.Nova == nil {
			return "fleet upgrades move VMs through Nova (host maintenance): configure [nova]"
		}
		return ""
	}, Retyper: pl}
	fa.Register(w.srv)
	n, ok := nova.(maintenanceNova)
	if !ok {
		a.Register(w.srv)
		// Re-type runs need no Nova (no VM moves); an upgrade cannot
		// start without it (Ready).
		return []component{{name: "fleet-upgrade", run: fr.Run}}
	}
	r := &maintenance.Runner{Store: store, Nova: n, Placement: maintenance.PlacementAdapter{S: pl},
		Agents: maintenance.PipelineAgents{Pool: w.pool, Wake: proc.Wake, Poll: cfg.Poll / 4}, Drain: w.ctl, Cfg: cfg,
		Log: w.log.With("component", "maintenance"), DirectOf: func(ctx context.Context, instance string, detach uuid.UUID) ([]maintenance.DirectVGPU, error) {
			return maintenance.Direct(ctx, w.pool, instance, detach)
		}}
	a.Nova, a.Started = n, r.Kick
	a.Register(w.srv)
	return []component{{name: "maintenance", run: r.Run}, {name: "fleet-upgrade", run: fr.Run}}
}
