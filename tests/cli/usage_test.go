package cli

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Instances of the usage test.
const (
	useA = "00000000-0000-4000-8000-0000000000a1" // p1, direct T4-4Q on cn1
	useB = "00000000-0000-4000-8000-0000000000b1" // p1, flavor 2 × T4-4Q, moved from cn1 to cn2
	useC = "00000000-0000-4000-8000-0000000000c1" // p2, direct T4-8Q on cn2, still attached
	useD = "00000000-0000-4000-8000-0000000000d1" // p2, direct T4-4Q on cn1, 20 min 18 s
)

// usageRows are the intervals the test writes into vgpu_usage, and what
// each counts within 2024-06-01 (UTC), the period asked for.
var usageRows = []struct {
	path, instance, project, host, profile, vgpuType string
	amount                                           int
	start, end                                       string // end "": still open
	seconds                                          int64  // vGPU-seconds within the day
}{
	{"direct", useA, "p1", "cn1", "T4-4Q", "nvidia-232", 1, "2024-06-01T08:00:00Z", "2024-06-01T10:00:00Z", 7200},
	// Begun before the day: only its part within it counts; 2 vGPUs.
	{"flavor", useB, "p1", "cn1", "T4-4Q", "nvidia-232", 2, "2024-05-31T23:00:00Z", "2024-06-01T01:30:00Z", 10800},
	// The move to cn2 ends one interval and begins the next.
	{"flavor", useB, "p1", "cn2", "T4-4Q", "nvidia-232", 2, "2024-06-01T01:30:00Z", "2024-06-01T02:00:00Z", 3600},
	// Open: counts up to the end of the period.
	{"direct", useC, "p2", "cn2", "T4-8Q", "nvidia-233", 1, "2024-06-01T23:00:00Z", "", 3600},
	{"direct", useD, "p2", "cn1", "T4-4Q", "nvidia-232", 1, "2024-06-01T12:00:00Z", "2024-06-01T12:20:18Z", 1218},
	// After the period: not counted.
	{"direct", useD, "p2", "cn1", "T4-4Q", "nvidia-232", 1, "2024-06-03T12:00:00Z", "2024-06-03T13:00:00Z", 0},
}

// reClosed masks how far the bridge has closed audit periods: its closer
// runs on its own clock, so the answer may come before or after it closed
// the test's hours.
var (
	reClosedTable = regexp.MustCompile(`(closed through \S+|no audit period closed yet)\n`)
	reClosedJSON  = regexp.MustCompile(`"closed_through": (null|"[^"]*")`)
)

func maskClosed(s string) string {
	s = reClosedTable.ReplaceAllString(s, "closed through <closed>\n")
	return reClosedJSON.ReplaceAllString(s, `"closed_through": "<closed>"`)
}

