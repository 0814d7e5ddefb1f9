package api

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
)

// TestStaticTokensRules: with no policy file, each token-file role passes
// exactly the rules its route classes let it pass before there were
// rules, and POST /v1/requests only as admin or a member of a project.
func TestStaticTokensRules(t *testing.T) {
	st := tokens(t)
	rules, err := Rules(StaticRoleNames())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range st.entries {
		p := e.principal
		for _, r := range rules {
			if len(r.Routes) == 0 {
				continue
			}
			var want bool
			switch {
			case r.Name == "vgpu:requests:create":
				want = p.Role == RoleAdmin || (p.Role == RoleMember && p.Project != "")
			case r.Class == Project || r.Class == Custom:
				want = true
			case r.Class == Fleet:
				want = p.Role == RoleAdmin || p.Project == ""
			default:
				want = p.Role == RoleAdmin
			}
			if got := DefaultPolicy().Allowed(r.Name, &p); got != want {
				t.Errorf("%s (%s %s): %s = %v, want %v", p.Name, p.Role, p.Project, r.Name, got, want)
			}
		}
	}
}

// TestMaintainerOverride: one rule overridden gives a role that right and
// no other; the rest keep their defaults.
func TestMaintainerOverride(t *testing.T) {
	pol, err := NewPolicy(StaticRoleNames(), map[string]string{
		"maintainer":       "role:vgpu-maintainer",
		"vgpu:hosts:drain": "rule:admin or rule:maintainer",
	})
	if err != nil {
		t.Fatal(err)
	}
	mia := &Principal{Name: "mia", Project: "ops", Creds: Credentials{ProjectID: "ops", Roles: []string{"vgpu-maintainer"}}}
	admin := &Principal{Name: "root", Role: RoleAdmin, Creds: Credentials{System: true, Roles: []string{"admin"}}}
	rules, _ := Rules(StaticRoleNames())
	for _, r := range rules {
		if len(r.Routes) == 0 {
			continue
		}
		if got, want := pol.Allowed(r.Name, mia), r.Name == "vgpu:hosts:drain"; got != want {
			t.Errorf("maintainer: %s = %v, want %v", r.Name, got, want)
		}
		if !pol.Allowed(r.Name, admin) {
			t.Errorf("admin: %s refused", r.Name)
		}
	}
	if got := pol.Overridden(); strings.Join(got, ",") != "maintainer,vgpu:hosts:drain" {
		t.Errorf("overridden = %v", got)
	}
}

func TestPolicyFileErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, text, want string }{
		{"syntax", "\"vgpu:hosts:drain\": \"rule:admin or (role:x\"\n", `line 1: rule "vgpu:hosts:drain": a ( is not closed`},
		{"typo", "\"vgpu:host:drain\": \"role:x\"\n", "vgpu:host:drain: no such rule"},
		{"undefined", "\"vgpu:hosts:drain\": \"rule:maintainers\"\n", "rule:maintainers is not defined"},
		{"cycle", "\"admin\": \"rule:maintenance\"\n", "refer to themselves"},
	} {
		path := filepath.Join(dir, tc.name+".yaml")
		if err := os.WriteFile(path, []byte(tc.text), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadPolicy(StaticRoleNames(), path)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want an error naming %s with %q", tc.name, err, path, tc.want)
		}
	}
	if _, err := LoadPolicy(StaticRoleNames(), filepath.Join(dir, "absent.yaml")); err == nil {
		t.Error("a policy file that is not there was taken for no overrides")
	}
}

