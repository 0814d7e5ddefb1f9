package bridge

import (
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// retentionOptions document [retention]; its options are package
// controls'. Options assembles them into the daemon's set.
var retentionOptions = conf.NewGroup().
	SectionHelp("retention", "How long the bridge keeps its history (inbox events, dead letters, final requests, "+
		"audit log, diagnostics bundles, published notifications, optionally usage records), and how often it purges what is older (also: vgpu-bridge purge [--dry-run]).")

// RetentionConfig maps [retention] to controls.Retention (package
// controls' options).
func RetentionConfig(v *conf.Values) controls.Retention { return controls.RetentionFrom(v) }
