// Package pipeline is the bridge's decision loop. It claims unprocessed
// inbox rows (events) with FOR UPDATE SKIP LOCKED, maps each to a
// policy.Event, evaluates the policy against the state the bridge holds,
// plans the decision (PlanDecision) and hands the plan to the path that
// owns its steps (Paths, the Act stage): the direct path (package direct:
// a Placement claim on a GPU of the instance's own host, in the
// instance's consumer, and the agent commands that create and attach the
// mdev) or the Nova-native path (package novaresize). The decision, the
// attachment records, the commands (outbox rows) and the request's
// transition are written in one transaction (two when the plan needs
// claims: decideLocked); the relay (package dispatch) publishes the
// commands.
//
// Results come back through HandleResult, which records each and hands it
// to the path that takes it (ResultTaker); the path moves its request on,
// and fails and compensates it (Failer) when a command failed or its
// deadline passed.
//
// Several replicas share the work: inbox rows and requests are locked with
// SKIP LOCKED; events of one instance are handled in inbox order (a
// transaction-scoped advisory lock per instance).
package pipeline

import (
	"errors"
	"fmt"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// Config configures a Processor. The bridge maps its [pipeline] options
// into it; zero fields take the defaults of DefaultConfig.
type Config struct {
	// Replica names this process in decisions and logs.
	Replica string
	// PollInterval is how often the inbox is looked at when nothing woke
	// the processor.
	PollInterval time.Duration
	// BatchSize is the most inbox rows one poll takes.
	BatchSize int
	// ProjectShare is the most rows of one project a poll takes (at most
	// BatchSize), so at most that many of one project's events are ever
	// queued ahead of another project's (ProcessOnce).
	ProjectShare int
	// Workers process events of different instances concurrently.
	Workers int
	// RequestTimeout is how long the agents have to finish a request's
	// commands; past it the request fails and is compensated.
	RequestTimeout time.Duration
	// WatchdogInterval is how often deadlines are checked.
	WatchdogInterval time.Duration
	// MaxAttempts closes an event (status failed) after that many failed
	// attempts; its request fails with the last error.
	MaxAttempts int
	// RetryMin and RetryMax bound the backoff between attempts of an event.
	RetryMin, RetryMax time.Duration
	// StaleReportAge: an instance's host whose last agent report is older
	// is not given new vGPUs ([placement] stale_report_age).
	StaleReportAge time.Duration
	// HostsRefresh is how often the hosts' reports are re-read for the
	// policy's view of the fleet.
	HostsRefresh time.Duration
	// LoadInterval is how often the instances' vGPU load (from the agents'
	// reports) becomes bridge.vgpu_load events; 0 is the default (1m), a
	// negative value turns it off.
	LoadInterval time.Duration
	// LoadWindow is how far back those events' metrics look (at most 2h,
	// the samples kept).
	LoadWindow time.Duration
	// ClockSkewTolerance bounds the times of Nova's notifications in the
	// usage they account ([notifications] clock_skew_tolerance): an
	// interval begins or ends no earlier than this before the bridge
	// received the event, and never after it.
	ClockSkewTolerance time.Duration
	// NovaVFAliases are Nova's PCI aliases of Nova-owned VF GPUs
	// ([placement] nova_vf_aliases): a server whose flavor names one in
	// pci_passthrough:alias holds that many vGPUs of the alias's type, in
	// the usage accounting (AccountFlavor) and the quota (projectUsage).
	NovaVFAliases map[string]placement.NovaVFAlias
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	if c.PollInterval <= 0 {
		c.PollInterval = d.PollInterval
	}
	if c.ClockSkewTolerance <= 0 {
		c.ClockSkewTolerance = d.ClockSkewTolerance
	}
	if c.BatchSize <= 0 {
		c.BatchSize = d.BatchSize
	}
	if c.ProjectShare <= 0 {
		c.ProjectShare = d.ProjectShare
	}
	if c.Workers <= 0 {
		c.Workers = d.Workers
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = d.RequestTimeout
	}
	if c.WatchdogInterval <= 0 {
		c.WatchdogInterval = d.WatchdogInterval
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = d.MaxAttempts
	}
	if c.RetryMin <= 0 {
		c.RetryMin = d.RetryMin
	}
	if c.RetryMax <= 0 {
		c.RetryMax = d.RetryMax
	}
	if c.StaleReportAge <= 0 {
		c.StaleReportAge = d.StaleReportAge
	}
	if c.HostsRefresh <= 0 {
		c.HostsRefresh = d.HostsRefresh
	}
	if c.LoadInterval == 0 {
		c.LoadInterval = d.LoadInterval
	}
	if c.LoadWindow <= 0 || c.LoadWindow > 2*time.Hour {
		c.LoadWindow = min(max(c.LoadWindow, d.LoadWindow), 2*time.Hour)
	}
}

// Validate reports impossible settings.
func (c *Config) Validate() error {
	var errs []error
	if c.RetryMax < c.RetryMin {
		errs = append(errs, fmt.Errorf("retry max %v below retry min %v", c.RetryMax, c.RetryMin))
	}
	if c.Workers > 64 {
		errs = append(errs, fmt.Errorf("workers %d: at most 64", c.Workers))
	}
	return errors.Join(errs...)
}
