package api

import (
	"fmt"
	"strings"
)

// A Rule is a named access rule, as OpenStack services name theirs in
// policy.yaml: its default (in oslo.policy's check language), what it
// means, and the routes it guards. An operator overrides it in [oslo_policy]
// policy_file; `vgpu-bridge genpolicy` writes every rule with its default.
type Rule struct {
	Name string
	// Default is the rule's check when the policy file does not set it.
	Default     string
	Description string
	// Routes are "METHOD /path" as in /v1/openapi.json; none for a base
	// rule, which routes' rules refer to with rule:NAME.
	Routes []string
	// Class is the access class the default gives the routes
	// (x-vgpu-access): Handle refuses a route whose class is not its
	// rule's, so that the document states what the defaults enforce.
	Class Access
}

// The base rules: who a caller is. The [keystone] role lists (or, with
// static tokens, the token file's roles) write their defaults; the route
// rules refer to them.
const (
	// RuleAdmin: an operator API admin (everything, every project).
	RuleAdmin = "admin"
	// RuleFleetReader: reads every project and the fleet routes.
	RuleFleetReader = "fleet_reader"
	// RuleProjectReader: reads its own project's instances, requests,
	// allocations and events (project_id:%(project_id)s: the target of
	// a route is the caller's own project; the handlers filter by it).
	RuleProjectReader = "project_reader"
	// RuleProjectMember: a project reader that may also ask for changes
	// to its project's instances.
	RuleProjectMember = "project_member"
	// RuleMaintenance: may take hosts and GPUs out of service (drain,
	// migrate all off a host) and follow that work.
	RuleMaintenance = "maintenance"
)

// RoleNames are the role names the base rules' defaults are written
// with: [keystone] admin_roles, reader_roles, member_roles and
// fleet_reader_roles, or the token file's admin, reader and member.
type RoleNames struct {
	Admin, Reader, Member, FleetReader []string
}

// StaticRoleNames are the roles of static tokens (token file, noauth):
// a token's credentials hold its role's name.
func StaticRoleNames() RoleNames {
	return RoleNames{Admin: []string{"admin"}, Reader: []string{"reader", "member"}, Member: []string{"member"}}
}

// The defaults of the route rules, by class.
const (
	defaultProject = "rule:admin or rule:fleet_reader or rule:project_reader"
	defaultFleet   = "rule:admin or rule:fleet_reader"
	defaultAdmin   = "rule:admin"
	defaultMaint   = "rule:maintenance"
)

