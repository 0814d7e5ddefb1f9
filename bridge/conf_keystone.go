package bridge

import (
	"cmp"
	"log/slog"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var (
	optKeystoneCloud = keystoneOptions.String("keystone", "cloud", "",
		"With [api] auth_strategy = keystone: the clouds.yaml entry whose credentials the bridge uses to validate "+
			"callers' tokens (the user needs Keystone's service or admin role). Empty uses [openstack] cloud. "+
			"Example: vgpu-bridge")
)

// keystoneOptions are the options declared in this file, the clouds.yaml
// entry (the rest of [keystone] is package keystoneauth's); Options
// assembles them into the daemon's set with validateKeystone.
var keystoneOptions = conf.NewGroup().
	SectionHelp("keystone", "Keystone authentication of the operator API ([api] auth_strategy = keystone).")

// validateKeystone tests relations between the options of this file.
func validateKeystone(v *conf.Values) conf.Errors {
	if optAPIAuth.Get(v) != "keystone" {
		return nil
	}
	var errs conf.Errors
	if keystoneCloud(v) == "" {
		errs = append(errs, &conf.Error{Section: "keystone", Option: "cloud",
			Problem: "is required when [api] auth_strategy = keystone (or set [openstack] cloud); allowed: a clouds.yaml entry name"})
	}
	if kc := keystoneauth.ConfigFrom(v); len(kc.AdminRoles) == 0 && len(kc.ReaderRoles) == 0 {
		errs = append(errs, &conf.Error{Section: "keystone", Option: "admin_roles",
			Problem: "admin_roles and reader_roles are both empty; allowed: Keystone role names, e.g. admin"})
	}
	return errs
}

func keystoneCloud(v *conf.Values) string {
	if c := optKeystoneCloud.Get(v); c != "" {
		return c
	}
	return optOpenStackCloud.Get(v)
}

// KeystoneAuthConfig maps [keystone] to the Authenticator's configuration
// (reading clouds.yaml, without logging in).
func KeystoneAuthConfig(v *conf.Values, log *slog.Logger) (keystoneauth.Config, error) {
	c := keystoneauth.ConfigFrom(v)
	ks, err := keystoneauth.NewKeystone(keystoneauth.KeystoneConfig{Cloud: keystoneCloud(v), Timeout: c.Timeout})
	if err != nil {
		return keystoneauth.Config{}, err
	}
	c.Validator, c.Logger = ks, log
	c.ChallengeURI = cmp.Or(c.ChallengeURI, ks.AuthURL())
	return c, nil
}
