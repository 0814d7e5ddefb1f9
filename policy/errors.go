package policy

import (
	"fmt"
	"strings"
)

// Error is one problem in a policy or compatibility file, at a 1-based line
// and column (0 when unknown).
type Error struct {
	Line int    `json:"line"`
	Col  int    `json:"column"`
	Rule string `json:"rule,omitempty"` // rule name when the problem is in a rule
	Msg  string `json:"message"`
}

func (e Error) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "%d:%d: ", e.Line, e.Col)
	}
	if e.Rule != "" {
		fmt.Fprintf(&b, "rule %q: ", e.Rule)
	}
	b.WriteString(e.Msg)
	return b.String()
}

// LoadError holds every problem found in a file. Callers print it one
// problem a line ("rules.yaml:12:9: rule \"x\": ...").
type LoadError struct {
	File   string
	Errors []Error
}

func (e *LoadError) Error() string {
	var b strings.Builder
	for i, pe := range e.Errors {
		if i > 0 {
			b.WriteByte('\n')
		}
		if e.File != "" {
			b.WriteString(e.File)
			b.WriteByte(':')
		}
		b.WriteString(pe.Error())
	}
	return b.String()
}
