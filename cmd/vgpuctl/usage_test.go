package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
)

// usageAnswer is a GET /v1/usage answer grouped by project, instance and
// profile; one instance's profile is empty (an untyped flavor group).
const usageAnswer = `{"start":"2026-11-01T00:00:00Z","end":"2026-12-01T00:00:00Z","audit_period":"hour",
"closed_through":"2026-12-05T13:00:00Z","group_by":["project","instance","profile"],
"usage":[{"project_id":"p1","instance_uuid":"00000000-0000-4000-8000-0000000000a1","profile":"T4-4Q","vgpu_seconds":7200},
{"project_id":"p1","instance_uuid":"00000000-0000-4000-8000-0000000000a2","profile":"","vgpu_seconds":5418},
{"project_id":"p2, \"lab\"","instance_uuid":"00000000-0000-4000-8000-0000000000b1","profile":"T4-8Q","vgpu_seconds":17}],
"total_vgpu_seconds":12635}`

func usageServer(t *testing.T, answer string) (*httptest.Server, *atomic.Value) {
	t.Helper()
	var query atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/usage" {
			http.NotFound(w, r)
			return
		}
		query.Store(r.URL.Query())
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer)
	}))
	t.Cleanup(srv.Close)
	return srv, &query
}

func TestUsageOutputs(t *testing.T) {
	srv, _ := usageServer(t, usageAnswer)
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"table", nil, `PROJECT    INSTANCE                              PROFILE  VGPU SECONDS  VGPU HOURS
p1         00000000-0000-4000-8000-0000000000a1  T4-4Q    7200          2.00
p1         00000000-0000-4000-8000-0000000000a2  -        5418          1.51
p2, "lab"  00000000-0000-4000-8000-0000000000b1  T4-8Q    17            0.00
TOTAL                                                     12635         3.51

from 2026-11-01T00:00:00Z to 2026-12-01T00:00:00Z; audit period hour, closed through 2026-12-05T13:00:00Z
`},
		{"csv", []string{"-o", "csv"}, `project_id,instance_uuid,profile,vgpu_seconds,vgpu_hours
p1,00000000-0000-4000-8000-0000000000a1,T4-4Q,7200,2.00
p1,00000000-0000-4000-8000-0000000000a2,,5418,1.51
"p2, ""lab""",00000000-0000-4000-8000-0000000000b1,T4-8Q,17,0.00
`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := vgpuctl(append([]string{"usage", "--url", srv.URL}, tt.args...)...)
			if code != 0 || errs != "" {
				t.Fatalf("exit %d, stderr %s", code, errs)
			}
			if out != tt.want {
				t.Errorf("output:\n%s\nwant:\n%s", out, tt.want)
			}
		})
	}
	// JSON is the answer as sent (indented); YAML keeps the numbers.
	code, out, errs := vgpuctl("usage", "--url", srv.URL, "-o", "json")
	if code != 0 || !strings.Contains(out, `"total_vgpu_seconds": 12635`) || !strings.Contains(out, `"closed_through": "2026-12-05T13:00:00Z"`) {
		t.Errorf("json: exit %d, stderr %s\n%s", code, errs, out)
	}
	code, out, errs = vgpuctl("usage", "--url", srv.URL, "-o", "yaml")
	if code != 0 || !strings.Contains(out, "total_vgpu_seconds: 12635\n") || !strings.Contains(out, "vgpu_seconds: 5418\n") {
		t.Errorf("yaml: exit %d, stderr %s\n%s", code, errs, out)
	}
}