// routeRules are the rules that guard the operator API's routes, one per
// route or per routes that do one thing (a drain and its undo).
var routeRules = []Rule{
	{Name: "vgpu:status:get", Default: defaultFleet, Class: Fleet,
		Description: "Read the fleet's status summary.", Routes: []string{"GET /v1/status"}},
	{Name: "vgpu:usage:get", Default: defaultProject, Class: Project,
		Description: "Read vGPU usage (a project reader: its project's).", Routes: []string{"GET /v1/usage"}},
	{Name: "vgpu:quota:get", Default: defaultProject, Class: Project,
		Description: "Read a project's vGPU limits and usage (a project reader: its project's).", Routes: []string{"GET /v1/quota"}},
	{Name: "vgpu:profiles:list", Default: defaultProject, Class: Project,
		Description: "List the vGPU profiles.", Routes: []string{"GET /v1/profiles"}},
	{Name: "vgpu:instances:list", Default: defaultProject, Class: Project,
		Description: "List instances (a project reader: its project's).", Routes: []string{"GET /v1/instances"}},
	{Name: "vgpu:instances:get", Default: defaultProject, Class: Project,
		Description: "Read an instance (a project reader: one of its project's).", Routes: []string{"GET /v1/instances/{uuid}"}},
	{Name: "vgpu:events:list", Default: defaultProject, Class: Project,
		Description: "List the events received (a project reader: its project's).", Routes: []string{"GET /v1/events"}},
	{Name: "vgpu:allocations:list", Default: defaultProject, Class: Project,
		Description: "List vGPU allocations (a project reader: its project's, without hosts).", Routes: []string{"GET /v1/allocations"}},
	{Name: "vgpu:requests:list", Default: defaultProject, Class: Project,
		Description: "List requests (a project reader: its project's).", Routes: []string{"GET /v1/requests"}},
	{Name: "vgpu:requests:get", Default: defaultProject, Class: Custom,
		Description: "Read a request with operator credentials (a project reader: one of its project's). " +
			"The source that made the request may read it with its own credentials whatever this rule says.",
		Routes: []string{"GET /v1/requests/{id}"}},
	{Name: "vgpu:requests:create", Default: "rule:admin or rule:project_member", Class: Project,
		Description: "Ask for a change to an instance with API credentials (vgpuctl request). Whoever is not " +
			"admin may ask only for its own project's instances.",
		Routes: []string{"POST /v1/requests"}},
	{Name: "vgpu:requests:cancel", Default: defaultAdmin, Class: Admin,
		Description: "Cancel a request.", Routes: []string{"POST /v1/requests/{id}/cancel"}},
	{Name: "vgpu:hosts:list", Default: defaultFleet, Class: Fleet,
		Description: "List the hosts with vGPUs.", Routes: []string{"GET /v1/hosts"}},
	{Name: "vgpu:hosts:get", Default: defaultFleet, Class: Fleet,
		Description: "Read a host, and its agent's last report.", Routes: []string{"GET /v1/hosts/{name}", "GET /v1/hosts/{name}/report"}},
	{Name: "vgpu:hosts:drain", Default: defaultMaint, Class: Admin,
		Description: "Drain a host (no new vGPU lands on it) or end its drain.",
		Routes:      []string{"POST /v1/hosts/{name}/drain", "DELETE /v1/hosts/{name}/drain"}},
	{Name: "vgpu:hosts:migrate_all", Default: defaultMaint, Class: Admin,
		Description: "Move every instance with a vGPU off a host.", Routes: []string{"POST /v1/hosts/{name}/migrate-all"}},
	{Name: "vgpu:maintenance:get", Default: defaultMaint, Class: Admin,
		Description: "Follow a host's maintenance (migrate-all) work.",
		Routes:      []string{"GET /v1/hosts/{name}/migrate-all", "GET /v1/maintenance/{id}"}},
	{Name: "vgpu:fleet:upgrade", Default: defaultMaint, Class: Admin,
		Description: "Upgrade the vGPU manager of hosts one at a time (drain, move, upgrade, gate, undrain).",
		Routes:      []string{"POST /v1/fleet/upgrades"}},
	{Name: "vgpu:fleet:upgrade_get", Default: defaultMaint, Class: Admin,
		Description: "Follow a fleet upgrade.", Routes: []string{"GET /v1/fleet/upgrades/{id}"}},
	{Name: "vgpu:fleet:retype", Default: defaultMaint, Class: Admin,
		Description: "Re-type empty Nova-owned GPUs host by host (drain, the agent's re-type command with the nova.conf change, verify in Placement, undrain), or plan it with dry_run.",
		Routes:      []string{"POST /v1/fleet/retypes"}},
	{Name: "vgpu:fleet:retype_get", Default: defaultMaint, Class: Admin,
		Description: "Follow a fleet re-type.", Routes: []string{"GET /v1/fleet/retypes/{id}"}},
	{Name: "vgpu:gpus:list", Default: defaultFleet, Class: Fleet,
		Description: "List the physical GPUs.", Routes: []string{"GET /v1/gpus"}},
	{Name: "vgpu:gpus:drain", Default: defaultMaint, Class: Admin,
		Description: "Drain a physical GPU or end its drain.",
		Routes:      []string{"POST /v1/gpus/{id}/drain", "DELETE /v1/gpus/{id}/drain"}},
	{Name: "vgpu:gpus:retype", Default: defaultAdmin, Class: Admin,
		Description: "Re-type an empty bridge-owned GPU ([placement] bridge_owned_gpus).",
		Routes:      []string{"POST /v1/hosts/{name}/gpus/{pci}/retype"}},
	{Name: "vgpu:controls:get", Default: defaultFleet, Class: Fleet,
		Description: "Read the operator controls (pause, freeze, ...).", Routes: []string{"GET /v1/controls"}},
	{Name: "vgpu:controls:update", Default: defaultAdmin, Class: Admin,
		Description: "Set the operator controls.", Routes: []string{"POST /v1/controls"}},
	{Name: "vgpu:audit:list", Default: defaultFleet, Class: Fleet,
		Description: "Read the audit log.", Routes: []string{"GET /v1/audit"}},
	{Name: "vgpu:dead_letters:list", Default: defaultAdmin, Class: Admin,
		Description: "List the messages that could not be processed.", Routes: []string{"GET /v1/dead-letters"}},
	{Name: "vgpu:dead_letters:replay", Default: defaultAdmin, Class: Admin,
		Description: "Process a dead letter again.", Routes: []string{"POST /v1/dead-letters/{id}/replay"}},
	{Name: "vgpu:drift:list", Default: defaultFleet, Class: Fleet,
		Description: "Read the drift between Placement, Nova and the hosts.", Routes: []string{"GET /v1/drift"}},
	{Name: "vgpu:drift:run", Default: defaultAdmin, Class: Admin,
		Description: "Run a drift check now.", Routes: []string{"POST /v1/drift/run"}},
	{Name: "vgpu:policy:explain", Default: defaultFleet, Class: Fleet,
		Description: "Explain the placement policy's decision for an event.", Routes: []string{"POST /v1/policy/explain"}},
	{Name: "vgpu:policy:replay", Default: defaultAdmin, Class: Admin,
		Description: "Run the recorded events of a window through the placement policy and a candidate rules file, with no side effect.", Routes: []string{"POST /v1/policy/replay"}},
	{Name: "vgpu:placements:dry_run", Default: defaultFleet, Class: Fleet,
		Description: "Place a vGPU request without acting.", Routes: []string{"POST /v1/placements/dry-run"}},
	{Name: "vgpu:placements:sync", Default: defaultAdmin, Class: Admin,
		Description: "Synchronise the Placement mirror now.", Routes: []string{"POST /v1/placements/sync"}},
	{Name: "vgpu:diagnostics:create", Default: defaultAdmin, Class: Admin,
		Description: "Ask a host's agent for a diagnostics bundle.", Routes: []string{"POST /v1/hosts/{name}/diagnostics"}},
	{Name: "vgpu:diagnostics:get", Default: defaultAdmin, Class: Admin,
		Description: "Read a diagnostics request and download its bundle.",
		Routes:      []string{"GET /v1/diagnostics/{id}", "GET /v1/diagnostics/{id}/bundle"}},
}

