package transport

import (
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [DEFAULT] options of the command loop and the reports, declared once
// with their defaults: the agent's set takes them from Options, and the
// defaults of the fields they set come from them.
var options = conf.NewGroup()

var (
	optReportInterval = options.Duration(conf.DefaultSection, "report_interval", time.Minute, 5*time.Second, time.Hour,
		"Period of the full reports sent to the bridge on report.<host>; a report is also sent at start and when "+
			"the host changes. Keep it well under the bridge's maximum report age. Example: 30s")
	optReportCheckInterval = options.Duration(conf.DefaultSection, "report_check_interval", 10*time.Second, time.Second, time.Hour,
		"How often the agent looks at the host for a change (a new mdev, a VM started) that is reported before "+
			"report_interval ends. Example: 5s")
	optPrefetch = options.Int(conf.DefaultSection, "command_prefetch", 1, 1, 64,
		"Commands RabbitMQ may deliver before the agent acknowledges them. Commands run one at a time; more only "+
			"hides the network round trip. Example: 4")
	optReconnectMaxBackoff = options.Duration(conf.DefaultSection, "reconnect_max_backoff", 30*time.Second, time.Second, 10*time.Minute,
		"Longest wait between attempts to reconnect to RabbitMQ (the wait doubles from 0.5s up to this, with "+
			"jitter). Example: 1m")
)

// Options returns the options of the command loop and the reports.
func Options() *conf.Group { return options }

// ConfigFrom maps the command loop's [DEFAULT] options to a Config; the
// broker, host, collaborators and the fields no option sets are the
// caller's, and New fills those left zero.
func ConfigFrom(v *conf.Values) Config {
	return Config{Prefetch: optPrefetch.Get(v), MaxBackoff: optReconnectMaxBackoff.Get(v),
		ReportInterval: optReportInterval.Get(v), ReportCheckInterval: optReportCheckInterval.Get(v)}
}

// defaults are the values of a configuration that sets nothing.
var defaults = sync.OnceValue(func() Config { return ConfigFrom(conf.Defaults(options)) })
