package apiclient

import (
	"context"
	"encoding/json"
	"net/url"
)

// Quota is the answer of GET /v1/quota: a project's vGPU limits and usage
// as the bridge sees them.
type Quota struct {
	ProjectID      string          `json:"project_id"`
	Driver         string          `json:"driver"`
	VGPUs          int             `json:"vgpus"`
	FramebufferMiB int             `json:"framebuffer_mib"`
	Policy         PolicyQuota     `json:"policy"`
	Limits         []QuotaLimit    `json:"limits"`
	Raw            json.RawMessage `json:"-"`
}

// PolicyQuota is the policy file's quota of the project (0: unlimited).
type PolicyQuota struct {
	MaxVGPUs          int      `json:"max_vgpus"`
	MaxFramebufferGiB int      `json:"max_framebuffer_gib"`
	MaxVGPUsPerVM     int      `json:"max_vgpus_per_vm"`
	AllowedProfiles   []string `json:"allowed_profiles"`
}

// QuotaLimit is one of Keystone's unified limits with its usage.
type QuotaLimit struct {
	Resource string `json:"resource"`
	Profile  string `json:"profile,omitempty"`
	Limit    int    `json:"limit"`
	Usage    int    `json:"usage"`
	Origin   string `json:"origin"`
}

// Quota reads project's limits and usage; project "" is the caller's own
// (a project-scoped token).
func (c *Client) Quota(ctx context.Context, project string) (Quota, error) {
	q := url.Values{}
	set(q, "project", project)
	var out Quota
	raw, err := c.getInto(ctx, "/v1/quota", q, &out)
	out.Raw = raw
	return out, err
}
