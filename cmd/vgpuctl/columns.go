package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"gopkg.in/yaml.v3"
)

// record is the writer a command's table function gets for -f value and
// csv and for -c: header, row and kv record what they write (cells as
// given, empty ones empty), and other text (footers) is dropped.
type record struct {
	sections []*section
	text     bytes.Buffer
}

// section is one table (list) or one run of kv fields (show).
type section struct {
	show    bool
	columns []string
	rows    [][]string
}

func (r *record) Write(p []byte) (int, error) { return r.text.Write(p) }

func (r *record) header(cells []string) {
	r.sections = append(r.sections, &section{columns: append([]string(nil), cells...)})
}

func (r *record) row(cells []string) {
	if len(r.sections) == 0 || r.sections[len(r.sections)-1].show {
		r.header(make([]string, len(cells)))
	}
	s := r.sections[len(r.sections)-1]
	s.rows = append(s.rows, append([]string(nil), cells...))
}

func (r *record) kv(pairs []string) {
	if len(r.sections) == 0 || !r.sections[len(r.sections)-1].show {
		r.sections = append(r.sections, &section{show: true, rows: [][]string{nil}})
	}
	s := r.sections[len(r.sections)-1]
	for i := 0; i+1 < len(pairs); i += 2 {
		s.columns = append(s.columns, pairs[i])
		s.rows[0] = append(s.rows[0], pairs[i+1])
	}
}

// columnKey is a column's name in JSON and YAML, and what -c matches
// case-insensitively: "PCI ADDRESS" and "Pci address" are pci_address.
func columnKey(name string) string {
	return strings.ReplaceAll(strings.ReplaceAll(strings.ToLower(strings.TrimSpace(name)), " ", "_"), "-", "_")
}

// pick keeps the columns named, in the order named. A name no column has
// is a usage error listing the column names.
func (s *section) pick(names []string) (*section, error) {
	if len(names) == 0 {
		return s, nil
	}
	out := &section{show: s.show}
	var idx []int
	for _, n := range names {
		i := -1
		for j, c := range s.columns {
			if columnKey(c) == columnKey(n) {
				i = j
				break
			}
		}
		if i < 0 {
			known := make([]string, len(s.columns))
			for j, c := range s.columns {
				known[j] = columnKey(c)
			}
			return nil, usageErr(fmt.Errorf("-c %s: no such column; the columns are %s", n, strings.Join(known, ", ")))
		}
		idx = append(idx, i)
		out.columns = append(out.columns, s.columns[i])
	}
	for _, r := range s.rows {
		cells := make([]string, len(idx))
		for k, i := range idx {
			if i < len(r) {
				cells[k] = r[i]
			}
		}
		out.rows = append(out.rows, cells)
	}
	return out, nil
}

// print writes what was recorded in format, with the columns named (all
// when none). A command's first section is its output (a show's fields,
// or a list), as with the openstack client; a command that wrote text
// only prints it for table and value.
func (r *record) print(w io.Writer, format string, columns []string) error {
	if len(r.sections) == 0 {
		if len(columns) == 0 && (format == outTable || format == outValue) {
			_, err := w.Write(r.text.Bytes())
			return err
		}
		return usageErr(errors.New("this command's output has no columns: use -f table, json or yaml without -c"))
	}
	s, err := r.sections[0].pick(columns)
	if err != nil {
		return err
	}
	switch format {
	case outValue:
		// One row (a show: one field) a line, cells separated by spaces.
		lines := s.rows
		if s.show {
			lines = nil
			for _, v := range s.rows[0] {
				lines = append(lines, []string{v})
			}
		}
		for _, l := range lines {
			if _, err := fmt.Fprintln(w, strings.Join(l, " ")); err != nil {
				return err
			}
		}
		return nil
	case outCSV:
		cw := csv.NewWriter(w)
		if s.show {
			cw.Write([]string{"Field", "Value"}) //nolint:errcheck // cw.Error says
			for i, c := range s.columns {
				cw.Write([]string{c, s.rows[0][i]}) //nolint:errcheck
			}
		} else {
			cw.Write(s.columns) //nolint:errcheck
			cw.WriteAll(s.rows) //nolint:errcheck
		}
		cw.Flush()
		return cw.Error()
	case outJSON, outYAML:
		objs := make([]map[string]string, len(s.rows))
		for i, r := range s.rows {
			objs[i] = map[string]string{}
			for j, c := range s.columns {
				objs[i][columnKey(c)] = r[j]
			}
		}
		var v any = objs
		if s.show {
			v = objs[0]
		}
		if format == outJSON {
			b, err := json.MarshalIndent(v, "", "  ")
			if err != nil {
				return err
			}
			_, err = w.Write(append(b, '\n'))
			return err
		}
		enc := yaml.NewEncoder(w)
		enc.SetIndent(2)
		if err := enc.Encode(v); err != nil {
			return err
		}
		return enc.Close()
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if s.show {
		kv(tw, interleave(s.columns, s.rows[0])...)
	} else {
		header(tw, s.columns...)
		for _, r := range s.rows {
			row(tw, r...)
		}
	}
	return tw.Flush()
}

func interleave(keys, values []string) []string {
	out := make([]string, 0, 2*len(keys))
	for i, k := range keys {
		out = append(out, k, values[i])
	}
	return out
}
