package oslopolicy

import (
	"strings"
	"testing"
)

func compile(t *testing.T, src map[string]string) *Rules {
	t.Helper()
	r, err := Compile(src)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return r
}

func TestEvaluate(t *testing.T) {
	base := map[string]string{
		"admin":         "role:admin",
		"owner":         "project_id:%(project_id)s",
		"admin_or_self": "rule:admin or user_id:%(user_id)s",
	}
	member := Credentials{Roles: []string{"Member", "reader"}, Attrs: map[string]string{"project_id": "p1", "user_id": "u1"}}
	system := Credentials{Roles: []string{"reader"}, Attrs: map[string]string{"system_scope": "all", "is_admin": "False"}}
	admin := Credentials{Roles: []string{"admin"}, Attrs: map[string]string{"project_id": "p9", "is_admin": "True"}}
	own := Target{"project_id": "p1", "user_id": "u1"}
	other := Target{"project_id": "p2", "user_id": "u2"}
	for _, tc := range []struct {
		rule   string
		creds  Credentials
		target Target
		want   bool
	}{
		{"@", member, own, true},
		{"", member, own, true}, // oslo.policy: the empty rule allows everyone
		{"!", admin, own, false},
		{"role:member", member, own, true}, // roles compare without case
		{"role:MEMBER", member, own, true},
		{"role:admin", member, own, false},
		{"rule:admin", admin, own, true},
		{"rule:owner", member, own, true},
		{"rule:owner", member, other, false},
		{"rule:owner", member, Target{}, false}, // no project_id in the target
		{"rule:owner", system, own, false},      // no project_id in the credentials
		{"rule:admin_or_self", member, own, true},
		{"rule:admin_or_self", member, other, false},
		{"is_admin:True", admin, own, true},
		{"is_admin:True", system, own, false},
		{"system_scope:all", system, own, true},
		{"system_scope:all", member, own, false},
		{"not role:admin", member, own, true},
		{"not role:admin", admin, own, false},
		{"role:admin or role:reader and project_id:%(project_id)s", member, own, true},
		{"role:admin or role:reader and project_id:%(project_id)s", member, other, false},
		{"(role:admin or role:reader) and project_id:%(project_id)s", admin, own, false},
		{"(role:admin or role:reader) and (project_id:%(project_id)s)", member, own, true},
		{"not (role:admin or role:reader)", system, own, false},
		{"not not role:reader", system, own, true},
		{"role:reader AND NOT system_scope:all", system, own, false}, // keywords without case
		{"'p1':%(project_id)s", member, own, true},
		{"'p1':%(project_id)s", member, other, false},
		{"project_id:p%%1", Credentials{Attrs: map[string]string{"project_id": "p%1"}}, own, true},
		{"role:%(role)s", member, Target{"role": "member"}, true},
		{"user_id:%(user_id)s-x", Credentials{Attrs: map[string]string{"user_id": "u1-x"}}, own, true},
	} {
		rules := map[string]string{"it": tc.rule}
		for k, v := range base {
			rules[k] = v
		}
		r := compile(t, rules)
		if got := r.Allowed("it", tc.creds, tc.target); got != tc.want {
			t.Errorf("%q with %+v on %v = %v, want %v", tc.rule, tc.creds, tc.target, got, tc.want)
		}
	}
	if compile(t, base).Allowed("no_such_rule", admin, own) {
		t.Error("a rule that is not defined allowed an admin")
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ rule, want string }{
		{"role:admin or", "a check is missing"},
		{"and role:admin", `unexpected "and"`},
		{"(role:admin", "( is not closed"},
		{"role:admin)", "unexpected \")\" after a complete rule"},
		{"role:admin role:reader", `unexpected "role:reader"`},
		{"admin", "is not a check"},
		{"rule:", "needs a rule's name"},
		{"role:", "needs a role's name"},
		{"http://example.org", "not supported"},
		{"projectid:%(project_id)s", "not a credential this service knows"},
		{"project_id:%(project_id", "no closing )s"},
		{"project_id:50%", "a % starts"},
		{"()", "unexpected ) where a check was expected"},
		{strings.Repeat("not ", 60) + "@", "inside one another"},
		{strings.Repeat("(", 60) + "@" + strings.Repeat(")", 60), "inside one another"},
	} {
		_, err := Parse(tc.rule)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", tc.rule, err, tc.want)
		}
	}
}

func TestCompileErrors(t *testing.T) {
	for _, tc := range []struct {
		rules map[string]string
		want  []string
	}{
		{map[string]string{"a": "rule:b"}, []string{`rule "a": rule:b is not defined`}},
		{map[string]string{"a": "rule:b", "b": "rule:c or role:x", "c": "not rule:a"}, []string{"refer to themselves: a -> b -> c -> a"}},
		{map[string]string{"a": "rule:a"}, []string{"a -> a"}},
		{map[string]string{"a": "role:", "b": "(("}, []string{`rule "a"`, `rule "b"`}},
	} {
		_, err := Compile(tc.rules)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("Compile(%v) = %v, want an error with %q", tc.rules, err, w)
			}
		}
	}
}

