package apiclient

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"time"
)

// UsageGroups are the group_by names of GET /v1/usage, in the order the
// bridge answers them.
var UsageGroups = []string{"project", "user", "instance", "profile", "vgpu_type", "host", "path"}

// UsageRow is one group's usage; only the group_by fields are set.
type UsageRow struct {
	ProjectID    string `json:"project_id,omitempty"`
	UserID       string `json:"user_id,omitempty"`
	InstanceUUID string `json:"instance_uuid,omitempty"`
	Profile      string `json:"profile,omitempty"`
	VGPUType     string `json:"vgpu_type,omitempty"`
	Host         string `json:"host,omitempty"`
	Path         string `json:"path,omitempty"`
	// VGPUSeconds is the seconds held times the vGPUs, rounded to the second.
	VGPUSeconds int64 `json:"vgpu_seconds"`
}

// Group returns the row's value of group_by name g ("" when absent).
func (r UsageRow) Group(g string) string {
	switch g {
	case "project":
		return r.ProjectID
	case "user":
		return r.UserID
	case "instance":
		return r.InstanceUUID
	case "profile":
		return r.Profile
	case "vgpu_type":
		return r.VGPUType
	case "host":
		return r.Host
	case "path":
		return r.Path
	}
	return ""
}

// UsageReport is the answer of GET /v1/usage.
type UsageReport struct {
	Start       time.Time `json:"start"`
	End         time.Time `json:"end"`
	AuditPeriod string    `json:"audit_period"`
	// ClosedThrough is the end of the last closed audit period; nil when
	// none is closed yet.
	ClosedThrough *time.Time `json:"closed_through"`
	GroupBy       []string   `json:"group_by"`
	Usage         []UsageRow `json:"usage"`
	Total         int64      `json:"total_vgpu_seconds"`

	Raw json.RawMessage `json:"-"`
}

// UsageFilter narrows GET /v1/usage. Zero times leave the bridge's
// defaults: the start of the current audit period, and now.
type UsageFilter struct {
	Start, End   time.Time
	Project      string
	Profile      string
	InstanceUUID string
	// GroupBy names the groups (UsageGroups); empty: the bridge's default
	// (project, instance, profile).
	GroupBy []string
}

// Usage adds up the vGPU usage of the period, per group.
func (c *Client) Usage(ctx context.Context, f UsageFilter) (UsageReport, error) {
	q := url.Values{}
	if !f.Start.IsZero() {
		q.Set("start", f.Start.UTC().Format(time.RFC3339Nano))
	}
	if !f.End.IsZero() {
		q.Set("end", f.End.UTC().Format(time.RFC3339Nano))
	}
	set(q, "project", f.Project)
	set(q, "profile", f.Profile)
	set(q, "instance_uuid", f.InstanceUUID)
	set(q, "group_by", strings.Join(f.GroupBy, ","))
	var out UsageReport
	raw, err := c.getInto(ctx, "/v1/usage", q, &out)
	out.Raw = raw
	return out, err
}
