package novaharness

import (
	"fmt"
	"io"
)

// UnifiedLimits runs a Nova with [quota] driver =
// nova.quota.UnifiedLimitsDriver: its API checks a server's create and
// resize against Keystone's unified limits (nova.limit.placement.
// enforce_num_instances_and_flavor, called by nova.compute.api.API.
// _check_quota_for_upsize on a resize) through oslo.limit, which reads the
// limits of the service and region of the endpoint EndpointID
// (oslo_limit.limit._EnforcerUtils.__init__) with the credentials below,
// system-scoped, as a deployment's [oslo_limit] does. Usage is counted
// from Placement's usages of the project (nova.limit.placement._get_usage).
//
// oslo.limit takes a resource with no limit registered as limit 0
// (_EnforcerUtils.get_project_limits), so a test registers servers,
// class:VCPU, class:MEMORY_MB and class:DISK_GB (what
// nova.scheduler.utils.resources_for_limits derives from a flavor) besides
// class:VGPU, or Nova refuses every server. The noauth2 token's project
// ("user:<project>") must be a Keystone project id for a project limit to
// apply to it.
type UnifiedLimits struct {
	// EndpointID is [oslo_limit] endpoint_id: an endpoint in Keystone's
	// catalog whose service and region hold the limits.
	EndpointID string
	// AuthURL is Keystone's identity v3 URL (http://127.0.0.1:5000/v3).
	AuthURL string
	// Username, Password and UserDomainName log oslo.limit in; the user
	// needs a role on the system (Keystone lists a project-scoped token's
	// own project's limits only).
	Username, Password, UserDomainName string
}

// writeConfig appends the configuration to nova.conf: oslo.config merges
// a section that appears twice, the later value winning, so the [quota]
// driver here replaces the default.
func (u *UnifiedLimits) writeConfig(w io.Writer) {
	fmt.Fprintf(w, `
# Options.UnifiedLimits: Keystone's unified limits (nova/limit/placement.py).
[quota]
driver = nova.quota.UnifiedLimitsDriver
[oslo_limit]
endpoint_id = %s
auth_type = password
auth_url = %s
username = %s
password = %s
user_domain_name = %s
system_scope = all
`, u.EndpointID, u.AuthURL, u.Username, u.Password, u.UserDomainName)
}
