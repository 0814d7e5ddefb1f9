package controls

import (
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [retention] options the purge reads, declared once with
// their defaults: the bridge's set takes them from Options, and
// DefaultRetention (what a zero BatchSize takes) is built from them.
var options = conf.NewGroup()

const day = 24 * time.Hour

var (
	optEvents = options.Duration("retention", "events", 30*day, 0, 100*365*day,
		"Age (by received_at) after which processed inbox events, and the decisions of those that made no request, "+
			"are purged; 0 keeps them forever. Unprocessed events are never purged. Example: 720h")
	optDeadLetters = options.Duration("retention", "dead_letters", 30*day, 0, 100*365*day,
		"Age after which dead letters are purged; 0 keeps them forever. Example: 720h")
	optRequests = options.Duration("retention", "requests", 90*day, 0, 100*365*day,
		"Age (since they reached a final state: succeeded, failed, rejected) after which requests are purged with "+
			"their commands, decisions and callbacks; requests with a callback still to deliver or a command still "+
			"unanswered are kept. 0 keeps them forever. Example: 2160h")
	optAudit = options.Duration("retention", "audit", 365*day, 0, 100*365*day,
		"Age after which audit log rows are purged; 0 keeps them forever. Example: 8760h")
	optDiagnostics = options.Duration("retention", "diagnostics", 7*day, 0, 100*365*day,
		"Age (by requested_at) after which diagnostics bundles (vgpuctl diagnose, up to the agents' max_bundle_bytes "+
			"each, kept in Postgres) are purged with their collect_diagnostics commands; 0 keeps them forever. Example: 72h")
	optNotifications = options.Duration("retention", "notifications", 7*day, 0, 100*365*day,
		"Age (by sent_at) after which the bridge's own notifications, once published, are purged from its outbox; "+
			"unpublished ones are kept. 0 keeps them forever. Example: 72h")
	optUsage = options.Duration("retention", "usage", 0, 0, 100*365*day,
		"Age (by ended_at) after which accounted vGPU usage intervals are purged, once within a closed audit period, "+
			"with the closed periods that ended before it (GET /v1/usage then no longer sees them). These are billing "+
			"records: 0, the default, keeps them forever. Example: 17520h")
	optInterval = options.Duration("retention", "purge_interval", time.Hour, time.Minute, 7*day,
		"Time between purge rounds. One replica purges at a time (advisory lock); the others skip the round. Example: 6h")
	optBatch = options.Int("retention", "batch_size", 1000, 10, 100000,
		"Rows deleted per statement and transaction, so a purge never holds long locks. Example: 5000")
)

// Options returns the [retention] options declared by this package, with
// their check.
func Options() *conf.Group { return options.WithCheck(check) }

// check tests the values of the options.
func check(v *conf.Values) conf.Errors {
	var errs conf.Errors
	for _, o := range []struct {
		name string
		d    time.Duration
	}{{"events", optEvents.Get(v)}, {"dead_letters", optDeadLetters.Get(v)},
		{"requests", optRequests.Get(v)}, {"audit", optAudit.Get(v)},
		{"diagnostics", optDiagnostics.Get(v)}, {"notifications", optNotifications.Get(v)},
		{"usage", optUsage.Get(v)}} {
		if o.d > 0 && o.d < time.Hour {
			errs = append(errs, &conf.Error{Section: "retention", Option: o.name, Value: o.d.String(),
				Problem: "is below an hour; allowed: 0 (keep forever) or 1h and more"})
		}
	}
	return errs
}

// RetentionFrom maps [retention] to a Retention.
func RetentionFrom(v *conf.Values) Retention {
	return Retention{
		Events:        optEvents.Get(v),
		DeadLetters:   optDeadLetters.Get(v),
		Requests:      optRequests.Get(v),
		Audit:         optAudit.Get(v),
		Diagnostics:   optDiagnostics.Get(v),
		Notifications: optNotifications.Get(v),
		Usage:         optUsage.Get(v),
		Interval:      optInterval.Get(v),
		BatchSize:     optBatch.Get(v),
	}
}

var defaults = sync.OnceValue(func() Retention { return RetentionFrom(conf.Defaults(options)) })

// DefaultRetention returns the defaults of the [retention] options.
func DefaultRetention() Retention { return defaults() }
