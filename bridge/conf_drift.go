package bridge

import (
	"context"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/drift"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

var (
	optDriftEnabled = driftOptions.Bool("drift", "enabled", true,
		"Run the drift reconciler: every interval one replica compares Placement's VGPU allocations on the GPU "+
			"providers, the agents' reports and the bridge's records, and records each difference (GET /v1/drift, "+
			"metric vgpu_bridge_drift_findings, a log line per new finding). GET /v1/drift is served either way. Example: false")
	optDriftInterval = driftOptions.Duration("drift", "interval", 5*time.Minute, 5*time.Second, 24*time.Hour,
		"Time between drift runs (one replica runs each, under an advisory lock; the first run waits one interval). Example: 10m")
	optDriftRepair = driftOptions.Bool("drift", "repair", false,
		"Repair what is safe: remove agent-made mdevs that no vGPU of the bridge accounts for and that are attached "+
			"to no domain (remove_mdev through the outbox, signed like every command), and release Placement claims "+
			"the bridge made for deleted instances or that nothing accounts for. Nova's claims and mdevs are never "+
			"touched; the rest is reported only. Example: true")
	optDriftRepairGrace = driftOptions.Duration("drift", "repair_grace", 10*time.Minute, 0, 24*time.Hour,
		"How long a finding must have lasted (since it was first seen) before it is repaired, so that a change in "+
			"flight is not taken for drift. Example: 15m")
	optDriftCommandTimeout = driftOptions.Duration("drift", "command_timeout", 2*time.Minute, 5*time.Second, time.Hour,
		"Deadline of a repair's remove_mdev; past it the repair request fails and the next run tries again. Example: 5m")
)

// driftOptions are the options declared in this file; Options assembles them
// into the daemon's set.
var driftOptions = conf.NewGroup().
	SectionHelp("drift", "The drift reconciler: Placement allocations vs. the agents' reports vs. the "+
		"bridge's records; findings at GET /v1/drift and `vgpuctl drift`.")

// DriftConfig maps [drift] (and [placement] stale_report_age) to
// drift.Config.
func DriftConfig(v *conf.Values, replica string) drift.Config {
	return drift.Config{
		Replica:        replica,
		Interval:       optDriftInterval.Get(v),
		Repair:         optDriftRepair.Get(v),
		RepairGrace:    optDriftRepairGrace.Get(v),
		StaleReportAge: placement.StaleReportAge(v),
		CommandTimeout: optDriftCommandTimeout.Get(v),
	}
}

// setupDrift builds the drift reconciler over the main pool, registers
// GET /v1/drift and POST /v1/drift/run, and returns its loop. bridge.Run
// calls it next to setupPipeline:
//
//	driftComp, err := setupDrift(w, pl)
func setupDrift(w *wiring, pl *placement.Service) (component, error) {
	v, replica, pool, srv, reg, log := w.v, w.replica, w.pool, w.srv, w.reg, w.log
	// Repairs wait while operators hold the bridge (pause, observe-only).
	hold := func(ctx context.Context) bool {
		m, err := w.ctl.Get(ctx)
		if err != nil {
			log.Warn("drift: cannot read the operator controls; repairs held", "err", err)
			return true
		}
		return m.Holds()
	}
	rec, err := drift.New(DriftConfig(v, replica), drift.Deps{Pool: pool, Placement: drift.ServiceAdapter{S: pl},
		Requests: requests.NewStore(pool, "vgpu-bridge/"+replica), Log: log.With("component", "drift"), Registry: reg, Hold: hold})
	if err != nil {
		return component{}, err
	}
	rec.Register(srv)
	if !optDriftEnabled.Get(v) {
		return component{name: "drift", run: func(ctx context.Context) error { <-ctx.Done(); return nil }}, nil
	}
	return component{name: "drift", run: rec.Run}, nil
}
