package placement

import (
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [placement] options this package's code reads and that
// other features share (the rest of [placement], the client's settings,
// are the bridge's). The bridge's set takes them from Options.
var options = conf.NewGroup()

var optStaleReportAge = options.Duration("placement", "stale_report_age", 5*time.Minute, 10*time.Second, 24*time.Hour,
	"A host whose last agent report is older than this is left out of placement decisions "+
		"(hosts that never reported are not). Example: 3m")

// Options returns the [placement] options declared by this package.
func Options() *conf.Group { return options }

// StaleReportAge is [placement] stale_report_age: hosts whose last agent
// report is older are left out of decisions.
func StaleReportAge(v *conf.Values) time.Duration { return optStaleReportAge.Get(v) }

// defaultStaleReportAge is stale_report_age's declared default.
func defaultStaleReportAge() time.Duration { return StaleReportAge(conf.Defaults(options)) }
