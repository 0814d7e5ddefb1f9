package bridge

import (
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

const day = 24 * time.Hour

var (
	optRetentionEvents = retentionOptions.Duration("retention", "events", 30*day, 0, 100*365*day,
		"Age (by received_at) after which processed inbox events, and the decisions of those that made no request, "+
			"are purged; 0 keeps them forever. Unprocessed events are never purged. Example: 720h")
	optRetentionDeadLetters = retentionOptions.Duration("retention", "dead_letters", 30*day, 0, 100*365*day,
		"Age after which dead letters are purged; 0 keeps them forever. Example: 720h")
	optRetentionRequests = retentionOptions.Duration("retention", "requests", 90*day, 0, 100*365*day,
		"Age (since they reached a final state: succeeded, failed, rejected) after which requests are purged with "+
			"their commands, decisions and callbacks; requests with a callback still to deliver or a command still "+
			"unanswered are kept. 0 keeps them forever. Example: 2160h")
	optRetentionAudit = retentionOptions.Duration("retention", "audit", 365*day, 0, 100*365*day,
		"Age after which audit log rows are purged; 0 keeps them forever. Example: 8760h")
	optRetentionDiagnostics = retentionOptions.Duration("retention", "diagnostics", 7*day, 0, 100*365*day,
		"Age (by requested_at) after which diagnostics bundles (vgpuctl diagnose, up to the agents' max_bundle_bytes "+
			"each, kept in Postgres) are purged with their collect_diagnostics commands; 0 keeps them forever. Example: 72h")
	optRetentionNotifications = retentionOptions.Duration("retention", "notifications", 7*day, 0, 100*365*day,
		"Age (by sent_at) after which the bridge's own notifications, once published, are purged from its outbox; "+
			"unpublished ones are kept. 0 keeps them forever. Example: 72h")
	optRetentionUsage = retentionOptions.Duration("retention", "usage", 0, 0, 100*365*day,
		"Age (by ended_at) after which accounted vGPU usage intervals are purged, once within a closed audit period, "+
			"with the closed periods that ended before it (GET /v1/usage then no longer sees them). These are billing "+
			"records: 0, the default, keeps them forever. Example: 17520h")
	optRetentionInterval = retentionOptions.Duration("retention", "purge_interval", time.Hour, time.Minute, 7*day,
		"Time between purge rounds. One replica purges at a time (advisory lock); the others skip the round. Example: 6h")
	optRetentionBatch = retentionOptions.Int("retention", "batch_size", 1000, 10, 100000,
		"Rows deleted per statement and transaction, so a purge never holds long locks. Example: 5000")
)

// retentionOptions are the options declared in this file; Options assembles them
// into the daemon's set with validateRetention.
var retentionOptions = conf.NewGroup().
	SectionHelp("retention", "How long the bridge keeps its history (inbox events, dead letters, final requests, "+
		"audit log, diagnostics bundles, published notifications, optionally usage records), and how often it purges what is older (also: vgpu-bridge purge [--dry-run]).")

// validateRetention tests relations between the options of this file.
func validateRetention(v *conf.Values) conf.Errors {
	var errs conf.Errors
	for _, o := range []struct {
		name string
		d    time.Duration
	}{{"events", optRetentionEvents.Get(v)}, {"dead_letters", optRetentionDeadLetters.Get(v)},
		{"requests", optRetentionRequests.Get(v)}, {"audit", optRetentionAudit.Get(v)},
		{"diagnostics", optRetentionDiagnostics.Get(v)}, {"notifications", optRetentionNotifications.Get(v)},
		{"usage", optRetentionUsage.Get(v)}} {
		if o.d > 0 && o.d < time.Hour {
			errs = append(errs, &conf.Error{Section: "retention", Option: o.name, Value: o.d.String(),
				Problem: "is below an hour; allowed: 0 (keep forever) or 1h and more"})
		}
	}
	return errs
}

// RetentionConfig maps [retention] to controls.Retention.
func RetentionConfig(v *conf.Values) controls.Retention {
	return controls.Retention{
		Events:        optRetentionEvents.Get(v),
		DeadLetters:   optRetentionDeadLetters.Get(v),
		Requests:      optRetentionRequests.Get(v),
		Audit:         optRetentionAudit.Get(v),
		Diagnostics:   optRetentionDiagnostics.Get(v),
		Notifications: optRetentionNotifications.Get(v),
		Usage:         optRetentionUsage.Get(v),
		Interval:      optRetentionInterval.Get(v),
		BatchSize:     optRetentionBatch.Get(v),
	}
}
