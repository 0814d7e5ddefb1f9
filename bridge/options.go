package bridge

import (
	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/drift"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/maintenance"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/novaresize"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// SampleTitle heads etc/vgpu-bridge/bridge.conf.sample.
const SampleTitle = "vgpu-bridge: sample configuration (/etc/vgpu-bridge/bridge.conf)"

// ReferenceTitle heads the documentation's reference of bridge.conf.
const ReferenceTitle = "vgpu-bridge configuration (bridge.conf)"

// Options assembles the options of vgpu-bridge. Each option is declared
// once, with its default, in a conf.Group: a feature package's own
// (pipeline.Options, whose DefaultConfig is built from the same
// declarations), or a file conf_<section>.go of this package for what the
// bridge's wiring reads itself; the checks of relations between options
// go with their group, and run in this order.
//
// Renamed and removed options are listed here, each still read with a
// warning for one release:
//
//	s := conf.NewSet("VGPU_BRIDGE", ...)
//	s.Deprecated("old_section", "old_name", "new_section", "new_name")
//
// (new_name "" for an option that was removed).
func Options() *conf.Set {
	s := conf.NewSet("VGPU_BRIDGE",
		accessOptions.WithCheck(validateAccess),
		accountingOptions.WithCheck(validateAccounting),
		apiOptions.WithCheck(validateAPI),
		api.Options(),
		databaseOptions.WithCheck(validateDatabase),
		defaultOptions.WithCheck(validateDefault),
		dispatch.Options(),
		drift.Options(),
		keystoneOptions.WithCheck(validateKeystone),
		keystoneauth.Options(),
		maintenanceOptions,
		maintenance.OptionGroup(),
		notificationsOptions.WithCheck(validateNotifications),
		ingest.Options(),
		notify.Options(),
		novaOptions.WithCheck(validateNova),
		computeapi.Options(),
		novaresize.Options(),
		openstackOptions,
		pipeline.Options(),
		placementOptions,
		placement.Options(),
		policyOptions.WithCheck(validatePolicy),
		quotaOptions.WithCheck(validateQuota),
		retentionOptions,
		controls.Options(),
		securityOptions.WithCheck(validateSecurity),
		webhooksOptions.WithCheck(validateWebhooks),
		webhook.Options(),
	)
	// Bridge-owned GPUs are mdev GPUs too, not VF GPUs only.
	s.Deprecated("placement", "bridge_owned_vf_gpus", "placement", "bridge_owned_gpus")
	return s
}

// LoadConfig loads and validates the configuration.
func LoadConfig(src conf.Source) (*conf.Values, error) {
	s := Options()
	v, err := s.Load(src)
	if v == nil {
		return nil, err
	}
	errs, _ := conf.AsErrors(err)
	if errs = append(errs, s.Check(v)...); len(errs) > 0 {
		errs.Sort()
		return nil, errs
	}
	return v, nil
}