// TestRouteRulesInForce: the server checks a route's rule as the policy
// file sets it, names the rule in the 403, and the document names it.
func TestRouteRulesInForce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	os.WriteFile(path, []byte("\"vgpu:hosts:drain\": \"rule:admin or role:reader\"\n"), 0o600)
	pol, err := LoadPolicy(StaticRoleNames(), path)
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{Auth: tokens(t), Policy: pol})
	ok := func(c echo.Context) error { return c.NoContent(http.StatusNoContent) }
	s.Handle(http.MethodPost, "/v1/hosts/:name/drain", Admin, ok)
	s.Handle(http.MethodPost, "/v1/gpus/:id/drain", Admin, ok)
	s.Describe([]byte(`{"paths": {"/v1/hosts/{name}/drain": {"post": {"summary": "x", "responses": {"204": {"description": "ok"}}}}}}`))
	if w := do(s, "POST", "/v1/hosts/h1/drain", "projtok", ""); w.Code != http.StatusNoContent {
		t.Errorf("reader on a drain opened to readers: %d %s", w.Code, w.Body)
	}
	w := do(s, "POST", "/v1/gpus/g1/drain", "projtok", "")
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), `"policy_rule":"vgpu:gpus:drain"`) ||
		!strings.Contains(w.Body.String(), `role \"reader\" may not do this; it needs admin`) {
		t.Errorf("reader on a GPU drain (default rule): %d %s, want 403 naming the rule and what it needs", w.Code, w.Body)
	}
	s2 := New(Config{Auth: tokens(t), Policy: pol})
	s2.Handle(http.MethodPost, "/v1/hosts/:name/drain", Admin, ok)
	if w := do(s2, "POST", "/v1/hosts/h1/drain", "memtok", ""); w.Code != http.StatusNoContent {
		t.Errorf("member: %d", w.Code)
	}
	pol2, _ := NewPolicy(StaticRoleNames(), map[string]string{"vgpu:hosts:drain": "role:ops"})
	s3 := New(Config{Auth: tokens(t), Policy: pol2})
	s3.Handle(http.MethodPost, "/v1/hosts/:name/drain", Admin, ok)
	if w := do(s3, "POST", "/v1/hosts/h1/drain", "admintok", ""); w.Code != http.StatusForbidden ||
		!strings.Contains(w.Body.String(), "access rule vgpu:hosts:drain (role:ops) does not allow it") {
		t.Errorf("admin on a drain overridden to role:ops: %d %s, want 403 quoting the rule", w.Code, w.Body)
	}
	var doc struct {
		Paths map[string]map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(s.Document(), &doc); err != nil {
		t.Fatal(err)
	}
	if got := doc.Paths["/v1/hosts/{name}/drain"]["post"]["x-vgpu-policy"]; got != "vgpu:hosts:drain" {
		t.Errorf("x-vgpu-policy = %v", got)
	}
}

func TestHandleRefusesAClassNotTheRules(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("a drain registered as a fleet read was accepted")
		}
	}()
	New(Config{}).Handle(http.MethodPost, "/v1/hosts/:name/drain", Fleet, func(echo.Context) error { return nil })
}

func TestSample(t *testing.T) {
	var b strings.Builder
	if err := WriteSample(&b, StaticRoleNames()); err != nil {
		t.Fatal(err)
	}
	// The sample, uncommented, is a policy file that changes nothing.
	var uncommented strings.Builder
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(line, "#\"") {
			uncommented.WriteString(line[1:] + "\n")
		}
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(path, []byte(uncommented.String()), 0o600)
	pol, err := LoadPolicy(StaticRoleNames(), path)
	if err != nil {
		t.Fatalf("the sample uncommented: %v", err)
	}
	rules, _ := Rules(StaticRoleNames())
	if len(pol.Overridden()) != len(rules) {
		t.Errorf("the sample sets %d rules, there are %d", len(pol.Overridden()), len(rules))
	}
	for _, r := range rules {
		if pol.Rule(r.Name) != DefaultPolicy().Rule(r.Name) {
			t.Errorf("%s: sample %q, default %q", r.Name, pol.Rule(r.Name), DefaultPolicy().Rule(r.Name))
		}
	}
}

// TestRoleOnlyPrincipalsKeepTheirRights: a principal an Authenticator made
// with a Role and no credentials (an embedder's, a test's) passes the
// rules its role implies, as a static token of that role does.
func TestRoleOnlyPrincipalsKeepTheirRights(t *testing.T) {
	st := tokens(t)
	for _, e := range st.entries {
		static := e.principal
		bare := Principal{Name: static.Name, Role: static.Role, Project: static.Project}
		rules, err := Rules(StaticRoleNames())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rules {
			if got, want := DefaultPolicy().Allowed(r.Name, &bare), DefaultPolicy().Allowed(r.Name, &static); got != want {
				t.Errorf("%s (%s %s) without credentials: %s = %v, with them %v", bare.Name, bare.Role, bare.Project, r.Name, got, want)
			}
		}
	}
	if DefaultPolicy().Allowed("vgpu:dead_letters:replay", &Principal{Name: "nobody"}) {
		t.Error("a principal with neither a role nor credentials passes an admin rule")
	}
}
