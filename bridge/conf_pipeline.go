package bridge

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/diagnostics"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/novaresize"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

var (
	optPipelinePoll = pipelineOptions.Duration("pipeline", "poll_interval", 200*time.Millisecond, 10*time.Millisecond, time.Minute,
		"How often each replica looks at the inbox (events not processed yet) when nothing woke it. The webhooks and "+
			"notifications a replica stores wake its own pipeline at once; the poll finds those stored by other replicas "+
			"and events backed off for a retry. Example: 100ms")
	optPipelineBatch = pipelineOptions.Int("pipeline", "batch_size", 100, 1, 10000,
		"Most inbox events one poll takes; each is decided in its own transaction. Example: 200")
	optPipelineWorkers = pipelineOptions.Int("pipeline", "workers", 4, 1, 64,
		"Events of different instances decided concurrently by this replica (events of one instance always go in "+
			"inbox order). The pipeline has a pool of its own of workers + 2 connections. Example: 8")
	optPipelineRequestTimeout = pipelineOptions.Duration("pipeline", "request_timeout", 2*time.Minute, 5*time.Second, 24*time.Hour,
		"Deadline of a request once decided: its agent commands must all be answered by then, or the request fails "+
			"(code agent_timeout, naming the host and command) and is compensated (Placement claim released, "+
			"remove_mdev queued). Also the expiry of its commands. Example: 5m")
	optPipelineWatchdog = pipelineOptions.Duration("pipeline", "deadline_check_interval", time.Second, 100*time.Millisecond, 10*time.Minute,
		"How often requests past their deadline are looked for (replicas share the work). Example: 5s")
	optPipelineMaxAttempts = pipelineOptions.Int("pipeline", "max_attempts", 5, 1, 100,
		"Attempts at an event whose processing fails (Placement or database unavailable) before the event is closed "+
			"with status failed and its request fails (code event_failed). Example: 10")
	optPipelineRetryMin = pipelineOptions.Duration("pipeline", "retry_min", time.Second, 10*time.Millisecond, time.Hour,
		"First wait before an event is tried again; it doubles (with jitter) up to retry_max. Example: 2s")
	optPipelineRetryMax = pipelineOptions.Duration("pipeline", "retry_max", time.Minute, 10*time.Millisecond, 24*time.Hour,
		"Longest wait between attempts at an event. Example: 5m")
	optPipelineLoadInterval = pipelineOptions.Duration("pipeline", "load_interval", time.Minute, 0, time.Hour,
		"How often the vGPU load the agents report becomes a bridge.vgpu_load event per instance (the policy's load "+
			"rules run on it, with their for:, hysteresis and cooldown); one replica does it. 0 turns it off. Example: 30s")
	optPipelineLoadWindow = pipelineOptions.Duration("pipeline", "load_window", 30*time.Minute, time.Minute, 2*time.Hour,
		"How far back a bridge.vgpu_load event's metrics look (gpu_util_avg, _min, _max over it). Example: 10m")
)

// pipelineOptions are the options declared in this file; Options assembles them
// into the daemon's set with validatePipeline.
var pipelineOptions = conf.NewGroup().
	SectionHelp("pipeline", "The decision loop: inbox -> policy -> Placement claim -> outbox, request deadlines "+
		"and compensation. Every replica runs it; rows are shared with SKIP LOCKED.")

// validatePipeline tests relations between the options of this file.
func validatePipeline(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if optPipelineRetryMax.Get(v) < optPipelineRetryMin.Get(v) {
		errs = append(errs, &conf.Error{Section: "pipeline", Option: "retry_max", Value: optPipelineRetryMax.Get(v).String(),
			Problem: "is below retry_min; allowed: at least retry_min"})
	}
	return errs
}

// PipelineConfig maps [pipeline] (and [placement] stale_report_age) to
// pipeline.Config.
func PipelineConfig(v *conf.Values, replica string) pipeline.Config {
	return pipeline.Config{
		Replica:          replica,
		PollInterval:     optPipelinePoll.Get(v),
		BatchSize:        optPipelineBatch.Get(v),
		Workers:          optPipelineWorkers.Get(v),
		RequestTimeout:   optPipelineRequestTimeout.Get(v),
		WatchdogInterval: optPipelineWatchdog.Get(v),
		MaxAttempts:      optPipelineMaxAttempts.Get(v),
		RetryMin:         optPipelineRetryMin.Get(v),
		RetryMax:         optPipelineRetryMax.Get(v),
		StaleReportAge:   optPlacementStaleReportAge.Get(v),
		LoadInterval:     cmp.Or(optPipelineLoadInterval.Get(v), -1), // 0: off
		LoadWindow:       optPipelineLoadWindow.Get(v),

		ClockSkewTolerance: optNotifClockSkew.Get(v),
	}
}

