package executor

import (
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [DEFAULT] options of the commands' execution, declared once
// with their defaults: the agent's set takes them from Options, and the
// defaults of the fields they set come from them.
var options = conf.NewGroup()

var (
	optColdShutdownTimeout = options.Duration(conf.DefaultSection, "cold_shutdown_timeout", 2*time.Minute, time.Second, time.Hour,
		"Default bound on the graceful guest shutdown of a cold attach or detach (mode=cold) when the command "+
			"gives none. When it passes the command fails with code timeout; the VM is never destroyed. Example: 5m")
	optCommandTimeout = options.Duration(conf.DefaultSection, "command_timeout", 10*time.Minute, 10*time.Second, 2*time.Hour,
		"Upper bound on the execution of one command. Example: 15m")
	optCommandClockSkew = options.Duration(conf.DefaultSection, "command_clock_skew", 5*time.Second, 0, 10*time.Minute,
		"How far past its expires_at a command is still accepted, for clocks of bridge and agent that disagree. "+
			"Later commands are refused with code expired and never executed. Example: 2s")
	optDriverUpgradeCommand = options.List(conf.DefaultSection, "driver_upgrade_command", "",
		"The operator's vGPU-manager upgrade command that the bridge's upgrade_driver command runs (vgpuctl fleet "+
			"upgrade): the executable (an absolute path) and its arguments, comma-separated, run without a shell. "+
			"The bridge never sends a command line, only the target branch and version, which the command reads "+
			"from VGPU_TARGET_BRANCH and VGPU_TARGET_VERSION in its environment. It must install the branch, reload "+
			"the driver and exit 0, and be safe to run again (a command interrupted by an agent crash is run again "+
			"at restart). Its exit status and the last 32 KiB of its output go back in the result. Empty refuses "+
			"upgrade_driver (code not_configured). Example: /usr/local/sbin/vgpu-manager-upgrade,--yes")
	optGPURetypeCommand = options.List(conf.DefaultSection, "gpu_retype_command", "",
		"The operator's command that re-types Nova-owned mdev GPUs of this host, run by the bridge's retype_gpus "+
			"command (vgpuctl fleet retype) on the drained host: the executable (an absolute path) and its arguments, "+
			"comma-separated, run without a shell. The bridge never sends a command line: the command reads the "+
			"host's new nova.conf [devices] and [mdev_<type>] sections on its standard input (also in VGPU_NOVA_CONF), "+
			"the GPUs in VGPU_RETYPE_GPUS (one PCI=TYPE a line) and their Placement providers' trait change in "+
			"VGPU_RETYPE_TRAITS (one PROVIDER_UUID FROM_TRAIT TO_TRAIT a line, - for one unknown). It must write the sections into "+
			"nova.conf (and the agent's own [devices] copy), restart nova-compute, set the providers' type traits "+
			"(Nova 26 does not write them), schedule the agent's restart for after it exits (the agent reads [devices] "+
			"at start) and exit 0, and be safe to run again. The bridge then waits for the new "+
			"trait in Placement. Bounded by driver_upgrade_timeout. Empty refuses retype_gpus (code not_configured). "+
			"Example: /usr/local/sbin/vgpu-nova-retype")
	optDriverUpgradeTimeout = options.Duration(conf.DefaultSection, "driver_upgrade_timeout", 30*time.Minute, time.Minute, 4*time.Hour,
		"Upper bound on driver_upgrade_command (instead of command_timeout); when it passes, the command's process "+
			"group is killed and upgrade_driver fails with code timeout. Example: 45m")
)

// Options returns the options of the commands' execution.
func Options() *conf.Group { return options }

// ConfigFrom maps the execution's [DEFAULT] options to a Config; the
// drivers and collaborators are the caller's, and New fills the fields
// left zero.
func ConfigFrom(v *conf.Values) Config {
	return Config{ColdShutdownTimeout: optColdShutdownTimeout.Get(v), CommandTimeout: optCommandTimeout.Get(v),
		ClockSkew: optCommandClockSkew.Get(v), UpgradeCommand: optDriverUpgradeCommand.Get(v),
		UpgradeTimeout: optDriverUpgradeTimeout.Get(v), RetypeCommand: optGPURetypeCommand.Get(v)}
}

// defaults are the values of a configuration that sets nothing.
var defaults = sync.OnceValue(func() Config { return ConfigFrom(conf.Defaults(options)) })
