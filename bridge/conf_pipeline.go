package bridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/diagnostics"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/direct"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/novaresize"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/quotaapi"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// PipelineConfig is pipeline.Config of this replica (the [pipeline]
// options are package pipeline's).
func PipelineConfig(v *conf.Values, replica string) pipeline.Config {
	c := pipeline.ConfigFrom(v)
	c.Replica = replica
	return c
}

// setupPipeline builds the pipeline (on a pool of its own: its decision
// transactions stay open across the Placement claims, whose mirror writes
// take connections of the main pool) and the dispatcher, and returns
// their loops as one component. bridge.Run calls it at the features mark,
// after placement, policy and notifications:
//
//	pipeComps, err := setupPipeline(ctx, w, brokerTLS, pol, pl)
func setupPipeline(ctx context.Context, w *wiring, tlsCfg *tls.Config, pol *policy.Holder, pl *placement.Service) ([]component, error) {
	v, replica, tu, reg, log, rl, ctl := w.v, w.replica, w.tu, w.reg, w.log, w.rl, w.ctl
	sc, err := StoreConfig(v)
	if err != nil {
		return nil, err
	}
	pc := PipelineConfig(v, replica)
	sc.MaxConns = int32(pc.Workers + 6) // + relay, results, reports, deadlines, hosts, Nova calls
	pipePool, err := store.Open(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("pipeline pool: %w", err)
	}
	var disp *dispatch.Dispatcher
	novaAPI := novaPath(w) // the Nova-native path (conf_nova.go); nil when [nova] is not configured
	// [quota] driver = unified_limits (conf_quota.go); nil otherwise.
	limitSrc, err := QuotaLimits(v, pl, log.With("component", "unified-limits"))
	if err != nil {
		pipePool.Close()
		return nil, err
	}
	var limits pipeline.LimitSource
	if limitSrc != nil { // not a typed nil in the interface
		limits = limitSrc
	}
	proc, err := pipeline.New(pc, pipeline.Deps{Pool: pipePool, Requests: requests.NewStore(pipePool, "vgpu-bridge/"+replica),
		Policy: pol, Placement: pipeline.ServiceAdapter{S: pl}, Catalog: pol.Catalog(), Log: log.With("component", "pipeline"),
		Registry: reg, OnOutbox: func() { disp.Kick() }, Controls: ctl, Lookup: instanceLookup(w), Limits: limits})
	if err != nil {
		pipePool.Close()
		return nil, err
	}
	(&quotaapi.API{Quota: proc.Quota}).Register(w.srv) // GET /v1/quota (vgpuctl quota show)
	lent := proc.Lend()                                // what the stages and paths work with: the pipeline's Placement, policy, request store, counters, decisions
	directPath := direct.New(proc)                     // the direct path: claims and commands, agent results, failures and compensation, deadlines
	if w.reqAPI != nil {
		// POST /v1/requests/{id}/cancel: a request with vGPUs in flight
		// reads cancelled once their claims are given back.
		w.reqAPI.SetCanceller(directPath)
	}
	nc := NovaPathConfig(v)
	nc.Replica, nc.RetryMin, nc.RetryMax, nc.MaxAttempts, nc.StaleReportAge = replica, pc.RetryMin, pc.RetryMax, pc.MaxAttempts, pc.StaleReportAge
	resizes := novaresize.New(nc, novaresize.Deps{Pool: pipePool, Requests: requests.NewStore(pipePool, "vgpu-bridge/"+replica),
		Pipeline: proc, Decisions: lent.Decisions, Counters: lent.Counters, Fail: directPath, Catalog: pol.Catalog(), Nova: novaAPI, Capacity: novaresize.DryRun{S: pl}, Controls: ctl,
		Log: log.With("component", "nova-resize")})
	act := pipeline.Act{Direct: directPath, Decisions: lent.Decisions}
	if novaAPI != nil {
		act.NovaResize = resizes
	}
	// What happens to each inbox event, in order; the first stage that
	// finishes it ends its way (pipeline.Stage).
	// Each stage holds what it works with.
	cfg, deps, count, dec := lent.Config, lent.Deps, lent.Counters, lent.Decisions
	proc.Use(pipeline.Paths{Stages: []pipeline.Stage{
		// the usage of the vGPUs an instance's flavor gives it, as Nova says it stands
		pipeline.AccountFlavor{Catalog: deps.Catalog, ClockSkew: cfg.ClockSkewTolerance, NovaVFAliases: cfg.NovaVFAliases},
		// the instance's allocations read when Nova changed them, for one-call claims later
		pipeline.KnowAllocations{Allocations: deps.Placement},
		// a Nova notification of a resize the bridge runs moves that resize on
		resizes.Events(),
		// a webhook's request, locked; an ended one is skipped
		pipeline.ReadRequest{Count: count},
		// the inbox row as the policy's event; one that does not map fails its request
		pipeline.ReadEvent{ClockSkew: cfg.ClockSkewTolerance, Fail: directPath},
		// direct-path vGPUs follow a Nova move or host maintenance of their instance
		directPath.FollowMove(),
		// facts, the policy, the plan
		pipeline.Evaluate{Policy: deps.Policy, Decisions: dec, Count: count, LooksUp: deps.Lookup != nil},
		// a request for a notification the policy acts on
		pipeline.OpenRequest{Requests: deps.Requests},
		// the direct path (claims, attachments, commands), or a resize through Nova
		act,
		// the decision, and the policy's load state
		pipeline.Record{Decisions: dec, Count: count},
	},
		Results: []pipeline.ResultTaker{resizes, directPath}, // verify_vgpu results of resizes go to the resize, the others to the direct path
		Direct:  directPath,                                  // claims; failing a request undoes its direct-path work, whatever path ran it
	})
	dc := DispatchConfig(v, tu, replica)
	dc.TLS = tlsCfg
	if err := SecurityConfig(v, &dc, log.With("component", "dispatch")); err != nil {
		pipePool.Close()
		return nil, err
	}
	disp, err = dispatch.New(dc, dispatch.Deps{Pool: pipePool, Requests: requests.NewStore(pipePool, "vgpu-bridge/"+replica),
		// Results carrying a diagnostics bundle are stored by diagnostics; the rest go to the pipeline.
		Results: diagnostics.Results{Store: &diagnostics.Store{Pool: pipePool, Log: log.With("component", "diagnostics")}, Next: proc},
		Catalog: pol.Catalog(), Phase: flow.PhaseOf, Log: log.With("component", "dispatch"), Registry: reg,
		Hold: ctl.Hold, // operators' pause / observe-only hold the outbox
		// a GPU its agent reports faulted is drained and marked (the fault trait follows in the placement sync)
		Faults: func(ctx context.Context, host, node string, gpus []protocol.GPU) error {
			_, err := ctl.GPUFaults(ctx, host, node, gpus)
			return err
		}})
	if err != nil {
		pipePool.Close()
		return nil, err
	}
	rl.setDispatcher(disp) // SIGHUP: [security] keys (reload.go)
	w.disp = disp          // the broker's readiness (bridge.go)
	w.wake.set(proc.Wake)
	run := func(ctx context.Context) error {
		defer pipePool.Close()
		errc := make(chan error, 4)
		go func() { errc <- proc.Run(ctx) }()
		go func() { errc <- disp.Run(ctx) }()
		go func() { errc <- directPath.Run(ctx) }() // deadlines of direct-path requests
		go func() { errc <- resizes.Run(ctx) }()    // Nova calls and deadlines of resizes through Nova
		return errors.Join(<-errc, <-errc, <-errc, <-errc)
	}
	comps := []component{{name: "pipeline", run: run}}
	if limitSrc != nil {
		comps = append(comps, component{name: "unified-limits", run: limitSrc.Run}) // [quota] refresh_interval
	}
	// Host maintenance (vgpuctl host migrate-all): its routes and executor.
	return append(comps, setupMaintenance(w, novaAPI, pl, proc, pol)...), nil
}
