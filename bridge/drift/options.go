package drift

import (
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// options are the [drift] options, declared once with their defaults:
// the bridge's set takes them from Options, and DefaultConfig is built
// from them.
var options = conf.NewGroup().
	SectionHelp("drift", "The drift reconciler: Placement allocations vs. the agents' reports vs. the "+
		"bridge's records; findings at GET /v1/drift and `vgpuctl drift`.")

var (
	optEnabled = options.Bool("drift", "enabled", true,
		"Run the drift reconciler: every interval one replica compares Placement's VGPU allocations on the GPU "+
			"providers, the agents' reports and the bridge's records, and records each difference (GET /v1/drift, "+
			"metric vgpu_bridge_drift_findings, a log line per new finding). GET /v1/drift is served either way. Example: false")
	optInterval = options.Duration("drift", "interval", 5*time.Minute, 5*time.Second, 24*time.Hour,
		"Time between drift runs (one replica runs each, under an advisory lock; the first run waits one interval). Example: 10m")
	optRepair = options.Bool("drift", "repair", false,
		"Repair what is safe: remove agent-made mdevs that no vGPU of the bridge accounts for and that are attached "+
			"to no domain (remove_mdev through the outbox, signed like every command), and release Placement claims "+
			"the bridge made for deleted instances or that nothing accounts for. Nova's claims and mdevs are never "+
			"touched; the rest is reported only. Example: true")
	optRepairGrace = options.Duration("drift", "repair_grace", 10*time.Minute, 0, 24*time.Hour,
		"How long a finding must have lasted (since it was first seen) before it is repaired, so that a change in "+
			"flight is not taken for drift. Example: 15m")
	optCommandTimeout = options.Duration("drift", "command_timeout", 2*time.Minute, 5*time.Second, time.Hour,
		"Deadline of a repair's remove_mdev; past it the repair request fails and the next run tries again. Example: 5m")
)

// Options returns the options.
func Options() *conf.Group { return options }

// Enabled is [drift] enabled: whether the reconciler runs (GET /v1/drift is
// served either way).
func Enabled(v *conf.Values) bool { return optEnabled.Get(v) }

// ConfigFrom maps [drift] (and [placement] stale_report_age) to a Config;
// Replica is the caller's. Concurrency, which no option sets, is
// DefaultConfig's.
func ConfigFrom(v *conf.Values) Config {
	return Config{
		Interval:       optInterval.Get(v),
		Repair:         optRepair.Get(v),
		RepairGrace:    optRepairGrace.Get(v),
		StaleReportAge: placement.StaleReportAge(v),
		CommandTimeout: optCommandTimeout.Get(v),
		Concurrency:    4,
	}
}

// DefaultConfig returns the defaults of the [drift] options.
func DefaultConfig() Config { return ConfigFrom(conf.Defaults(options, placement.Options())) }
