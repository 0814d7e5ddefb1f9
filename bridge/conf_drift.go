package bridge

import (
	"context"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/drift"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// DriftConfig is drift.Config of this replica (the [drift] options are
// package drift's).
func DriftConfig(v *conf.Values, replica string) drift.Config {
	c := drift.ConfigFrom(v)
	c.Replica = replica
	return c
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
	if !drift.Enabled(v) {
		return component{name: "drift", run: func(ctx context.Context) error { <-ctx.Done(); return nil }}, nil
	}
	return component{name: "drift", run: rec.Run}, nil
}
