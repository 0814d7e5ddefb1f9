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
)

// Options returns the options of the commands' execution.
func Options() *conf.Group { return options }

// ConfigFrom maps the execution's [DEFAULT] options to a Config; the
// drivers and collaborators are the caller's, and New fills the fields
// left zero.
func ConfigFrom(v *conf.Values) Config {
	return Config{ColdShutdownTimeout: optColdShutdownTimeout.Get(v), CommandTimeout: optCommandTimeout.Get(v),
		ClockSkew: optCommandClockSkew.Get(v)}
}

// defaults are the values of a configuration that sets nothing.
var defaults = sync.OnceValue(func() Config { return ConfigFrom(conf.Defaults(options)) })
