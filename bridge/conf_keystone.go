package bridge

import (
	"log/slog"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var (
	optKeystoneCloud = keystoneOptions.String("keystone", "cloud", "",
		"With [api] auth_strategy = keystone: the clouds.yaml entry whose credentials the bridge uses to validate "+
			"callers' tokens (the user needs Keystone's service or admin role). Empty uses [openstack] cloud. "+
			"Example: vgpu-bridge")
	optKeystoneAdminRoles = keystoneOptions.List("keystone", "admin_roles", "admin",
		"Keystone roles that make a caller an operator API admin (everything, every project). "+
			"Example: admin,vgpu-admin")
	optKeystoneReaderRoles = keystoneOptions.List("keystone", "reader_roles", "reader,member",
		"Keystone roles that make a caller an operator API reader. A reader's project-scoped token sees only that "+
			"project's instances, requests, allocations and events (the routes of class project in /v1/openapi.json, "+
			"x-vgpu-access); the fleet routes (hosts, GPUs, drift, status, controls, audit, placement dry runs, policy "+
			"explanations) answer it 403. A system-scoped token with one of these roles is a fleet reader: it sees "+
			"everything, read-only. Example: reader,member")
	optKeystoneMemberRoles = keystoneOptions.List("keystone", "member_roles", "member",
		"Of reader_roles, the ones that also let a project-scoped token ask for changes to its project's instances "+
			"(POST /v1/requests, vgpuctl request). Example: member")
	optKeystoneFleetReaderRoles = keystoneOptions.List("keystone", "fleet_reader_roles", "",
		"Keystone roles that make a caller a fleet reader whatever its token's scope: every project and the fleet "+
			"routes, read-only (for a NOC or monitoring account that has no system-scoped token). Example: vgpu-observer")
	optKeystoneCacheTTL = keystoneOptions.Duration("keystone", "cache_ttl", 5*time.Minute, 0, 24*time.Hour,
		"How long a validated token is trusted before Keystone is asked again (never past the token's expiry): "+
			"the longest a revoked token still works. 0 asks Keystone on every request. Example: 5m")
	optKeystoneInvalidCacheTTL = keystoneOptions.Duration("keystone", "invalid_cache_ttl", 10*time.Second, 0, time.Hour,
		"How long a token Keystone refused is answered 401 without asking Keystone again. Example: 10s")
	optKeystoneCacheSize = keystoneOptions.Int("keystone", "cache_size", 10000, 16, 10000000,
		"Most token validations kept in the cache (the least recently used go first). Example: 10000")
	optKeystoneTimeout = keystoneOptions.Duration("keystone", "timeout", 10*time.Second, 100*time.Millisecond, 5*time.Minute,
		"Timeout of one call to Keystone; a caller whose token cannot be validated in time gets 503. Example: 10s")
)

// keystoneOptions are the options declared in this file; Options assembles them
// into the daemon's set with validateKeystone.
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
	if len(optKeystoneAdminRoles.Get(v)) == 0 && len(optKeystoneReaderRoles.Get(v)) == 0 {
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
	ks, err := keystoneauth.NewKeystone(keystoneauth.KeystoneConfig{Cloud: keystoneCloud(v), Timeout: optKeystoneTimeout.Get(v)})
	if err != nil {
		return keystoneauth.Config{}, err
	}
	return keystoneauth.Config{
		Validator:        ks,
		AdminRoles:       optKeystoneAdminRoles.Get(v),
		ReaderRoles:      optKeystoneReaderRoles.Get(v),
		FleetReaderRoles: optKeystoneFleetReaderRoles.Get(v),
		MemberRoles:      optKeystoneMemberRoles.Get(v),
		CacheTTL:         optKeystoneCacheTTL.Get(v),
		InvalidCacheTTL:  optKeystoneInvalidCacheTTL.Get(v),
		CacheSize:        optKeystoneCacheSize.Get(v),
		Timeout:          optKeystoneTimeout.Get(v),
		Logger:           log,
	}, nil
}
