package api

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/vgpu-bridge/vgpu-bridge/internal/oslopolicy"
)

// Credentials are what a caller's token says, as oslo.policy's checks
// read them: role:NAME matches Roles, user_id, project_id, domain_id and
// system_scope:all the rest; is_admin:True a caller the admin rule admits.
type Credentials struct {
	UserID, ProjectID, DomainID string
	// System is a system-scoped token (system_scope:all).
	System bool
	Roles  []string
}

// Policy decides which callers may use which routes: the named rules'
// defaults, with an operator's overrides ([oslo_policy] policy_file).
// Replace swaps its rules in place (SIGHUP), so every holder of the
// pointer (the server, the Keystone authenticator) sees the new rules at
// once; each decision reads one set of rules.
type Policy struct {
	cur atomic.Pointer[policyRules]
}

// policyRules is one compiled set of rules.
type policyRules struct {
	rules      *oslopolicy.Rules
	byName     map[string]Rule
	overridden map[string]bool
}

// Replace makes p decide with q's rules from now on.
func (p *Policy) Replace(q *Policy) { p.cur.Store(q.cur.Load()) }

// NewPolicy compiles the rules: defaults written from names, replaced by
// overrides (a policy file's rules, which may also define rules of their
// own for others to refer to). A rule named vgpu:... that is not one of
// this service's is an error: a typo would otherwise leave the default in
// force, silently.
func NewPolicy(names RoleNames, overrides map[string]string) (*Policy, error) {
	defs, err := Rules(names)
	if err != nil {
		return nil, fmt.Errorf("access rules: %w", err)
	}
	src := make(map[string]string, len(defs)+len(overrides))
	for _, d := range defs {
		src[d.Name] = d.Default
	}
	// Routes without a rule of their own (tests' routes) are guarded by
	// their class's default; not documented, not meant to be overridden.
	for _, a := range []Access{Project, Fleet, Admin} {
		src[classRulePrefix+a.String()] = classDefault(a)
	}
	var unknown []string
	p := &policyRules{byName: map[string]Rule{}, overridden: map[string]bool{}}
	for _, d := range defs {
		p.byName[d.Name] = d
	}
	for name, rule := range overrides {
		if _, ok := src[name]; !ok && strings.HasPrefix(name, "vgpu:") {
			unknown = append(unknown, name)
		}
		src[name] = rule
		p.overridden[name] = true
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("access rules: %s: no such rule (`vgpu-bridge genpolicy` lists them)", strings.Join(unknown, ", "))
	}
	if p.rules, err = oslopolicy.Compile(src); err != nil {
		return nil, fmt.Errorf("access rules: %w", err)
	}
	pol := &Policy{}
	pol.cur.Store(p)
	return pol, nil
}

const classRulePrefix = "_class:"

func classDefault(a Access) string {
	switch a {
	case Project:
		return defaultProject
	case Fleet:
		return defaultFleet
	}
	return defaultAdmin
}

