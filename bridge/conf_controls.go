package bridge

import (
	"context"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/diagnostics"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// setupControls registers the operator controls' routes and
// returns their loops: change notifications (placement exclusions and
// the mode gauges of this replica follow every replica's changes) and the
// retention purge. ctl is built in Run before placement and the pipeline,
// which read it:
//
//	comps = append(comps, setupControls(w, pl, pol, notif)...)
func setupControls(w *wiring, pl *placement.Service, pol *policy.Holder, notif *ingest.Consumer) []component {
	v, ctl, srv, log := w.v, w.ctl, w.srv, w.log.With("component", "controls")
	a := &controls.API{
		Store:    ctl,
		Catalog:  pol.Catalog(),
		GPUs:     pl.Index().GPUs,
		IsNovaVF: pl.IsNovaVF,
		KnownHost: func(name string) bool {
			return len(pl.Index().HostGPUs(name)) > 0
		},
		// A mixed bridge-owned GPU, which the mirror's gpus table lacks.
		KnownGPU: func(ctx context.Context, id string) (controls.KnownGPU, bool, error) {
			m, ok, err := pl.MixedGPUByProvider(ctx, id)
			return controls.KnownGPU{Node: m.Node, PCIAddress: m.PCI}, ok, err
		},
		Changed: pl.RefreshHosts,
	}
	if notif != nil {
		a.Replayer = notif
	}
	a.Register(srv)
	// vgpuctl diagnose HOST: bundles through the outbox (the relay's poll
	// publishes the command).
	(&diagnostics.API{Store: &diagnostics.Store{Pool: w.pool, Log: w.log.With("component", "diagnostics")}}).Register(srv)
	listen := func(ctx context.Context) error {
		return ctl.Listen(ctx, func(ctx context.Context, table string) {
			switch table {
			case "hosts", "gpus":
				pl.RefreshHosts(ctx)
			case "bridge_controls":
				if _, err := ctl.Get(ctx); err != nil {
					log.Warn("controls: cannot read the mode", logkey.Err, err)
				}
			default: // (re)connected: changes may have been missed
				pl.RefreshHosts(ctx)
				ctl.Get(ctx) //nolint:errcheck
			}
		})
	}
	r := RetentionConfig(v)
	return []component{
		{name: "controls", run: listen},
		{name: "retention", run: func(ctx context.Context) error { return ctl.RunPurge(ctx, r) }},
	}
}
