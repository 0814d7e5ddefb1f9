package keystoneauth

import (
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [keystone] options this package reads, declared once
// with their defaults: the bridge's set takes them from Options, and
// DefaultConfig (the defaults a zero Config field takes) is built from
// them. Which clouds.yaml entry validates tokens is the bridge's.
var options = conf.NewGroup()

var (
	optAdminRoles = options.List("keystone", "admin_roles", "admin",
		"Keystone roles that make a caller an operator API admin (everything, every project): the default of the "+
			"access rule admin ([oslo_policy] policy_file may set it). Example: admin,vgpu-admin")
	optReaderRoles = options.List("keystone", "reader_roles", "reader,member",
		"Keystone roles that make a caller an operator API reader. A reader's project-scoped token sees only that "+
			"project's instances, requests, allocations and events (the routes of class project in /v1/openapi.json, "+
			"x-vgpu-access); the fleet routes (hosts, GPUs, drift, status, controls, audit, placement dry runs, policy "+
			"explanations) answer it 403. A system-scoped token with one of these roles is a fleet reader: it sees "+
			"everything, read-only. The default of the access rules project_reader and fleet_reader "+
			"([oslo_policy] policy_file may set them). Example: reader,member")
	optMemberRoles = options.List("keystone", "member_roles", "member",
		"Of reader_roles, the ones that also let a project-scoped token ask for changes to its project's instances "+
			"(POST /v1/requests, vgpuctl request): the default of the access rule project_member. Example: member")
	optFleetReaderRoles = options.List("keystone", "fleet_reader_roles", "",
		"Keystone roles that make a caller a fleet reader whatever its token's scope: every project and the fleet "+
			"routes, read-only (for a NOC or monitoring account that has no system-scoped token); part of the default "+
			"of the access rule fleet_reader. Example: vgpu-observer")
	optCacheTTL = options.Duration("keystone", "cache_ttl", 5*time.Minute, 0, 24*time.Hour,
		"How long a validated token is trusted before Keystone is asked again (never past the token's expiry): "+
			"the longest a revoked token still works. 0 asks Keystone on every request. Example: 5m").
		Also("keystone_authtoken", "token_cache_time")
	optInvalidCacheTTL = options.Duration("keystone", "invalid_cache_ttl", 10*time.Second, 0, time.Hour,
		"How long a token Keystone refused is answered 401 without asking Keystone again. Example: 10s")
	optCacheSize = options.Int("keystone", "cache_size", 10000, 16, 10000000,
		"Most token validations kept in the cache (the least recently used go first). Example: 10000")
	optWWWAuthenticateURI = options.String("keystone", "www_authenticate_uri", "",
		"The Keystone URL a caller refused for want of a valid token is told to get one from (the 401 answer's "+
			"WWW-Authenticate: Keystone uri=\"...\"), as keystonemiddleware's option of the same name: the public "+
			"identity endpoint. Empty: the auth_url of the clouds.yaml cloud that validates tokens. "+
			"Example: https://keystone.example.org:5000").
		Also("keystone_authtoken", "www_authenticate_uri").
		Also("keystone_authtoken", "auth_uri")
	optTimeout = options.Duration("keystone", "timeout", 10*time.Second, 100*time.Millisecond, 5*time.Minute,
		"Timeout of one call to Keystone; a caller whose token cannot be validated in time gets 503. Example: 10s").
		Also("keystone_authtoken", "http_connect_timeout")
)

// Options returns the [keystone] options declared by this package.
func Options() *conf.Group { return options }

// ConfigFrom maps [keystone] to a Config; the Validator (KeystoneConfig,
// whose Timeout is Config's), the logger and the clock are the caller's.
func ConfigFrom(v *conf.Values) Config {
	return Config{
		AdminRoles:       optAdminRoles.Get(v),
		ReaderRoles:      optReaderRoles.Get(v),
		FleetReaderRoles: optFleetReaderRoles.Get(v),
		MemberRoles:      optMemberRoles.Get(v),
		CacheTTL:         optCacheTTL.Get(v),
		InvalidCacheTTL:  optInvalidCacheTTL.Get(v),
		CacheSize:        optCacheSize.Get(v),
		Timeout:          optTimeout.Get(v),
		ChallengeURI:     optWWWAuthenticateURI.Get(v),
	}
}

var defaults = sync.OnceValue(func() Config { return ConfigFrom(conf.Defaults(options)) })

// DefaultConfig returns the defaults of the [keystone] options: the
// values a zero CacheSize or Timeout takes (zero roles and cache
// lifetimes keep their meaning: none).
func DefaultConfig() Config { return defaults() }
