package bridge

import (
	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var optAccessPolicyFile = accessOptions.String("oslo_policy", "policy_file", "",
	"A YAML file of operator API access rules that override the defaults, in oslo.policy's language, as an "+
		"OpenStack service's policy.yaml: e.g. \"vgpu:hosts:drain\": \"rule:admin or role:vgpu-maintainer\" lets "+
		"that Keystone role drain hosts without being admin. `vgpu-bridge genpolicy` writes every rule with its "+
		"default (etc/vgpu-bridge/policy.yaml.sample); the defaults of the base rules admin, fleet_reader, "+
		"project_reader and project_member follow the [keystone] role options. Read at start: a file that does not "+
		"parse, names an unknown vgpu: rule or refers to an undefined rule stops the bridge (and fails "+
		"`vgpu-bridge config check`). SIGHUP reads it again (a new path too), checked first: a file that does not load "+
		"is refused with its reason and the rules in use stay; tokens already validated are judged by the new rules "+
		"from their next request. Empty: the defaults. While [policy] rules_file "+
		"falls back to the deprecated /etc/vgpu-bridge/policy.yaml, that file cannot be this one. "+
		"Example: /etc/vgpu-bridge/policy.yaml")

// accessOptions are the options declared in this file; Options
// assembles them into the daemon's set with validateAccess.
var accessOptions = conf.NewGroup().
	SectionHelp("oslo_policy", "Access rules of the operator API (see doc/source/reference/policy.rst).")

// validateAccess reads the policy file, so that `config check` and the
// start refuse one that does not load, naming its line (and role names
// the base rules' defaults cannot be written with).
func validateAccess(v *conf.Values) conf.Errors {
	path := optAccessPolicyFile.Get(v)
	if rules, deprecated := RulesFile(v); path != "" && deprecated && rules == path {
		return conf.Errors{&conf.Error{Section: "oslo_policy", Option: "policy_file", Value: path,
			Problem: "is also read as [policy] rules_file (the deprecated default); rename the rules file to " +
				defaultRulesFile + " or set [policy] rules_file"}}
	}
	if _, err := AccessPolicy(v); err != nil {
		return conf.Errors{&conf.Error{Section: "oslo_policy", Option: "policy_file", Value: path, Problem: err.Error()}}
	}
	return nil
}

// AccessPolicy loads the operator API's access rules: the defaults,
// written from the [keystone] role options with auth_strategy = keystone
// (else from the token file's role names), and [oslo_policy] policy_file.
func AccessPolicy(v *conf.Values) (*api.Policy, error) {
	return api.LoadPolicy(accessRoleNames(v), optAccessPolicyFile.Get(v))
}

// accessRoleNames are the role names the base rules' defaults are written
// with: [keystone]'s with Keystone, the token file's otherwise.
func accessRoleNames(v *conf.Values) api.RoleNames {
	if optAPIAuth.Get(v) == "keystone" {
		return keystoneauth.ConfigFrom(v).RoleNames()
	}
	return api.StaticRoleNames()
}

// AccessRoleNames are the role names the sample and the reference write
// the base rules' defaults with: the [keystone] options' defaults, which
// are also the token file's role names.
func AccessRoleNames() api.RoleNames {
	return keystoneauth.DefaultConfig().RoleNames()
}
