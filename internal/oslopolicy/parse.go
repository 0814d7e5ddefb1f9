package oslopolicy

import (
	"fmt"
	"slices"
	"strings"
)

// maxNesting bounds parentheses and "not"s inside one another, so that a
// hostile file cannot exhaust the stack.
const maxNesting = 50

// Parse reads one rule in the check language. The empty rule allows
// everyone, as in oslo.policy.
func Parse(s string) (Check, error) {
	toks := tokenize(s)
	if len(toks) == 0 {
		return trueCheck{}, nil
	}
	p := &parser{toks: toks}
	c, err := p.or(0)
	if err != nil {
		return nil, err
	}
	if p.pos < len(p.toks) {
		return nil, fmt.Errorf("unexpected %q after a complete rule", p.toks[p.pos])
	}
	return c, nil
}

// tokenize splits s as oslo.policy does: at white space, then each word's
// leading "(" and trailing ")" are tokens of their own, so that a value
// such as %(project_id)s keeps its parentheses.
func tokenize(s string) []string {
	var toks []string
	for _, w := range strings.Fields(s) {
		clean := strings.TrimLeft(w, "(")
		for range len(w) - len(clean) {
			toks = append(toks, "(")
		}
		if clean == "" {
			continue
		}
		inner := strings.TrimRight(clean, ")")
		if inner != "" {
			toks = append(toks, inner)
		}
		for range len(clean) - len(inner) {
			toks = append(toks, ")")
		}
	}
	return toks
}

type parser struct {
	toks []string
	pos  int
}

func (p *parser) peek() string {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	return ""
}

func keyword(tok, kw string) bool { return strings.EqualFold(tok, kw) }

func (p *parser) or(depth int) (Check, error) {
	var cs []Check
	for {
		c, err := p.and(depth)
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
		if !keyword(p.peek(), "or") {
			break
		}
		p.pos++
	}
	if len(cs) == 1 {
		return cs[0], nil
	}
	return orCheck{cs: cs}, nil
}

func (p *parser) and(depth int) (Check, error) {
	var cs []Check
	for {
		c, err := p.unary(depth)
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
		if !keyword(p.peek(), "and") {
			break
		}
		p.pos++
	}
	if len(cs) == 1 {
		return cs[0], nil
	}
	return andCheck{cs: cs}, nil
}

func (p *parser) unary(depth int) (Check, error) {
	if depth > maxNesting {
		return nil, fmt.Errorf("more than %d parentheses or nots inside one another", maxNesting)
	}
	tok := p.peek()
	switch {
	case tok == "":
		if p.pos == 0 {
			return nil, fmt.Errorf("empty rule")
		}
		return nil, fmt.Errorf("the rule ends after %q; a check is missing", p.toks[p.pos-1])
	case keyword(tok, "not"):
		p.pos++
		c, err := p.unary(depth + 1)
		if err != nil {
			return nil, err
		}
		return notCheck{c: c}, nil
	case tok == "(":
		p.pos++
		c, err := p.or(depth + 1)
		if err != nil {
			return nil, err
		}
		if p.peek() != ")" {
			if p.peek() == "" {
				return nil, fmt.Errorf("a ( is not closed")
			}
			return nil, fmt.Errorf("unexpected %q where ) or an and/or was expected", p.peek())
		}
		p.pos++
		return c, nil
	case tok == ")":
		return nil, fmt.Errorf("unexpected ) where a check was expected")
	case keyword(tok, "and"), keyword(tok, "or"):
		return nil, fmt.Errorf("unexpected %q where a check was expected", tok)
	}
	p.pos++
	return parseCheck(tok)
}

// parseCheck reads one check: @, !, role:NAME, rule:NAME, KEY:VALUE or
// 'LITERAL':VALUE.
func parseCheck(tok string) (Check, error) {
	switch tok {
	case "@":
		return trueCheck{}, nil
	case "!":
		return falseCheck{}, nil
	}
	kind, match, ok := strings.Cut(tok, ":")
	if !ok {
		return nil, fmt.Errorf("%q is not a check: want KIND:VALUE (role:admin, rule:admin, project_id:%%(project_id)s), @ or !", tok)
	}
	switch kind {
	case "rule":
		if match == "" || strings.ContainsAny(match, "%") {
			return nil, fmt.Errorf("%q: rule: needs a rule's name", tok)
		}
		return ruleCheck{name: match}, nil
	case "role":
		v, err := parseValue(match)
		if err != nil {
			return nil, err
		}
		if v.String() == "" {
			return nil, fmt.Errorf("%q: role: needs a role's name", tok)
		}
		return roleCheck{match: v}, nil
	case "http", "https":
		return nil, fmt.Errorf("%q: http checks (asking a remote server) are not supported", tok)
	}
	v, err := parseValue(match)
	if err != nil {
		return nil, err
	}
	if lit, ok := literal(kind); ok {
		return genericCheck{kind: lit, literal: true, match: v}, nil
	}
	if !slices.Contains(Attributes, kind) {
		return nil, fmt.Errorf("%q: %s is not a credential this service knows; known: %s, role and rule",
			tok, kind, strings.Join(Attributes, ", "))
	}
	return genericCheck{kind: kind, match: v}, nil
}

// literal reads a quoted string or True/False on the left of a check, as
// oslo.policy's literal_eval does for the literals rules use.
func literal(kind string) (string, bool) {
	if len(kind) >= 2 && (kind[0] == '\'' || kind[0] == '"') && kind[len(kind)-1] == kind[0] {
		s := kind[1 : len(kind)-1]
		if !strings.ContainsAny(s, `'"%`) {
			return s, true
		}
	}
	if kind == "True" || kind == "False" {
		return kind, true
	}
	return "", false
}
