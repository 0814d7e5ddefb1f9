package oslopolicy

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// Rules are compiled, named rules: every rule:NAME they use is defined
// and none refers to itself through others.
type Rules struct {
	checks map[string]Check
}

// Compile parses every rule of src (name -> rule text). Its error names
// every rule that is wrong, and why.
func Compile(src map[string]string) (*Rules, error) {
	r := &Rules{checks: make(map[string]Check, len(src))}
	var errs []error
	for _, name := range sortedKeys(src) {
		c, err := Parse(src[name])
		if err != nil {
			errs = append(errs, fmt.Errorf("rule %q: %w", name, err))
			continue
		}
		r.checks[name] = c
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for _, name := range sortedKeys(src) {
		for _, ref := range refs(r.checks[name]) {
			if _, ok := r.checks[ref]; !ok {
				errs = append(errs, fmt.Errorf("rule %q: rule:%s is not defined", name, ref))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cycle := r.cycle(); cycle != nil {
		return nil, fmt.Errorf("rules refer to themselves: %s", strings.Join(cycle, " -> "))
	}
	return r, nil
}

// Allowed reports whether the rule named name lets creds act on target;
// a rule that is not defined allows nothing.
func (r *Rules) Allowed(name string, creds Credentials, target Target) bool {
	return ruleCheck{name: name}.eval(&evaluation{rules: r.checks, creds: creds, target: target})
}

// Rule is the compiled rule named name, written in the policy language.
func (r *Rules) Rule(name string) (string, bool) {
	c, ok := r.checks[name]
	if !ok {
		return "", false
	}
	return c.String(), true
}

// Refs are the rules c names with rule:, in order, without repeats.
func Refs(c Check) []string { return refs(c) }

func refs(c Check) []string {
	var out []string
	var walk func(Check)
	walk = func(c Check) {
		switch c := c.(type) {
		case ruleCheck:
			for _, n := range out {
				if n == c.name {
					return
				}
			}
			out = append(out, c.name)
		case notCheck:
			walk(c.c)
		case andCheck:
			for _, x := range c.cs {
				walk(x)
			}
		case orCheck:
			for _, x := range c.cs {
				walk(x)
			}
		}
	}
	walk(c)
	return out
}

// cycle is a chain of rules that ends where it started, or nil.
func (r *Rules) cycle() []string {
	const (
		unseen = iota
		open
		done
	)
	state := map[string]int{}
	var path []string
	var visit func(string) []string
	visit = func(n string) []string {
		switch state[n] {
		case open:
			for i, p := range path {
				if p == n {
					return append(append([]string(nil), path[i:]...), n)
				}
			}
		case done:
			return nil
		}
		state[n] = open
		path = append(path, n)
		for _, ref := range refs(r.checks[n]) {
			if c := visit(ref); c != nil {
				return c
			}
		}
		path = path[:len(path)-1]
		state[n] = done
		return nil
	}
	for _, n := range sortedKeys(r.checks) {
		if c := visit(n); c != nil {
			return c
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// ReadFile reads a policy file: a YAML (or JSON) mapping of rule names
// to rules, as oslo.policy's policy.yaml. Errors name the file and line.
func ReadFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy file: %w", err)
	}
	rules, err := ParseFile(b)
	if err != nil {
		return nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	return rules, nil
}

// ParseFile reads the text of a policy file: a YAML mapping of rule
// names to rules (an empty file, or one of comments only, holds none).
// Every rule is parsed, so that an error names its line; a name given
// twice is an error (YAML would keep the last silently).
func ParseFile(b []byte) (map[string]string, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	rules := map[string]string{}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return rules, nil
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return rules, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: want a mapping of rule names to rules (\"vgpu:hosts:drain\": \"rule:admin\")", root.Line)
	}
	lines := map[string]int{}
	var errs []error
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Value == "" {
			errs = append(errs, fmt.Errorf("line %d: a rule's name must be a non-empty string", k.Line))
			continue
		}
		if at, dup := lines[k.Value]; dup {
			errs = append(errs, fmt.Errorf("line %d: rule %q is already given at line %d", k.Line, k.Value, at))
			continue
		}
		lines[k.Value] = k.Line
		// A name with no rule is an error, not the empty rule: "" allows
		// everyone, which a forgotten value must not.
		if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
			errs = append(errs, fmt.Errorf("line %d: rule %q: want a string such as \"role:admin\" (quote it; \"\" allows everyone)", v.Line, k.Value))
			continue
		}
		text := v.Value
		if _, err := Parse(text); err != nil {
			errs = append(errs, fmt.Errorf("line %d: rule %q: %w", v.Line, k.Value, err))
			continue
		}
		rules[k.Value] = text
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return rules, nil
}
