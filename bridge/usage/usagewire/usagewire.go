// Package usagewire holds the JSON shapes of GET /v1/usage: the server
// answers them and vgpuctl's client reads them. It imports nothing of the
// server.
package usagewire

import "time"

// Groups are the group_by names of GET /v1/usage, in the order the bridge
// answers them.
var Groups = []string{"project", "user", "instance", "profile", "vgpu_type", "host", "path"}

// Row is one group's usage; only the group_by fields are set.
type Row struct {
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

// field returns the row's field of group_by name g (nil when unknown).
func (r *Row) field(g string) *string {
	switch g {
	case "project":
		return &r.ProjectID
	case "user":
		return &r.UserID
	case "instance":
		return &r.InstanceUUID
	case "profile":
		return &r.Profile
	case "vgpu_type":
		return &r.VGPUType
	case "host":
		return &r.Host
	case "path":
		return &r.Path
	}
	return nil
}

// Group returns the row's value of group_by name g ("" when absent).
func (r Row) Group(g string) string {
	if f := r.field(g); f != nil {
		return *f
	}
	return ""
}

// SetGroup sets the row's value of group_by name g; unknown names are
// ignored.
func (r *Row) SetGroup(g, v string) {
	if f := r.field(g); f != nil {
		*f = v
	}
}

// Report is GET /v1/usage's answer.
type Report struct {
	Start       time.Time `json:"start"`
	End         time.Time `json:"end"`
	AuditPeriod string    `json:"audit_period"`
	// ClosedThrough is the end of the last closed audit period (nil: none
	// closed yet); usage after it may still change as late events arrive.
	ClosedThrough *time.Time `json:"closed_through"`
	GroupBy       []string   `json:"group_by"`
	Usage         []Row      `json:"usage"`
	Total         int64      `json:"total_vgpu_seconds"`
}
