package bridge

import (
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// Options declares every option of vgpu-bridge. Each section's options are
// declared in a file conf_<section>.go of this package, next to the code
// that turns them into a feature's Config.
var Options = conf.NewSet("VGPU_BRIDGE")

// SampleTitle heads etc/vgpu-bridge/bridge.conf.sample.
const SampleTitle = "vgpu-bridge: sample configuration (/etc/vgpu-bridge/bridge.conf)"

// ReferenceTitle heads the documentation's reference of bridge.conf.
const ReferenceTitle = "vgpu-bridge configuration (bridge.conf)"

// LoadConfig loads and validates the configuration.
func LoadConfig(src conf.Source) (*conf.Values, error) {
	v, err := Options.Load(src)
	if v == nil {
		return nil, err
	}
	errs, _ := conf.AsErrors(err)
	if errs = append(errs, validate(v)...); len(errs) > 0 {
		errs.Sort()
		return nil, errs
	}
	return v, nil
}

// validators check relations between options after each value parsed;
// conf_<section>.go files add theirs in init.
var validators []func(v *conf.Values) conf.Errors

func validate(v *conf.Values) conf.Errors {
	var errs conf.Errors
	for _, f := range validators {
		errs = append(errs, f(v)...)
	}
	return errs
}

// Renamed and removed options are listed here, each still read with a
// warning for one release (conf.Set.Deprecated), in an init function:
//
//	Options.Deprecated("old_section", "old_name", "new_section", "new_name")
//
// (new_name "" for an option that was removed). None so far.
