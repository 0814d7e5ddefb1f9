package bridge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/unifiedlimits"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// Quota drivers ([quota] driver).
const (
	QuotaDriverBridge        = "bridge"
	QuotaDriverUnifiedLimits = "unified_limits"
)

var (
	optQuotaDriver = quotaOptions.Choice("quota", "driver", QuotaDriverBridge,
		[]string{QuotaDriverBridge, QuotaDriverUnifiedLimits},
		"Where the limits on a project's vGPUs come from. bridge: the policy file's quotas only. unified_limits: "+
			"also Keystone's unified limits, the numbers Nova enforces with [quota] driver = "+
			"nova.quota.UnifiedLimitsDriver: class:VGPU of the compute service (every vGPU of the project, flavor or "+
			"direct-path, counted from Placement as Nova counts it) and the bridge's own vgpu:<profile> limits. The "+
			"policy file's quotas still apply. Example: unified_limits")
	optQuotaEndpointID = quotaOptions.String("quota", "endpoint_id", "",
		"With driver = unified_limits: the compute endpoint whose service and region hold class:VGPU, Nova's "+
			"[oslo_limit] endpoint_id, so that Nova and the bridge read one number. Example: 6b9ed2c8e8a84a5d8b0d3c4f2a9e6f10").
		Also("oslo_limit", "endpoint_id")
	// The credentials the limits are read with: a clouds.yaml entry, or
	// oslo.limit's own options, so that nova.conf's [oslo_limit] can be
	// pasted; else [keystone]'s. Keystone lists a project-scoped token's
	// own project's limits only: they must be system-scoped.
	optQuotaCloud = quotaOptions.String("quota", "cloud", "",
		"With driver = unified_limits: the clouds.yaml entry whose credentials read the limits; it must be "+
			"system-scoped (system_scope: all) with the reader role on the system, as oslo.limit's. Empty: auth_url "+
			"and the options below when auth_url is set, else [keystone]'s credentials. Example: vgpu-bridge-limits")
	optQuotaAuthURL = quotaOptions.String("quota", "auth_url", "",
		"With driver = unified_limits and cloud empty: the Keystone URL the limits are read at, with the "+
			"credentials below (oslo.limit's options of the same names: [oslo_limit] of nova.conf can be pasted, "+
			"with a user of the bridge's). Example: https://keystone-internal.example.org:5000").Also("oslo_limit", "auth_url")
	optQuotaUsername = quotaOptions.String("quota", "username", "",
		"With auth_url: the user. Example: vgpu-bridge").Also("oslo_limit", "username")
	optQuotaPassword = quotaOptions.Secret("quota", "password",
		"With auth_url: its password. Example: secret").Also("oslo_limit", "password")
	optQuotaUserDomainName = quotaOptions.String("quota", "user_domain_name", "",
		"With auth_url: the user's domain, by name. Example: Default").Also("oslo_limit", "user_domain_name")
	optQuotaUserDomainID = quotaOptions.String("quota", "user_domain_id", "",
		"With auth_url: the user's domain, by id. Example: default").Also("oslo_limit", "user_domain_id")
	optQuotaSystemScope = quotaOptions.Choice("quota", "system_scope", "all", []string{"all"},
		"With auth_url: the token's scope, the system (the only scope Keystone lists every project's limits to). "+
			"Example: all").Also("oslo_limit", "system_scope")
	optQuotaCAFile = quotaOptions.String("quota", "cafile", "",
		"With auth_url: PEM CA bundle Keystone's certificate is verified with; empty uses the system's. "+
			"Example: /etc/ssl/certs/ca-bundle.pem").Also("oslo_limit", "cafile")
	optQuotaProfileEndpointID = quotaOptions.String("quota", "profile_endpoint_id", "",
		"With driver = unified_limits: the bridge's own endpoint in Keystone's catalog; its service and region hold "+
			"the per-profile limits, named vgpu:<profile> (vgpu:T4-4Q). Empty: no per-profile limits. Example: "+
			"0f1e2d3c4b5a69788796a5b4c3d2e1f0")
	optQuotaCacheTTL = quotaOptions.Duration("quota", "cache_ttl", 30*time.Second, 0, time.Hour,
		"With driver = unified_limits: how long limits read from Keystone are used before they are read again "+
			"(usage is read from Placement at each decision). Example: 1m")
	optQuotaRefreshInterval = quotaOptions.Duration("quota", "refresh_interval", 20*time.Second, 0, time.Hour,
		"With driver = unified_limits: how often the limits of the projects asked for in the last hour are read again "+
			"in the background, so that a decision finds them read instead of waiting for Keystone; shorter than "+
			"cache_ttl keeps them from expiring. A failed read keeps the limits read before until they are older than "+
			"cache_ttl; then decisions that add vGPUs wait for Keystone. 0: read only when a decision finds them older "+
			"than cache_ttl. Example: 20s")
)

