package pipeline

import (
	"cmp"
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// options are the [pipeline] options, declared once with their defaults:
// the bridge's set takes them from Options, and DefaultConfig is built
// from them.
var options = conf.NewGroup().
	SectionHelp("pipeline", "The decision loop: inbox -> policy -> Placement claim -> outbox, request deadlines "+
		"and compensation. Every replica runs it; rows are shared with SKIP LOCKED.")

var (
	optPollInterval = options.Duration("pipeline", "poll_interval", 200*time.Millisecond, 10*time.Millisecond, time.Minute,
		"How often each replica looks at the inbox (events not processed yet) when nothing woke it. The webhooks and "+
			"notifications a replica stores wake its own pipeline at once; the poll finds those stored by other replicas "+
			"and events backed off for a retry. Example: 100ms")
	optBatchSize = options.Int("pipeline", "batch_size", 100, 1, 10000,
		"Most inbox events one look at the inbox takes, the first of each project first (see project_share); each "+
			"is decided in its own transaction. Example: 200")
	optProjectShare = options.Int("pipeline", "project_share", 25, 1, 10000,
		"Most inbox events of one project (the instance's) that each replica's pipeline holds queued or being "+
			"decided at a time (at most batch_size). Its workers take the projects' events in turns and it looks at the "+
			"inbox again when a commit wakes it, so while one project's backlog waits, another project's event is "+
			"decided before more than this many of the backlog's. Example: 50")
	optWorkers = options.Int("pipeline", "workers", 4, 1, 64,
		"Events of different instances decided concurrently by this replica (events of one instance always go in "+
			"inbox order). The pipeline has a pool of its own of workers + 2 connections. Example: 8")
	optRequestTimeout = options.Duration("pipeline", "request_timeout", 2*time.Minute, 5*time.Second, 24*time.Hour,
		"Deadline of a request once decided: its agent commands must all be answered by then, or the request fails "+
			"(code agent_timeout, naming the host and command) and is compensated (Placement claim released, "+
			"remove_mdev queued). Also the expiry of its commands. Example: 5m")
	optDeadlineCheckInterval = options.Duration("pipeline", "deadline_check_interval", time.Second, 100*time.Millisecond, 10*time.Minute,
		"How often requests past their deadline are looked for (replicas share the work). Example: 5s")
	optMaxAttempts = options.Int("pipeline", "max_attempts", 5, 1, 100,
		"Attempts at an event whose processing fails (Placement or database unavailable) before the event is closed "+
			"with status failed and its request fails (code event_failed). Example: 10")
	optRetryMin = options.Duration("pipeline", "retry_min", time.Second, 10*time.Millisecond, time.Hour,
		"First wait before an event is tried again; it doubles (with jitter) up to retry_max. Example: 2s")
	optRetryMax = options.Duration("pipeline", "retry_max", time.Minute, 10*time.Millisecond, 24*time.Hour,
		"Longest wait between attempts at an event. Example: 5m")
	optLoadInterval = options.Duration("pipeline", "load_interval", time.Minute, 0, time.Hour,
		"How often the vGPU load the agents report becomes a bridge.vgpu_load event per instance (the policy's load "+
			"rules run on it, with their for:, hysteresis and cooldown); one replica does it. 0 turns it off. Example: 30s")
	optLoadWindow = options.Duration("pipeline", "load_window", 30*time.Minute, time.Minute, 2*time.Hour,
		"How far back a bridge.vgpu_load event's metrics look (gpu_util_avg, _min, _max over it). Example: 10m")
)

// Options returns the [pipeline] options with their check.
func Options() *conf.Group { return options.WithCheck(check) }

// check tests relations between the [pipeline] options.
func check(v *conf.Values) conf.Errors {
	var errs conf.Errors
	if optRetryMax.Get(v) < optRetryMin.Get(v) {
		errs = append(errs, &conf.Error{Section: "pipeline", Option: "retry_max", Value: optRetryMax.Get(v).String(),
			Problem: "is below retry_min; allowed: at least retry_min"})
	}
	return errs
}

// ConfigFrom maps [pipeline] (and [placement] stale_report_age,
// [notifications] clock_skew_tolerance) to a Config; Replica is the
// caller's. HostsRefresh, which no option sets, is DefaultConfig's.
func ConfigFrom(v *conf.Values) Config {
	return Config{
		PollInterval:       optPollInterval.Get(v),
		BatchSize:          optBatchSize.Get(v),
		ProjectShare:       optProjectShare.Get(v),
		Workers:            optWorkers.Get(v),
		RequestTimeout:     optRequestTimeout.Get(v),
		WatchdogInterval:   optDeadlineCheckInterval.Get(v),
		MaxAttempts:        optMaxAttempts.Get(v),
		RetryMin:           optRetryMin.Get(v),
		RetryMax:           optRetryMax.Get(v),
		StaleReportAge:     placement.StaleReportAge(v),
		HostsRefresh:       5 * time.Second,
		LoadInterval:       cmp.Or(optLoadInterval.Get(v), -1), // 0: off
		LoadWindow:         optLoadWindow.Get(v),
		ClockSkewTolerance: ingest.ConfigFrom(v).ClockSkewTolerance,
		NovaVFAliases:      placement.NovaVFAliases(v),
	}
}

// defaults are the Config of a configuration that sets nothing.
var defaults = sync.OnceValue(func() Config {
	return ConfigFrom(conf.Defaults(options, placement.Options(), ingest.Options()))
})

// DefaultConfig returns the defaults of the [pipeline] options (and of
// the other sections' options a Config holds).
func DefaultConfig() Config { return defaults() }
