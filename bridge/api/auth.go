package api

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"

	"github.com/labstack/echo/v4"
)

// Access is what a route requires of its caller by default: the class
// of its access rule's default (rules.go), which a policy file may
// override. Every route of /v1/openapi.json carries its class as
// x-vgpu-access and its rule as x-vgpu-policy.
type Access int

const (
	// Public routes need no credentials (health, metrics, OpenAPI).
	Public Access = iota
	// Project routes are open to every reader; a project-scoped caller
	// (a Keystone project token, a token-file line with a project) sees
	// only its project's instances, requests, allocations, events and
	// audit — the handler scopes by Principal.Project.
	Project
	// Fleet routes show the whole fleet (hosts, GPUs, drift, status,
	// placement dry runs, policy explanations): they need the admin role
	// or a fleet reader, a reader with no project (a system-scoped token,
	// a token-file line without a project, [keystone] fleet_reader_roles).
	Fleet
	// Admin routes need the admin role.
	Admin
	// Custom routes authenticate the caller themselves (e.g. webhooks).
	Custom
)

// String is the class's name in the OpenAPI document (x-vgpu-access).
func (a Access) String() string {
	switch a {
	case Public:
		return "public"
	case Project:
		return "project"
	case Fleet:
		return "fleet"
	case Admin:
		return "admin"
	case Custom:
		return "custom"
	}
	return "unknown"
}

// Role is what a caller is to the operator API, by the base access
// rules (rules.go): it decides what the caller sees (every project, or
// Principal.Project's); the route rules decide what it may do.
type Role string

// Roles of the operator API.
const (
	RoleReader Role = "reader"
	// RoleMember is a reader of one project that may also ask for changes
	// to its project's instances (POST /v1/requests).
	RoleMember Role = "member"
	RoleAdmin  Role = "admin"
	// RoleNone is a caller no base rule admits: it may use only the routes
	// a policy file's rule opens to it (e.g. a maintenance role that may
	// drain hosts), and sees only its token's project.
	RoleNone Role = ""
)

// Principal is the authenticated caller of a request.
type Principal struct {
	// Name is for people: logs, the audit log ("alice@project-a"). It
	// need not be unique (Keystone names are unique only per domain).
	Name string
	// ID identifies the caller where Name might not (Keystone: the user
	// id @ the project id); empty when Name does (static tokens). Key
	// is what state of the caller is keyed by.
	ID   string
	Role Role
	// Project limits what the caller sees; empty means all projects.
	Project string
	// Creds are what the access rules check: the token's roles and scope.
	Creds Credentials
}

// Key identifies the caller for what is kept per caller (idempotency
// keys, limits): ID, or Name when it has none.
func (p *Principal) Key() string {
	if p.ID != "" {
		return p.ID
	}
	return p.Name
}

// Authenticator turns a request into a Principal, or fails with a Problem.
type Authenticator interface {
	Authenticate(r *http.Request) (*Principal, error)
}

const principalCtxKey = "vgpu.principal"

// PrincipalFrom returns the caller of c, or nil on public routes.
func PrincipalFrom(c echo.Context) *Principal {
	p, _ := c.Get(principalCtxKey).(*Principal)
	return p
}

// SetPrincipal records the caller of c (for routes with Custom access).
func SetPrincipal(c echo.Context, p *Principal) { c.Set(principalCtxKey, p) }

// NoAuth lets everyone in as admin. For labs only.
type NoAuth struct{}

// Authenticate implements Authenticator.
func (NoAuth) Authenticate(*http.Request) (*Principal, error) {
	return &Principal{Name: "noauth", Role: RoleAdmin, Creds: Credentials{System: true, Roles: []string{"admin"}}}, nil
}

// StaticTokens authenticates "X-Auth-Token: <token>" or
// "Authorization: Bearer <token>" against a file of static tokens.
type StaticTokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	sum       [32]byte
	principal Principal
}

// LoadTokenFile reads lines "TOKEN ROLE [NAME [PROJECT]]"; blank lines and
// lines starting with # are ignored. Errors name the line, never the token.
func LoadTokenFile(path string) (*StaticTokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	st := &StaticTokens{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fs := strings.Fields(line)
		if len(fs) < 2 {
			return nil, fmt.Errorf("token file %s line %d: want TOKEN ROLE [NAME [PROJECT]]", path, n)
		}
		role := Role(fs[1])
		if role != RoleReader && role != RoleMember && role != RoleAdmin {
			return nil, fmt.Errorf("token file %s line %d: role %q is not reader, member or admin", path, n, fs[1])
		}
		if role == RoleMember && len(fs) < 4 {
			return nil, fmt.Errorf("token file %s line %d: a member token needs a PROJECT (TOKEN member NAME PROJECT)", path, n)
		}
		p := Principal{Name: fmt.Sprintf("token-line-%d", n), Role: role}
		if len(fs) > 2 {
			p.Name = fs[2]
		}
		if len(fs) > 3 {
			p.Project = fs[3]
		}
		// What the access rules see: the role's name with the roles it
		// implies, as Keystone's default roles imply (admin > member >
		// reader), and a system scope for a line without a project (a
		// fleet reader, or an admin).
		p.Creds = Credentials{Roles: impliedRoles[role], ProjectID: p.Project, System: p.Project == ""}
		st.entries = append(st.entries, tokenEntry{sum: sha256.Sum256([]byte(fs[0])), principal: p})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	if len(st.entries) == 0 {
		return nil, fmt.Errorf("token file %s holds no token", path)
	}
	return st, nil
}

// impliedRoles are a static token's role names, its own first.
var impliedRoles = map[Role][]string{
	RoleAdmin:  {"admin", "member", "reader"},
	RoleMember: {"member", "reader"},
	RoleReader: {"reader"},
}

// BearerToken returns the token of r from X-Auth-Token or Authorization.
func BearerToken(r *http.Request) string {
	if t := r.Header.Get("X-Auth-Token"); t != "" {
		return t
	}
	if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:])
	}
	return ""
}