func TestUsageNoClosedPeriod(t *testing.T) {
	srv, _ := usageServer(t, `{"start":"2026-12-05T13:00:00Z","end":"2026-12-05T13:30:00Z","audit_period":"hour","closed_through":null,
		"group_by":["host"],"usage":[],"total_vgpu_seconds":0}`)
	code, out, errs := vgpuctl("usage", "--url", srv.URL, "--group-by", "host")
	want := `HOST   VGPU SECONDS  VGPU HOURS
TOTAL  0             0.00

from 2026-12-05T13:00:00Z to 2026-12-05T13:30:00Z; audit period hour, no audit period closed yet
`
	if code != 0 || out != want {
		t.Errorf("exit %d, stderr %s, output:\n%s\nwant:\n%s", code, errs, out, want)
	}
	code, out, _ = vgpuctl("usage", "--url", srv.URL, "--group-by", "host", "-o", "csv")
	if code != 0 || out != "host,vgpu_seconds,vgpu_hours\n" {
		t.Errorf("empty csv: exit %d %q", code, out)
	}
}

// The flags become the query: times in UTC RFC 3339, a date as midnight
// UTC, the groups as one comma-separated list.
func TestUsageQuery(t *testing.T) {
	srv, query := usageServer(t, usageAnswer)
	for _, tt := range []struct {
		args []string
		want url.Values
	}{
		{nil, url.Values{}},
		{[]string{"--start", "2026-11-01", "--end", "2026-12-01T01:00:00+01:00"},
			url.Values{"start": {"2026-11-01T00:00:00Z"}, "end": {"2026-12-01T00:00:00Z"}}},
		{[]string{"--project", "p1", "--profile", "T4-4Q", "--instance", "00000000-0000-4000-8000-0000000000a1", "--group-by", "profile, host,profile,"},
			url.Values{"project": {"p1"}, "profile": {"T4-4Q"}, "instance_uuid": {"00000000-0000-4000-8000-0000000000a1"}, "group_by": {"profile,host"}}},
		{[]string{"--start", "2026-11-01T00:00:00.5Z"}, url.Values{"start": {"2026-11-01T00:00:00.5Z"}}},
	} {
		code, _, errs := vgpuctl(append([]string{"usage", "--url", srv.URL}, tt.args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d, stderr %s", tt.args, code, errs)
		}
		got := query.Load().(url.Values)
		if got.Encode() != tt.want.Encode() {
			t.Errorf("%v: query %s, want %s", tt.args, got.Encode(), tt.want.Encode())
		}
	}
}

func TestUsageBadFlagsExit2(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "xml"}, `vgpuctl: output format "xml": use table, json, yaml, value, csv`},
		{[]string{"--start", "yesterday"}, `vgpuctl: --start "yesterday": give an RFC 3339 time (2026-11-01T00:00:00Z) or a date (2026-11-01, midnight UTC)`},
		{[]string{"--end", "2026-13-01"}, `vgpuctl: --end "2026-13-01": give an RFC 3339 time`},
		{[]string{"--start", "2026-12-01", "--end", "2026-11-01"}, "vgpuctl: --end 2026-11-01 is not after --start 2026-12-01"},
		{[]string{"--group-by", "project,tenant"}, `vgpuctl: --group-by "project,tenant": "tenant" is not one of project, user, instance, profile, vgpu_type, host, path`},
		{[]string{"extra"}, "vgpuctl: unknown command"},
	} {
		code, out, errs := vgpuctl(append([]string{"usage", "--url", "http://127.0.0.1:1"}, tt.args...)...)
		if code != exitUsage || out != "" || !strings.HasPrefix(errs, tt.want) {
			t.Errorf("%v: exit %d (want %d), stdout %q, stderr %q (want prefix %q)", tt.args, code, exitUsage, out, errs, tt.want)
		}
	}
}

func TestVGPUHours(t *testing.T) {
	for secs, want := range map[int64]string{0: "0.00", 17: "0.00", 18: "0.01", 3600: "1.00", 5418: "1.51", 5399: "1.50",
		86399: "24.00", 9_223_372_036_854_775: "2562047788015.22", -18: "-0.01", -17: "0.00"} {
		if got := vgpuHours(secs); got != want {
			t.Errorf("vgpuHours(%d) = %s, want %s", secs, got, want)
		}
	}
}