// quotaOptions are the [quota] options; Options assembles them into the
// daemon's set with validateQuota.
var quotaOptions = conf.NewGroup().
	SectionHelp("quota", "Where a project's vGPU limits come from: the policy file, and optionally Keystone's unified limits.")

func validateQuota(v *conf.Values) conf.Errors {
	if optQuotaDriver.Get(v) != QuotaDriverUnifiedLimits {
		return nil
	}
	var errs conf.Errors
	if optQuotaEndpointID.Get(v) == "" {
		errs = append(errs, &conf.Error{Section: "quota", Option: "endpoint_id",
			Problem: "is required with driver = unified_limits; allowed: the compute endpoint id of Nova's [oslo_limit] endpoint_id"})
	}
	if optQuotaCloud.Get(v) == "" && optQuotaAuthURL.Get(v) == "" && keystoneCloud(v) == "" && optKSAuthURL.Get(v) == "" {
		errs = append(errs, &conf.Error{Section: "quota", Option: "driver",
			Problem: "unified_limits reads Keystone: set [quota] cloud or auth_url, [keystone] cloud or auth_url, or [openstack] cloud"})
	}
	return errs
}

// QuotaLimits is the pipeline's source of unified limits: nil with
// driver = bridge. Its Run refreshes them ([quota] refresh_interval).
func QuotaLimits(v *conf.Values, pl *placement.Service, log *slog.Logger) (*unifiedlimits.Source, error) {
	if optQuotaDriver.Get(v) != QuotaDriverUnifiedLimits {
		return nil, nil
	}
	ks, err := quotaKeystone(v)
	if err != nil {
		return nil, err
	}
	return unifiedlimits.New(unifiedlimits.Config{ComputeEndpointID: optQuotaEndpointID.Get(v),
		ProfileEndpointID: optQuotaProfileEndpointID.Get(v), TTL: optQuotaCacheTTL.Get(v), Refresh: optQuotaRefreshInterval.Get(v),
		Log: log}, ks, pl.Client())
}

// quotaKeystone is the Keystone client the limits are read with: [quota]
// cloud, else [quota] auth_url's credentials (oslo.limit's), else the
// bridge's [keystone] client (keystoneClient).
func quotaKeystone(v *conf.Values) (*keystoneauth.Keystone, error) {
	kc := keystoneauth.KeystoneConfig{Cloud: optQuotaCloud.Get(v), Timeout: keystoneauth.ConfigFrom(v).Timeout}
	switch {
	case kc.Cloud != "":
	case optQuotaAuthURL.Get(v) != "":
		a := &clouds.AuthInfo{AuthURL: optQuotaAuthURL.Get(v), Username: optQuotaUsername.Get(v), Password: optQuotaPassword.Get(v),
			UserDomainName: optQuotaUserDomainName.Get(v), UserDomainID: optQuotaUserDomainID.Get(v), SystemScope: optQuotaSystemScope.Get(v)}
		b, err := json.Marshal(clouds.Clouds{Clouds: map[string]clouds.Cloud{quotaCredentialsName: {AuthType: clouds.AuthV3Password,
			AuthInfo: a, CACertFile: optQuotaCAFile.Get(v)}}})
		if err != nil {
			return nil, fmt.Errorf("[quota] credentials: %w", err)
		}
		kc.Cloud, kc.ParseOptions = quotaCredentialsName, []clouds.ParseOption{clouds.WithCloudsYAML(bytes.NewReader(b))}
	default:
		return keystoneClient(v)
	}
	return keystoneauth.NewKeystone(kc)
}

// quotaCredentialsName names [quota] auth_url's credentials as a
// clouds.yaml entry.
const quotaCredentialsName = "vgpu-bridge-quota"
