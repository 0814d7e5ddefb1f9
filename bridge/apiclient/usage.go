package apiclient

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/usage/usagewire"
)

// UsageGroups are the group_by names of GET /v1/usage, in the order the
// bridge answers them.
var UsageGroups = usagewire.Groups

// UsageRow is one group's usage; only the group_by fields are set.
type UsageRow = usagewire.Row

// UsageReport is the answer of GET /v1/usage.
type UsageReport struct {
	usagewire.Report
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