// LoadPolicy is NewPolicy with the overrides of a policy file (none when
// path is empty).
func LoadPolicy(names RoleNames, path string) (*Policy, error) {
	var overrides map[string]string
	if path != "" {
		var err error
		if overrides, err = oslopolicy.ReadFile(path); err != nil {
			return nil, err
		}
	}
	p, err := NewPolicy(names, overrides)
	if err != nil && path != "" {
		return nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	return p, err
}

// defaultPolicy is the policy of a server configured without one: the
// defaults for static tokens.
var defaultPolicy = func() *Policy {
	p, err := NewPolicy(StaticRoleNames(), nil)
	if err != nil {
		panic(err)
	}
	return p
}()

// DefaultPolicy is the defaults, written for static tokens' role names.
func DefaultPolicy() *Policy { return defaultPolicy }

// Overridden are the rules the policy file sets, sorted.
func (p *Policy) Overridden() []string {
	r := p.cur.Load()
	out := make([]string, 0, len(r.overridden))
	for n := range r.overridden {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Rule is the rule named name as in force, in the policy language.
func (p *Policy) Rule(name string) string {
	s, _ := p.cur.Load().rules.Rule(name)
	return s
}

// Allowed reports whether who passes the rule named name. A route's
// target is the caller's own scope (%(project_id)s is its project,
// %(user_id)s itself): the routes list what the caller's project holds,
// which the handlers filter by Principal.Project.
func (p *Policy) Allowed(name string, who *Principal) bool { return p.cur.Load().allowed(name, who) }

func (r *policyRules) allowed(name string, who *Principal) bool {
	if who == nil {
		return false
	}
	return r.rules.Allowed(name, who.oslo(), who.target())
}

// creds are the credentials the access rules see: Creds, or, for a
// principal an Authenticator made with a Role and no credentials (one of
// the bridge's own, or an embedder's), those that role implies, as a
// static token's line does.
func (who *Principal) creds() Credentials {
	c := who.Creds
	if len(c.Roles) > 0 || c.System || c.ProjectID != "" || c.UserID != "" {
		return c
	}
	if roles, ok := impliedRoles[who.Role]; ok {
		return Credentials{Roles: roles, ProjectID: who.Project, System: who.Project == ""}
	}
	return c
}

func (who *Principal) oslo() oslopolicy.Credentials {
	c := who.creds()
	attrs := map[string]string{"is_admin": "False"}
	if who.Role == RoleAdmin {
		attrs["is_admin"] = "True"
	}
	for k, v := range map[string]string{"user_id": c.UserID, "project_id": c.ProjectID, "domain_id": c.DomainID} {
		if v != "" {
			attrs[k] = v
		}
	}
	if c.System {
		attrs["system_scope"] = "all"
	}
	return oslopolicy.Credentials{Roles: c.Roles, Attrs: attrs}
}

func (who *Principal) target() oslopolicy.Target {
	t := oslopolicy.Target{}
	c := who.creds()
	if c.ProjectID != "" {
		t["project_id"] = c.ProjectID
	}
	if c.UserID != "" {
		t["user_id"] = c.UserID
	}
	return t
}

// Classify says what a caller with these credentials is, by the base
// rules: admin or fleet reader (every project), project member or
// project reader (its project). A caller that passes none has no role
// (RoleNone), limited to its token's project — or to none with a system
// token — and passes only the route rules an override opens to it;
// ok is false for such a caller whose token is scoped to a domain or to
// nothing, which no rule can limit to a project.
func (p *Policy) Classify(c Credentials) (role Role, project string, ok bool) {
	probe := &Principal{Creds: c}
	r := p.cur.Load()
	switch {
	case r.allowed(RuleAdmin, probe):
		return RoleAdmin, "", true
	case r.allowed(RuleFleetReader, probe):
		return RoleReader, "", true
	case c.ProjectID == "":
	case r.allowed(RuleProjectMember, probe):
		return RoleMember, c.ProjectID, true
	case r.allowed(RuleProjectReader, probe):
		return RoleReader, c.ProjectID, true
	}
	switch {
	case c.ProjectID != "":
		return RoleNone, c.ProjectID, true
	case c.System:
		return RoleNone, "", true
	}
	return RoleNone, "", false
}

// WriteSample writes the rules with their defaults, commented out, as
// oslopolicy-sample-generator writes a service's policy.yaml.sample.
func WriteSample(w io.Writer, names RoleNames) error {
	rules, err := Rules(names)
	if err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("# vgpu-bridge access rules ([oslo_policy] policy_file), generated by\n" +
		"# `vgpu-bridge genpolicy` (make genconfig); do not edit the sample.\n#\n" +
		"# Each rule is commented out with its default, in oslo.policy's language;\n" +
		"# uncomment and change the rules to override. The defaults of admin,\n" +
		"# fleet_reader, project_reader and project_member are written from the\n" +
		"# [keystone] role options' defaults; with other role options set, they\n" +
		"# follow those options unless this file sets them.\n")
	for _, r := range rules {
		b.WriteString("\n")
		for _, line := range wrap(r.Description, 70) {
			b.WriteString("# " + line + "\n")
		}
		for _, route := range r.Routes {
			method, path, _ := strings.Cut(route, " ")
			fmt.Fprintf(&b, "# %-7s %s\n", method, path)
		}
		fmt.Fprintf(&b, "#%q: %q\n", r.Name, r.Default)
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// WriteReference writes the rules as reStructuredText for the docs: each
// rule, its default and the routes it guards.
func WriteReference(w io.Writer, names RoleNames) error {
	rules, err := Rules(names)
	if err != nil {
		return err
	}
	esc := strings.NewReplacer(`\`, `\\`, "*", `\*`, "`", "\\`", "_", `\_`, "|", `\|`)
	var b strings.Builder
	b.WriteString("..\n   Generated by `vgpu-bridge genpolicy --format rst` (make genconfig); do not edit.\n\n")
	title := "Access rules reference"
	fmt.Fprintf(&b, "%s\n%s\n\n", title, strings.Repeat("=", len(title)))
	b.WriteString("Every access rule of the operator API, with its default, in oslo.policy's language. Override\n" +
		"rules in the YAML file ``[oslo_policy] policy_file`` (see :doc:`../operations`);\n" +
		"``vgpu-bridge genpolicy`` writes a sample with every default.\n\n" +
		"The base rules' defaults are written from the ``[keystone]`` role options (shown with\n" +
		"their defaults); routes refer to them with ``rule:NAME``.\n")
	section := func(name string) {
		fmt.Fprintf(&b, "\n%s\n%s\n", name, strings.Repeat("-", len(name)))
	}
	section("Base rules")
	for i, r := range rules {
		if i == len(rules)-len(routeRules) {
			section("Route rules")
		}
		fmt.Fprintf(&b, "\n``%s``\n  Default: ``%s``\n\n  %s\n", r.Name, r.Default, esc.Replace(r.Description))
		if len(r.Routes) > 0 {
			fmt.Fprintf(&b, "\n  Class (x-vgpu-access): %s. Routes:\n\n", r.Class)
			for _, route := range r.Routes {
				fmt.Fprintf(&b, "  - ``%s``\n", route)
			}
		}
	}
	_, err = io.WriteString(w, b.String())
	return err
}

func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
