package diagnose

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable prints a report for people.
func WriteTable(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEVERITY\tCHECK\tSUBJECT\tCODE\tFINDING")
	for _, f := range r.Findings {
		code := "-"
		if f.NvidiaCode != 0 {
			code = fmt.Sprint(f.NvidiaCode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", strings.ToUpper(string(f.Severity)), f.Check, f.Subject, code, f.Title)
		for _, e := range f.Evidence {
			fmt.Fprintf(tw, "\t\t\t\t  seen: %s\n", e)
		}
		if f.Fix != "" {
			fmt.Fprintf(tw, "\t\t\t\t  fix:  %s\n", f.Fix)
		}
	}
	fmt.Fprintf(tw, "\nworst: %s\n", r.Worst)
	return tw.Flush()
}
