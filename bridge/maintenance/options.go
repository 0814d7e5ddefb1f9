// SPDX-License-Identifier: Apache-2.0

package maintenance

import (
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [maintenance] timings the Runner reads, declared once
// with their defaults: the bridge's set takes them from Options, and
// DefaultRunConfig (the values a zero RunConfig field takes) is built
// from them.
var options = conf.NewGroup()

var (
	optMigrationTimeout = options.Duration("maintenance", "migration_timeout", 30*time.Minute, time.Minute, 24*time.Hour,
		"How long host maintenance waits for one Nova move (a cold or live migration) to end before it fails "+
			"that VM. Example: 1h")
	optStepTimeout = options.Duration("maintenance", "step_timeout", 10*time.Minute, 30*time.Second, 24*time.Hour,
		"How long host maintenance waits for a detach or attach through the agent, or for a migration's "+
			"confirm, before it fails that VM. Example: 20m")
	optPollInterval = options.Duration("maintenance", "poll_interval", 2*time.Second, 100*time.Millisecond, time.Minute,
		"How often host maintenance reads Nova's migration records and the server while a VM moves, and a fleet "+
			"upgrade (`vgpuctl fleet upgrade`) the state of each host's step (its VMs' move, the agent's results and "+
			"reports). Example: 5s")
)

// OptionGroup returns the [maintenance] options declared by this package
// (Options is what an operation asks for).
func OptionGroup() *conf.Group { return options }

// RunConfigFrom maps [maintenance] to the Runner's timings; Scan, which
// no option sets, is fixed here.
func RunConfigFrom(v *conf.Values) RunConfig {
	return RunConfig{
		Poll:             optPollInterval.Get(v),
		MigrationTimeout: optMigrationTimeout.Get(v),
		StepTimeout:      optStepTimeout.Get(v),
		Scan:             10 * time.Second,
	}
}

var defaults = sync.OnceValue(func() RunConfig { return RunConfigFrom(conf.Defaults(options)) })

// DefaultRunConfig returns the defaults of the [maintenance] timings: the
// values a zero RunConfig field takes.
func DefaultRunConfig() RunConfig { return defaults() }