// ruleOfRoute maps "METHOD /openapi/path" to its rule.
var ruleOfRoute = func() map[string]*Rule {
	m := map[string]*Rule{}
	for i := range routeRules {
		for _, r := range routeRules[i].Routes {
			if m[r] != nil {
				panic("api: route " + r + " has two rules")
			}
			m[r] = &routeRules[i]
		}
	}
	return m
}()

// RuleFor is the rule that guards a route (method, path in Echo's or
// OpenAPI's form), or nil.
func RuleFor(method, path string) *Rule {
	return ruleOfRoute[strings.ToUpper(method)+" "+OpenAPIPath(path)]
}

// baseRules are the base rules with defaults written from names.
func baseRules(n RoleNames) ([]Rule, error) {
	admin, err := anyRole(n.Admin)
	if err != nil {
		return nil, fmt.Errorf("admin roles: %w", err)
	}
	reader, err := anyRole(n.Reader)
	if err != nil {
		return nil, fmt.Errorf("reader roles: %w", err)
	}
	member, err := anyRole(n.Member)
	if err != nil {
		return nil, fmt.Errorf("member roles: %w", err)
	}
	fleet, err := anyRole(n.FleetReader)
	if err != nil {
		return nil, fmt.Errorf("fleet reader roles: %w", err)
	}
	// A fleet reader: one of the fleet reader roles whatever the scope,
	// or a reader with a system-scoped token.
	fleetRule := "(" + reader + ") and system_scope:all"
	if reader == "!" {
		fleetRule = "!"
	}
	if fleet != "!" {
		fleetRule = fleet + " or " + fleetRule
	}
	return []Rule{
		{Name: RuleAdmin, Default: admin,
			Description: "An operator API admin: every route, every project. Default: a role of [keystone] admin_roles."},
		{Name: RuleFleetReader, Default: fleetRule,
			Description: "Reads every project and the fleet routes, changes nothing. Default: a role of [keystone] " +
				"fleet_reader_roles, or of reader_roles with a system-scoped token."},
		{Name: RuleProjectReader, Default: "(" + reader + ") and project_id:%(project_id)s",
			Description: "Reads its own project's instances, requests, allocations and events (a project-scoped " +
				"token; %(project_id)s is the caller's project). Default: a role of [keystone] reader_roles."},
		{Name: RuleProjectMember, Default: "rule:project_reader and (" + member + ")",
			Description: "A project reader that may also ask for changes to its project's instances. " +
				"Default: a role of [keystone] member_roles too."},
		{Name: RuleMaintenance, Default: "rule:admin",
			Description: "Takes hosts and GPUs out of service and back (drain, migrate-all) and follows that work. " +
				"Override it (or one of the vgpu:hosts:* rules) to give these rights without admin."},
	}, nil
}

// anyRole is "role:a or role:b", or "!" for no role.
func anyRole(names []string) (string, error) {
	var parts []string
	for _, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		if n == "" {
			continue
		}
		if strings.ContainsAny(n, " \t\n()") {
			return "", fmt.Errorf("role %q cannot be written in a policy rule (white space or parentheses)", n)
		}
		parts = append(parts, "role:"+strings.ReplaceAll(n, "%", "%%"))
	}
	if len(parts) == 0 {
		return "!", nil
	}
	return strings.Join(parts, " or "), nil
}

// Rules are every rule — the base rules with defaults written from
// names, then the route rules — for the sample and the documentation.
func Rules(n RoleNames) ([]Rule, error) {
	base, err := baseRules(n)
	if err != nil {
		return nil, err
	}
	return append(base, routeRules...), nil
}