// Authenticate implements Authenticator. Every entry is compared, in
// constant time, so timing tells nothing about which token is close.
func (st *StaticTokens) Authenticate(r *http.Request) (*Principal, error) {
	tok := BearerToken(r)
	if tok == "" {
		return nil, &ProblemDetails{Status: http.StatusUnauthorized, Title: "Unauthorized",
			Detail: "send a token in X-Auth-Token or Authorization: Bearer", Code: "no_token",
			Headers: map[string]string{"WWW-Authenticate": `Bearer realm="vgpu-bridge"`}}
	}
	sum := sha256.Sum256([]byte(tok))
	var found *Principal
	for i := range st.entries {
		if subtle.ConstantTimeCompare(sum[:], st.entries[i].sum[:]) == 1 {
			found = &st.entries[i].principal
		}
	}
	if found == nil {
		return nil, &ProblemDetails{Status: http.StatusUnauthorized, Title: "Unauthorized",
			Detail: "the token is not valid", Code: "bad_token",
			Headers: map[string]string{"WWW-Authenticate": `Bearer realm="vgpu-bridge"`}}
	}
	p := *found
	return &p, nil
}

// requireAccess authenticates the caller of a route and checks the
// route's rule (rule: its name; "" for public and custom routes, which
// authenticate their callers themselves).
func (s *Server) requireAccess(a Access, rule string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Set(policyCtxKey, s.policy)
			if a == Public || a == Custom {
				return next(c)
			}
			p, err := s.auth.Authenticate(c.Request())
			if err != nil {
				return err
			}
			if err := s.policy.authorize(rule, p); err != nil {
				return err
			}
			SetPrincipal(c, p)
			return next(c)
		}
	}
}

const policyCtxKey = "vgpu.policy"

// Authorize checks a rule for the caller of a route that authenticates
// its callers itself (class custom): nil, or a 403 problem.
func Authorize(c echo.Context, rule string, p *Principal) error {
	pol, _ := c.Get(policyCtxKey).(*Policy)
	if pol == nil {
		pol = DefaultPolicy()
	}
	return pol.authorize(rule, p)
}

func (pol *Policy) authorize(rule string, p *Principal) error {
	if pol.Allowed(rule, p) {
		return nil
	}
	prob := &ProblemDetails{Status: http.StatusForbidden, Title: "Forbidden", Code: "forbidden",
		Detail: pol.forbidden(rule, p)}
	if !strings.HasPrefix(rule, classRulePrefix) {
		prob.PolicyRule = rule
	}
	return prob
}

// forbidden says why p may not pass rule: with the rule at its default,
// what the route needs, in the words of its class; else the rule as the
// policy file sets it. (The problem's policy_rule names the rule.)
func (pol *Policy) forbidden(rule string, p *Principal) string {
	if p.Role == RoleNone {
		roles := append([]string(nil), p.Creds.Roles...)
		sort.Strings(roles)
		return fmt.Sprintf("the token's roles [%s] pass none of the access rules admin, fleet_reader and "+
			"project_reader, nor %s (%s)", strings.Join(roles, ", "), displayRule(rule), pol.Rule(rule))
	}
	cur := pol.cur.Load()
	if cur.overridden[rule] {
		return fmt.Sprintf("role %q may not do this; access rule %s (%s) does not allow it", p.Role, rule, pol.Rule(rule))
	}
	class := Admin
	if r, ok := cur.byName[rule]; ok {
		class = r.Class
	} else if c, ok := strings.CutPrefix(rule, classRulePrefix); ok {
		for _, a := range []Access{Project, Fleet, Admin} {
			if a.String() == c {
				class = a
			}
		}
	}
	switch {
	case rule == "vgpu:requests:create":
		return fmt.Sprintf("role %q may read but not ask for changes; it needs admin, or member of the instance's project", p.Role)
	case class == Fleet && p.Project != "":
		return fmt.Sprintf("this route shows the whole fleet; a reader scoped to project %s sees its project's "+
			"instances, requests, allocations, events and audit. It needs the admin role or a fleet reader "+
			"(a system-scoped token)", p.Project)
	case class == Fleet:
		return fmt.Sprintf("role %q may not do this; it needs the admin role or a fleet reader", p.Role)
	case class == Project || class == Custom:
		return fmt.Sprintf("role %q may not do this; it needs reader, member or admin", p.Role)
	}
	return fmt.Sprintf("role %q may not do this; it needs admin", p.Role)
}

func displayRule(rule string) string {
	if strings.HasPrefix(rule, classRulePrefix) {
		return "of class " + strings.TrimPrefix(rule, classRulePrefix)
	}
	return rule
}
