package store

import (
	"regexp"
	"strconv"
	"strings"
)

// Part is one statement, with its own placeholders ($1, $2, …) and
// arguments, that With joins with others into one: a data-modifying
// statement (INSERT, UPDATE, DELETE; a RETURNING clause is not needed)
// or a SELECT. The package that owns the table a Part writes builds it
// (TestOneOwner reads its SQL there).
type Part struct {
	SQL  string
	Args []any
}

var placeholder = regexp.MustCompile(`\$([0-9]+)`)

// shift renumbers the placeholders of sql by off ($1 becomes $1+off).
func shift(sql string, off int) string {
	if off == 0 {
		return sql
	}
	return placeholder.ReplaceAllStringFunc(sql, func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		return "$" + strconv.Itoa(n+off)
	})
}

// With joins parts into one statement: each part becomes a common table
// expression (w1, w2, …) of final, which reads what the statement
// returns. Postgres runs every data-modifying expression once, to
// completion, whether final reads it or not; all of them, and final,
// see the database as the statement began (none sees another's
// changes). final's placeholders come after the parts'. The SQL must not
// hold a "$" other than its placeholders.
func With(final Part, parts ...Part) (string, []any) {
	if len(parts) == 0 {
		return final.SQL, final.Args
	}
	var b strings.Builder
	var args []any
	b.WriteString("WITH ")
	for i, p := range parts {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("w" + strconv.Itoa(i+1) + " AS (")
		b.WriteString(shift(p.SQL, len(args)))
		b.WriteString(")")
		args = append(args, p.Args...)
	}
	b.WriteString(" ")
	b.WriteString(shift(final.SQL, len(args)))
	args = append(args, final.Args...)
	return b.String(), args
}