// setupPipeline builds the pipeline (on a pool of its own: its decision
// transactions stay open across the Placement claims, whose mirror writes
// take connections of the main pool) and the dispatcher, and returns
// their loops as one component. bridge.Run calls it at the features mark,
// after placement, policy and notifications:
//
//	pipeComps, err := setupPipeline(ctx, w, notifCfg.TLS, pol, pl)
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
	novaAPI, err := setupNova(ctx, v) // the Nova-native path (conf_nova.go); nil when [nova] is not configured
	if err != nil {
		pipePool.Close()
		return nil, fmt.Errorf("nova: %w", err)
	}
	proc, err := pipeline.New(pc, pipeline.Deps{Pool: pipePool, Requests: requests.NewStore(pipePool, "vgpu-bridge/"+replica),
		Policy: pol, Placement: pipeline.ServiceAdapter{S: pl}, Catalog: pol.Catalog(), Log: log.With("component", "pipeline"),
		Registry: reg, OnOutbox: func() { disp.Kick() }, Controls: ctl})
	if err != nil {
		pipePool.Close()
		return nil, err
	}
	nc := NovaPathConfig(v)
	nc.Replica, nc.RetryMin, nc.RetryMax, nc.MaxAttempts, nc.StaleReportAge = replica, pc.RetryMin, pc.RetryMax, pc.MaxAttempts, pc.StaleReportAge
	resizes := novaresize.New(nc, novaresize.Deps{Pool: pipePool, Requests: requests.NewStore(pipePool, "vgpu-bridge/"+replica),
		Pipeline: proc, Catalog: pol.Catalog(), Nova: novaAPI, Capacity: novaresize.DryRun{S: pl}, Controls: ctl,
		Log: log.With("component", "nova-resize")})
	act := pipeline.Act{}
	if novaAPI != nil {
		act.NovaResize = resizes
	}
	// What happens to each inbox event, in order; the first stage that
	// finishes it ends its way (pipeline.Stage).
	proc.Use([]pipeline.Stage{
		pipeline.AccountFlavor{},   // the usage of the vGPUs an instance's flavor gives it, as Nova says it stands
		pipeline.KnowAllocations{}, // the instance's allocations read when Nova changed them, for one-call claims later
		resizes.Events(),           // a Nova notification of a resize the bridge runs moves that resize on
		pipeline.ReadRequest{},     // a webhook's request, locked; an ended one is skipped
		pipeline.ReadEvent{},       // the inbox row as the policy's event
		pipeline.FollowMove{},      // direct-path vGPUs follow a Nova move of their instance
		pipeline.Evaluate{},        // facts, the policy, the plan
		pipeline.OpenRequest{},     // a request for a notification the policy acts on
		act,                        // claims, attachments, commands; or a resize through Nova
		pipeline.Record{},          // the decision, and the policy's load state
	}, resizes) // verify_vgpu results of resizes go to the resize first
	dc := DispatchConfig(v, tu, replica)
	dc.TLS = tlsCfg
	if err := SecurityConfig(v, &dc, log.With("component", "dispatch")); err != nil {
		pipePool.Close()
		return nil, err
	}
	disp, err = dispatch.New(dc, dispatch.Deps{Pool: pipePool, Requests: requests.NewStore(pipePool, "vgpu-bridge/"+replica),
		// Results carrying a diagnostics bundle are stored by diagnostics; the rest go to the pipeline.
		Results: diagnostics.Results{Store: &diagnostics.Store{Pool: pipePool, Log: log.With("component", "diagnostics")}, Next: proc},
		Catalog: pol.Catalog(), Phase: pipeline.PhaseOf, Log: log.With("component", "dispatch"), Registry: reg,
		Hold: ctl.Hold}) // operators' pause / observe-only hold the outbox
	if err != nil {
		pipePool.Close()
		return nil, err
	}
	rl.setDispatcher(disp) // SIGHUP: [security] keys (reload.go)
	w.disp = disp          // the broker's readiness (bridge.go)
	w.wake.set(proc.Wake)
	run := func(ctx context.Context) error {
		defer pipePool.Close()
		errc := make(chan error, 3)
		go func() { errc <- proc.Run(ctx) }()
		go func() { errc <- disp.Run(ctx) }()
		go func() { errc <- resizes.Run(ctx) }() // Nova calls and deadlines of resizes through Nova
		return errors.Join(<-errc, <-errc, <-errc)
	}
	// Host maintenance (vgpuctl host migrate-all): its routes and executor.
	return append([]component{{name: "pipeline", run: run}}, setupMaintenance(w, novaAPI, pl, proc)...), nil
}
