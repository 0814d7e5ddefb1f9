package bridge

import (
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
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
			"[oslo_limit] endpoint_id, so that Nova and the bridge read one number. Example: 6b9ed2c8e8a84a5d8b0d3c4f2a9e6f10")
	optQuotaProfileEndpointID = quotaOptions.String("quota", "profile_endpoint_id", "",
		"With driver = unified_limits: the bridge's own endpoint in Keystone's catalog; its service and region hold "+
			"the per-profile limits, named vgpu:<profile> (vgpu:T4-4Q). Empty: no per-profile limits. Example: "+
			"0f1e2d3c4b5a69788796a5b4c3d2e1f0")
	optQuotaCacheTTL = quotaOptions.Duration("quota", "cache_ttl", 30*time.Second, 0, time.Hour,
		"With driver = unified_limits: how long limits read from Keystone are used before they are read again "+
			"(usage is read from Placement at each decision). Example: 1m")
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
	if keystoneCloud(v) == "" && optKSAuthURL.Get(v) == "" {
		errs = append(errs, &conf.Error{Section: "quota", Option: "driver",
			Problem: "unified_limits reads Keystone: set [keystone] cloud or auth_url, or [openstack] cloud"})
	}
	return errs
}

// QuotaLimits is the pipeline's source of unified limits: nil with
// driver = bridge.
func QuotaLimits(v *conf.Values, pl *placement.Service) (pipeline.LimitSource, error) {
	if optQuotaDriver.Get(v) != QuotaDriverUnifiedLimits {
		return nil, nil
	}
	ks, err := keystoneClient(v)
	if err != nil {
		return nil, err
	}
	return unifiedlimits.New(unifiedlimits.Config{ComputeEndpointID: optQuotaEndpointID.Get(v),
		ProfileEndpointID: optQuotaProfileEndpointID.Get(v), TTL: optQuotaCacheTTL.Get(v)}, ks, pl.Client())
}
