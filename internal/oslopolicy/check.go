// Package oslopolicy parses and evaluates access rules written in the
// check language of OpenStack's oslo.policy, the language of a service's
// policy.yaml:
//
//	"admin": "role:admin"
//	"vgpu:hosts:drain": "rule:admin or (role:vgpu-maintainer and system_scope:all)"
//
// It supports the subset that role-based access needs: "@" (always), "!"
// (never), "" (always, as in oslo.policy), role:NAME, rule:NAME,
// KEY:VALUE comparisons of a credential (user_id, project_id, domain_id,
// system_scope, is_admin, ...) with a literal or a %(key)s of the target,
// 'LITERAL':%(key)s, and "not", "and", "or" with parentheses (not binds
// tightest, then and, then or). It does not support http: checks or the
// old list-of-lists syntax: a rule using them is an error, not a check
// that silently fails, so that a policy file means what it says or is
// refused.
//
// The one Go port of oslo.policy (github.com/databus23/goslo.policy) is
// not available from the module proxy this project builds with, and its
// parser keeps no tree this project could render in its documentation.
package oslopolicy

import (
	"fmt"
	"slices"
	"strings"
)

// Credentials are what a caller's token says: its roles (compared without
// regard to case, as oslo.policy does) and its attributes (user_id,
// project_id, domain_id, system_scope, is_admin, ...).
type Credentials struct {
	Roles []string
	Attrs map[string]string
}

// Target is what a rule is checked against: the values of %(key)s.
type Target map[string]string

// Attributes are the credential keys a KEY:VALUE check may compare; a
// check naming another key is an error (a typo would otherwise never
// match, silently).
var Attributes = []string{"user_id", "project_id", "domain_id", "user_domain_id", "project_domain_id",
	"system_scope", "is_admin"}

// Check is one parsed rule or part of one.
type Check interface {
	// String is the check in the policy language; parsing it gives the
	// same check.
	String() string
	eval(e *evaluation) bool
}

type evaluation struct {
	rules  map[string]Check
	creds  Credentials
	target Target
	depth  int
}

// maxRuleDepth bounds rule:NAME references followed in one evaluation.
// Cycles are refused when rules are compiled; this guards the rest.
const maxRuleDepth = 64

type (
	trueCheck  struct{}
	falseCheck struct{}
	notCheck   struct{ c Check }
	andCheck   struct{ cs []Check }
	orCheck    struct{ cs []Check }
	ruleCheck  struct{ name string }
	roleCheck  struct{ match value }
	// genericCheck compares a credential attribute (or, when literal is
	// set, a literal) with a value.
	genericCheck struct {
		kind    string
		literal bool
		match   value
	}
)

func (trueCheck) String() string        { return "@" }
func (trueCheck) eval(*evaluation) bool { return true }

func (falseCheck) String() string        { return "!" }
func (falseCheck) eval(*evaluation) bool { return false }

func (c notCheck) String() string          { return "not " + group(c.c) }
func (c notCheck) eval(e *evaluation) bool { return !c.c.eval(e) }

func (c andCheck) String() string { return join(c.cs, " and ") }
func (c andCheck) eval(e *evaluation) bool {
	for _, x := range c.cs {
		if !x.eval(e) {
			return false
		}
	}
	return true
}

func (c orCheck) String() string { return join(c.cs, " or ") }
func (c orCheck) eval(e *evaluation) bool {
	for _, x := range c.cs {
		if x.eval(e) {
			return true
		}
	}
	return false
}

func (c ruleCheck) String() string { return "rule:" + c.name }
func (c ruleCheck) eval(e *evaluation) bool {
	r, ok := e.rules[c.name]
	if !ok || e.depth >= maxRuleDepth {
		return false // as oslo.policy: a rule that is not defined allows nothing
	}
	e.depth++
	defer func() { e.depth-- }()
	return r.eval(e)
}

func (c roleCheck) String() string { return "role:" + c.match.String() }
func (c roleCheck) eval(e *evaluation) bool {
	want, ok := c.match.in(e.target)
	if !ok {
		return false
	}
	return slices.ContainsFunc(e.creds.Roles, func(r string) bool { return strings.EqualFold(r, want) })
}

func (c genericCheck) String() string {
	if c.literal {
		return "'" + c.kind + "':" + c.match.String()
	}
	return c.kind + ":" + c.match.String()
}

func (c genericCheck) eval(e *evaluation) bool {
	want, ok := c.match.in(e.target)
	if !ok {
		return false // as oslo.policy: a target without the key matches nothing
	}
	if c.literal {
		return c.kind == want
	}
	have, ok := e.creds.Attrs[c.kind]
	return ok && have == want
}

// group is c in parentheses when it is an and or an or, so that String
// keeps the tree's shape.
func group(c Check) string {
	switch c.(type) {
	case andCheck, orCheck:
		return "(" + c.String() + ")"
	}
	return c.String()
}

func join(cs []Check, sep string) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = group(c)
	}
	return strings.Join(parts, sep)
}

// value is a check's right-hand side: literal text and %(key)s
// substitutions from the target, in order.
type value []part

type part struct {
	text string
	key  bool // text is a target key
}

func (v value) String() string {
	var b strings.Builder
	for _, p := range v {
		if p.key {
			b.WriteString("%(" + p.text + ")s")
		} else {
			b.WriteString(strings.ReplaceAll(p.text, "%", "%%"))
		}
	}
	return b.String()
}

// in is v with the target's values substituted; false when the target
// lacks one of its keys.
func (v value) in(t Target) (string, bool) {
	if len(v) == 1 && !v[0].key {
		return v[0].text, true
	}
	var b strings.Builder
	for _, p := range v {
		if !p.key {
			b.WriteString(p.text)
			continue
		}
		s, ok := t[p.text]
		if !ok {
			return "", false
		}
		b.WriteString(s)
	}
	return b.String(), true
}

// parseValue reads "text%(key)stext", with %% for a literal %, as
// Python's %-formatting with a mapping, which oslo.policy uses.
func parseValue(s string) (value, error) {
	var v value
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			v = append(v, part{text: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			lit.WriteByte(s[i])
			continue
		}
		rest := s[i+1:]
		switch {
		case strings.HasPrefix(rest, "%"):
			lit.WriteByte('%')
			i++
		case strings.HasPrefix(rest, "("):
			end := strings.Index(rest, ")s")
			if end < 0 {
				return nil, fmt.Errorf("%q: a %%(key)s substitution has no closing )s", s)
			}
			key := rest[1:end]
			if key == "" || strings.ContainsAny(key, "%()") {
				return nil, fmt.Errorf("%q: %%(%s)s is not a target key", s, key)
			}
			flush()
			v = append(v, part{text: key, key: true})
			i += end + 2
		default:
			return nil, fmt.Errorf("%q: a %% starts %%(key)s or %%%% (a literal %%)", s)
		}
	}
	flush()
	if len(v) == 0 {
		v = value{{text: ""}}
	}
	return v, nil
}