func TestString(t *testing.T) {
	for in, want := range map[string]string{
		"role:a or role:b and not role:c":          "role:a or (role:b and not role:c)",
		"(role:a or role:b) and project_id:%(x)s":  "(role:a or role:b) and project_id:%(x)s",
		"not (role:a and role:b)":                  "not (role:a and role:b)",
		"'member':%(role.name)s":                   "'member':%(role.name)s",
		"project_id:a%%b":                          "project_id:a%%b",
		"((rule:admin))":                           "rule:admin",
		"@ or !":                                   "@ or !",
		"role:a OR role:b":                         "role:a or role:b",
		"is_admin:True or (system_scope:all)":      "is_admin:True or system_scope:all",
		"role:a and (role:b or role:c) and role:d": "role:a and (role:b or role:c) and role:d",
	} {
		c, err := Parse(in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", in, err)
		}
		if got := c.String(); got != want {
			t.Errorf("Parse(%q).String() = %q, want %q", in, got, want)
		}
	}
}

func TestParseFile(t *testing.T) {
	rules, err := ParseFile([]byte("# overrides\n\"vgpu:hosts:drain\": \"rule:admin or role:vgpu-maintainer\"\nadmin: role:admin\nopen: \"\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 3 || rules["vgpu:hosts:drain"] != "rule:admin or role:vgpu-maintainer" || rules["open"] != "" {
		t.Errorf("rules = %v", rules)
	}
	for _, empty := range []string{"", "# nothing\n", "{}", "---\n"} {
		if rules, err := ParseFile([]byte(empty)); err != nil || len(rules) != 0 {
			t.Errorf("ParseFile(%q) = %v, %v; want no rule", empty, rules, err)
		}
	}
	if rules, err := ParseFile([]byte(`{"admin": "role:admin"}`)); err != nil || rules["admin"] != "role:admin" {
		t.Errorf("JSON: %v, %v", rules, err)
	}
	for _, tc := range []struct{ text, want string }{
		{"a: role:x\nb: (role:y\n", `line 2: rule "b": a ( is not closed`},
		{"a: role:x\na: role:y\n", `line 2: rule "a" is already given at line 1`},
		{"a:\n", `line 1: rule "a": want a string`}, // a forgotten value is not ""
		{"a: [role:x]\n", `rule "a": want a string`},
		{"a: 1\n", `rule "a": want a string`},
		{"- role:x\n", "want a mapping"},
		{"a: \"unclosed\n", "not YAML"},
	} {
		_, err := ParseFile([]byte(tc.text))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseFile(%q) = %v, want an error with %q", tc.text, err, tc.want)
		}
	}
}

// FuzzParse: any text either fails to parse or gives a check whose
// String parses to the same check, and evaluating it does not panic.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "@", "!", "role:admin", "rule:admin or role:reader", "not (role:a and project_id:%(project_id)s)",
		"'member':%(role.name)s", "project_id:a%%b", "((role:a) or (not role:b)) and system_scope:all",
		"is_admin:True", "role:a)", "(role:a", "user_id:%(user_id", "%", "rule:", "NOT role:x AND @",
	} {
		f.Add(s)
	}
	creds := Credentials{Roles: []string{"admin", "a"}, Attrs: map[string]string{"project_id": "p", "system_scope": "all"}}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Parse(s)
		if err != nil {
			return
		}
		again, err := Parse(c.String())
		if err != nil {
			t.Fatalf("Parse(%q).String() = %q does not parse: %v", s, c.String(), err)
		}
		if again.String() != c.String() {
			t.Fatalf("Parse(%q): %q, then %q", s, c.String(), again.String())
		}
		r := &Rules{checks: map[string]Check{"it": c, "admin": roleCheck{match: value{{text: "admin"}}}}}
		r.Allowed("it", creds, Target{"project_id": "p"})
	})
}

// FuzzParseFile: any file either is refused or gives rules that all parse.
func FuzzParseFile(f *testing.F) {
	for _, s := range []string{
		"", "a: role:x\n", "\"vgpu:hosts:drain\": \"rule:admin or role:vgpu-maintainer\"\n", "{\"a\": \"@\"}",
		"a: role:x\na: role:y\n", "a:\n", "- x\n", "a: &x role:y\nb: *x\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rules, err := ParseFile(b)
		if err != nil {
			return
		}
		for name, rule := range rules {
			if _, err := Parse(rule); err != nil {
				t.Fatalf("rule %q = %q was accepted but does not parse: %v", name, rule, err)
			}
		}
		_, _ = Compile(rules)
	})
}
