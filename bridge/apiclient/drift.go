package apiclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/drift/driftwire"
)

// DriftFinding is a difference the drift reconciler found between
// Placement, the hosts' reports and the bridge's records.
type DriftFinding = driftwire.Record

// DriftRun sums up one run of the reconciler.
type DriftRun struct {
	driftwire.RunResult
	Raw json.RawMessage `json:"-"`
}

// DriftList is the answer of GET /v1/drift.
type DriftList struct {
	Findings []DriftFinding `json:"findings"`
	LastRun  *DriftRun      `json:"last_run"`
	Repair   bool           `json:"repair"`
	Interval string         `json:"interval"`

	Raw json.RawMessage `json:"-"`
}

// DriftFilter narrows GET /v1/drift.
type DriftFilter struct {
	State string // open (default), resolved, all
	Kind  string
	Host  string
	Limit int
}

// Drift lists the drift reconciler's findings.
func (c *Client) Drift(ctx context.Context, f DriftFilter) (DriftList, error) {
	q := url.Values{}
	set(q, "state", f.State)
	set(q, "kind", f.Kind)
	set(q, "host", f.Host)
	setInt(q, "limit", f.Limit)
	var out DriftList
	raw, err := c.getInto(ctx, "/v1/drift", q, &out)
	out.Raw = raw
	return out, err
}

// DriftRunNow runs the reconciler at once (admin); 409 while another
// replica runs it.
func (c *Client) DriftRunNow(ctx context.Context) (DriftRun, error) {
	var out DriftRun
	raw, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/drift/run"}, &out)
	out.Raw = raw
	return out, err
}