// TestUsage: vgpuctl usage against a real bridge whose vgpu_usage holds
// known intervals; table, CSV and JSON give the exact seconds, filters and
// groups narrow them, and a project-scoped token sees its project only.
func TestUsage(t *testing.T) {
	e := startBridge(t)
	ctx := context.Background()
	var total int64
	for _, r := range usageRows {
		var attachment *uuid.UUID
		if r.path == "direct" {
			id := uuid.New()
			attachment = &id
		}
		var end *string
		if r.end != "" {
			end = &r.end
		}
		_, err := e.pool.Exec(ctx, `INSERT INTO vgpu_usage (path, attachment_id, instance_uuid, project_id, user_id, host, profile, vgpu_type,
				amount, started_at, ended_at)
			VALUES ($1, $2, $3, $4, 'u-'||$4, $5, $6, $7, $8, $9::timestamptz, $10::timestamptz)`,
			r.path, attachment, r.instance, r.project, r.host, r.profile, r.vgpuType, r.amount, r.start, end)
		testsvc.Must(t, err, "insert usage")
		total += r.seconds
	}
	if total != 26418 {
		t.Fatalf("the fixture adds up to %d, not 26418", total)
	}
	day := []string{"usage", "--start", "2024-06-01", "--end", "2024-06-02T00:00:00Z"}

	t.Run("table", func(t *testing.T) {
		r := e.reader.must(t, 0, day...)
		golden(t, "usage", maskClosed(r.stdout))
		if !strings.Contains(r.stdout, "\nTOTAL ") || !strings.Contains(r.stdout, " 26418 ") || !strings.Contains(r.stdout, " 7.34\n") {
			t.Errorf("total line: %s", r)
		}
		golden(t, "usage-profile-host", maskClosed(e.reader.must(t, 0, append(day, "--group-by", "profile,host")...).stdout))
		golden(t, "usage-p2", maskClosed(e.reader.must(t, 0, append(day, "--project", "p2")...).stdout))
	})

	t.Run("csv", func(t *testing.T) {
		r := e.reader.must(t, 0, append(day, "-o", "csv")...)
		want := "project_id,instance_uuid,profile,vgpu_seconds,vgpu_hours\n" +
			"p1," + useA + ",T4-4Q,7200,2.00\n" +
			"p1," + useB + ",T4-4Q,14400,4.00\n" +
			"p2," + useC + ",T4-8Q,3600,1.00\n" +
			"p2," + useD + ",T4-4Q,1218,0.34\n"
		if r.stdout != want {
			t.Errorf("csv:\n%s\nwant:\n%s", r.stdout, want)
		}
		golden(t, "usage-csv", r.stdout)
		r = e.reader.must(t, 0, append(day, "-o", "csv", "--instance", useB, "--group-by", "host,path")...)
		want = "host,path,vgpu_seconds,vgpu_hours\ncn1,flavor,10800,3.00\ncn2,flavor,3600,1.00\n"
		if r.stdout != want {
			t.Errorf("csv of one instance:\n%s\nwant:\n%s", r.stdout, want)
		}
	})

	t.Run("json", func(t *testing.T) {
		r := e.reader.must(t, 0, append(day, "--group-by", "project,profile", "-o", "json")...)
		golden(t, "usage-json", maskClosed(r.stdout))
		var rep apiclient.UsageReport
		testsvc.Must(t, json.Unmarshal([]byte(r.stdout), &rep), "usage json")
		want := []apiclient.UsageRow{{ProjectID: "p1", Profile: "T4-4Q", VGPUSeconds: 21600},
			{ProjectID: "p2", Profile: "T4-4Q", VGPUSeconds: 1218}, {ProjectID: "p2", Profile: "T4-8Q", VGPUSeconds: 3600}}
		if rep.Total != 26418 || len(rep.Usage) != len(want) || strings.Join(rep.GroupBy, ",") != "project,profile" ||
			!rep.Start.Equal(time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC)) || !rep.End.Equal(time.Date(2024, 6, 2, 0, 0, 0, 0, time.UTC)) {
			t.Fatalf("json: %+v", rep)
		}
		for i, w := range want {
			if rep.Usage[i] != w {
				t.Errorf("usage[%d] = %+v, want %+v", i, rep.Usage[i], w)
			}
		}
		// Only the group_by fields are present.
		if strings.Contains(r.stdout, `"instance_uuid"`) || strings.Contains(r.stdout, `"host"`) {
			t.Errorf("json has fields beyond group_by:\n%s", r.stdout)
		}
	})

	t.Run("project scope", func(t *testing.T) {
		r := e.project.must(t, 0, append(day, "-o", "csv", "--group-by", "project")...)
		if r.stdout != "project_id,vgpu_seconds,vgpu_hours\np1,21600,6.00\n" {
			t.Errorf("a p1 reader's usage: %s", r)
		}
		r = e.project.must(t, 1, append(day, "--project", "p2")...)
		if !strings.HasPrefix(r.stderr, "vgpuctl: Forbidden: a project-scoped token sees its own project's usage only\n") || r.stdout != "" {
			t.Errorf("a p1 reader asking for p2: %s", r)
		}
		e.anon.must(t, 1, day...)
	})

	t.Run("errors", func(t *testing.T) {
		r := e.reader.must(t, 2, append(day, "-o", "xml")...)
		if !strings.HasPrefix(r.stderr, `vgpuctl: output format "xml": use table, json, yaml, value, csv`) {
			t.Errorf("-o xml: %s", r)
		}
		r = e.reader.must(t, 2, "usage", "--group-by", "tenant")
		if !strings.Contains(r.stderr, `"tenant" is not one of project, user, instance, profile, vgpu_type, host, path`) {
			t.Errorf("--group-by tenant: %s", r)
		}
		// The bridge checks what vgpuctl passes on: 422 with the field.
		r = e.reader.must(t, 1, append(day, "--instance", "not-a-uuid")...)
		if !strings.HasPrefix(r.stderr, "vgpuctl: Invalid request: 1 invalid field(s)\n  instance_uuid: must be a UUID\n") {
			t.Errorf("--instance not-a-uuid: %s", r)
		}
	})
}
