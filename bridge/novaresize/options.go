package novaresize

import (
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [nova] timings of the Nova-native path, declared once
// with their defaults: the bridge's set takes them from Options, and
// DefaultConfig is built from them. Nova's client settings, also in
// [nova], are the bridge's.
var options = conf.NewGroup()

var (
	optResizeTimeout = options.Duration("nova", "resize_timeout", 10*time.Minute, time.Second, 24*time.Hour,
		"How long Nova may take from the resize call to instance.resize_finish.end (the disk copy of a cold migration "+
			"included). A resize still running then is followed to its end (the request shows phase overdue) and "+
			"then handled as on_deadline says. Example: 30m")
	optOnDeadline = options.Choice("nova", "on_deadline", OnDeadlineRevert, []string{OnDeadlineRevert, OnDeadlineConfirm},
		"What becomes of a resize Nova finishes after resize_timeout: revert (the server goes back to its flavor, "+
			"the request fails with code nova_timeout) or confirm (the vGPU is verified and the resize confirmed as if "+
			"it were on time). Either way the server is never left in VERIFY_RESIZE. Example: confirm")
	optOverdueCheck = options.Duration("nova", "overdue_check_interval", 10*time.Second, 100*time.Millisecond, time.Hour,
		"How often the server of a resize past its deadline is read while the bridge follows it to its end. Example: 30s")
	optVerifyTimeout = options.Duration("nova", "verify_timeout", 2*time.Minute, time.Second, 24*time.Hour,
		"How long the target host's agent may take to answer verify_vgpu after the resize; past it the resize is "+
			"reverted and the request fails with code agent_timeout. Example: 5m")
	optConfirmTimeout = options.Duration("nova", "confirm_timeout", 5*time.Minute, time.Second, 24*time.Hour,
		"How long confirmResize or revertResize may take to their .end notification; the server is read then "+
			"and the request ends by what it shows. Example: 10m")
	optPollInterval = options.Duration("nova", "poll_interval", 500*time.Millisecond, 10*time.Millisecond, time.Minute,
		"How often each replica looks for due Nova calls and passed deadlines of resizes. Example: 1s")
)

// Options returns the path's [nova] options.
func Options() *conf.Group { return options }

// ConfigFrom maps the path's [nova] options to a Config. CallLease (the
// bridge sets it from [nova] timeout), the [pipeline] fields and Replica
// are the caller's; setDefaults fills those left zero.
func ConfigFrom(v *conf.Values) Config {
	return Config{
		ResizeTimeout:  optResizeTimeout.Get(v),
		VerifyTimeout:  optVerifyTimeout.Get(v),
		ConfirmTimeout: optConfirmTimeout.Get(v),
		PollInterval:   optPollInterval.Get(v),
		OnDeadline:     optOnDeadline.Get(v),
		OverdueCheck:   optOverdueCheck.Get(v),
	}
}

// DefaultConfig returns the defaults of the path's [nova] options, and a
// CallLease of 2m.
func DefaultConfig() Config {
	c := ConfigFrom(conf.Defaults(options))
	c.CallLease = 2 * time.Minute
	return c
}
