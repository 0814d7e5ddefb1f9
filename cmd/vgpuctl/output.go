package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"gopkg.in/yaml.v3"
)

// Output formats of -f (-o), as the openstack client's.
const (
	outTable = "table"
	outJSON  = "json"
	outYAML  = "yaml"
	outValue = "value"
	outCSV   = "csv"
)

var formats = []string{outTable, outJSON, outYAML, outValue, outCSV}

func checkOutput(o string) error {
	for _, f := range formats {
		if o == f {
			return nil
		}
	}
	return usageErr(fmt.Errorf("output format %q: use %s", o, strings.Join(formats, ", ")))
}

// emit writes raw (the API's answer, kept as sent) as JSON or YAML, or
// calls table for the table format. For -f value and csv, and for any
// format with -c, table's header, rows and fields are recorded and printed
// in that format, with the columns -c names.
func (g *globals) emit(raw json.RawMessage, table func(w io.Writer)) error {
	if len(g.columns) > 0 || g.output == outValue || g.output == outCSV {
		rec := &record{}
		table(rec)
		return rec.print(g.stdout, g.output, g.columns)
	}
	switch g.output {
	case outJSON:
		var b bytes.Buffer
		if err := json.Indent(&b, raw, "", "  "); err != nil {
			return fmt.Errorf("the answer is not JSON: %w", err)
		}
		b.WriteByte('\n')
		_, err := g.stdout.Write(b.Bytes())
		return err
	case outYAML:
		v, err := yamlValue(raw)
		if err != nil {
			return err
		}
		enc := yaml.NewEncoder(g.stdout)
		enc.SetIndent(2)
		if err := enc.Encode(v); err != nil {
			return err
		}
		return enc.Close()
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// yamlValue decodes JSON keeping numbers exact: integers become int64,
// others float64 (yaml.v3 would quote a json.Number as a string).
func yamlValue(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("the answer is not JSON: %w", err)
	}
	return numbers(v), nil
}

func numbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = numbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = numbers(e)
		}
	case json.Number:
		if n, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return n
		}
		if f, err := strconv.ParseFloat(string(x), 64); err == nil {
			return f
		}
		return string(x)
	}
	return v
}

// row writes one tab-separated table line.
func row(w io.Writer, cells ...string) {
	if r, ok := w.(*record); ok {
		r.row(cells)
		return
	}
	for i, c := range cells {
		if c == "" {
			cells[i] = "-"
		}
	}
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// header writes the header line (never dashed).
func header(w io.Writer, cells ...string) {
	if r, ok := w.(*record); ok {
		r.header(cells)
		return
	}
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// kv writes "Key:<tab>value" lines; empty values show as "-".
func kv(w io.Writer, pairs ...string) {
	if r, ok := w.(*record); ok {
		r.kv(pairs)
		return
	}
	for i := 0; i+1 < len(pairs); i += 2 {
		v := pairs[i+1]
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(w, "%s:\t%s\n", pairs[i], v)
	}
}

// Time format of tables: UTC, to the second.
const tableTime = "2006-01-02T15:04:05Z"

func ts(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(tableTime)
}

func tsp(t *time.Time) string {
	if t == nil {
		return ""
	}
	return ts(*t)
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func itoa(n int) string { return strconv.Itoa(n) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// clip shortens s to n runes for table cells, marking the cut.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// compact renders a JSON value on one line ("" for null or absent).
func compact(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}
