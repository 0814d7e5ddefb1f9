package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

// usageColumns are the table headers and CSV fields of each group.
var usageColumns = map[string]struct{ header, field string }{
	"project":   {"PROJECT", "project_id"},
	"user":      {"USER", "user_id"},
	"instance":  {"INSTANCE", "instance_uuid"},
	"profile":   {"PROFILE", "profile"},
	"vgpu_type": {"VGPU TYPE", "vgpu_type"},
	"host":      {"HOST", "host"},
	"path":      {"PATH", "path"},
}

func usageCmd(g *globals) *cobra.Command {
	var f apiclient.UsageFilter
	var start, end, groupBy string
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show vGPU usage (vGPU-seconds and vGPU-hours) per project, instance, profile, host",
		Long: `Show the vGPU usage the bridge accounted (GET /v1/usage): the seconds each
vGPU was held within [--start, --end), times its vGPUs, summed per group.
Direct-path vGPUs count from the agent's attach to its release; the vGPUs of
an instance's flavor from Nova's notifications (launch, resizes, moves,
shelve offload, delete), while the instance holds its resources on a host.

--start and --end take an RFC 3339 time (2026-11-01T00:00:00Z) or a date
(2026-11-01, midnight UTC); --end is excluded. Without them the period is the
current audit period ([accounting] audit_period) up to now. --group-by takes
a comma-separated list of ` + strings.Join(apiclient.UsageGroups, ", ") + `
(default: project,instance,profile).

Output: a table with a total line (-o table, the default), CSV with a header
row and one row per group (-o csv), or the API's answer (-o json, -o yaml).
A project-scoped token sees its own project's usage only.`,
		Example: `  vgpuctl usage
  vgpuctl usage --start 2026-11-01 --end 2026-12-01 --group-by project,profile
  vgpuctl usage --project 6f0c7c1e0a2b4d1c9e8f7a6b5c4d3e2f --start 2026-11-01T00:00:00Z -o csv > november.csv
  vgpuctl usage --instance 0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if f.Start, err = parseUsageTime("--start", start); err != nil {
				return err
			}
			if f.End, err = parseUsageTime("--end", end); err != nil {
				return err
			}
			if !f.Start.IsZero() && !f.End.IsZero() && !f.End.After(f.Start) {
				return usageErr(fmt.Errorf("--end %s is not after --start %s", end, start))
			}
			if f.GroupBy, err = parseGroupBy(groupBy); err != nil {
				return err
			}
			rep, err := g.api().Usage(cmd.Context(), f)
			if err != nil {
				return err
			}
			if g.output == outCSV && len(g.columns) == 0 {
				return usageCSV(g.stdout, rep)
			}
			return g.emit(rep.Raw, func(w io.Writer) { usageTable(w, rep) })
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&start, "start", "", "beginning of the period: RFC 3339 time or date (UTC); default: the start of the current audit period")
	fl.StringVar(&end, "end", "", "end of the period, excluded: RFC 3339 time or date (UTC); default: now")
	fl.StringVar(&f.Project, "project", "", "only this project (id)")
	fl.StringVar(&f.Profile, "profile", "", "only this vGPU profile, e.g. T4-4Q")
	fl.StringVar(&f.InstanceUUID, "instance", "", "only this instance (UUID)")
	fl.StringVar(&groupBy, "group-by", "", "comma-separated groups: "+strings.Join(apiclient.UsageGroups, ",")+" (default project,instance,profile)")
	cmd.RegisterFlagCompletionFunc("group-by", func(_ *cobra.Command, _ []string, typed string) ([]string, cobra.ShellCompDirective) {
		// Complete the last element of the list.
		prefix := ""
		if i := strings.LastIndex(typed, ","); i >= 0 {
			prefix = typed[:i+1]
		}
		out := make([]string, 0, len(apiclient.UsageGroups))
		for _, gr := range apiclient.UsageGroups {
			out = append(out, prefix+gr)
		}
		return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	})
	return cmd
}

// parseUsageTime reads an RFC 3339 time or a date (midnight UTC); "" is
// the zero time (the bridge's default).
func parseUsageTime(flag, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.ParseInLocation(time.DateOnly, s, time.UTC); err == nil {
		return t, nil
	}
	return time.Time{}, usageErr(fmt.Errorf("%s %q: give an RFC 3339 time (2026-11-01T00:00:00Z) or a date (2026-11-01, midnight UTC)", flag, s))
}

// parseGroupBy reads a comma-separated list of groups, each once; "" is
// the bridge's default.
func parseGroupBy(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []string
	for _, gr := range strings.Split(s, ",") {
		gr = strings.TrimSpace(gr)
		if gr == "" {
			continue // a trailing comma
		}
		if !slices.Contains(apiclient.UsageGroups, gr) {
			return nil, usageErr(fmt.Errorf("--group-by %q: %q is not one of %s", s, gr, strings.Join(apiclient.UsageGroups, ", ")))
		}
		if !slices.Contains(out, gr) {
			out = append(out, gr)
		}
	}
	return out, nil
}

// vgpuHours renders seconds as hours with two decimals, rounded half up
// (exact: no floating point).
func vgpuHours(secs int64) string {
	neg := secs < 0
	if neg {
		secs = -secs
	}
	h := (secs*100 + 1800) / 3600
	s := fmt.Sprintf("%d.%02d", h/100, h%100)
	if neg && h != 0 {
		s = "-" + s
	}
	return s
}

func usageTable(w io.Writer, rep apiclient.UsageReport) {
	var hdr []string
	for _, gr := range rep.GroupBy {
		hdr = append(hdr, usageHeader(gr))
	}
	header(w, append(hdr, "VGPU SECONDS", "VGPU HOURS")...)
	for _, r := range rep.Usage {
		cells := make([]string, 0, len(rep.GroupBy)+2)
		for _, gr := range rep.GroupBy {
			cells = append(cells, r.Group(gr))
		}
		row(w, append(cells, fmt.Sprint(r.VGPUSeconds), vgpuHours(r.VGPUSeconds))...)
	}
	total := make([]string, max(len(rep.GroupBy), 1))
	total[0] = "TOTAL"
	header(w, append(total, fmt.Sprint(rep.Total), vgpuHours(rep.Total))...)
	closed := "no audit period closed yet"
	if rep.ClosedThrough != nil {
		closed = "closed through " + ts(*rep.ClosedThrough)
	}
	fmt.Fprintf(w, "\nfrom %s to %s; audit period %s, %s\n", ts(rep.Start), ts(rep.End), rep.AuditPeriod, closed)
}

func usageHeader(gr string) string {
	if c, ok := usageColumns[gr]; ok {
		return c.header
	}
	return strings.ToUpper(strings.ReplaceAll(gr, "_", " "))
}

// usageCSV writes a header row and one row per group (RFC 4180), no total.
func usageCSV(w io.Writer, rep apiclient.UsageReport) error {
	cw := csv.NewWriter(w)
	var hdr []string
	for _, gr := range rep.GroupBy {
		if c, ok := usageColumns[gr]; ok {
			hdr = append(hdr, c.field)
		} else {
			hdr = append(hdr, gr)
		}
	}
	if err := cw.Write(append(hdr, "vgpu_seconds", "vgpu_hours")); err != nil {
		return err
	}
	for _, r := range rep.Usage {
		rec := make([]string, 0, len(rep.GroupBy)+2)
		for _, gr := range rep.GroupBy {
			rec = append(rec, r.Group(gr))
		}
		if err := cw.Write(append(rec, fmt.Sprint(r.VGPUSeconds), vgpuHours(r.VGPUSeconds))); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
