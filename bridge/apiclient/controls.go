package apiclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls/controlswire"
)

// Controls is the answer of GET and POST /v1/controls.
type Controls struct {
	controlswire.Mode
	Changed bool            `json:"changed"`
	Raw     json.RawMessage `json:"-"`
}

// ControlsChange is the body of POST /v1/controls; nil keeps a switch.
type ControlsChange = controlswire.Change

// Controls returns the global switches.
func (c *Client) Controls(ctx context.Context) (Controls, error) {
	var out Controls
	raw, err := c.getInto(ctx, "/v1/controls", nil, &out)
	out.Raw = raw
	return out, err
}

// SetControls pauses, resumes, or switches observe-only mode (admin).
func (c *Client) SetControls(ctx context.Context, ch ControlsChange) (Controls, error) {
	var out Controls
	raw, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/controls", Body: ch}, &out)
	out.Raw = raw
	return out, err
}

// Drain is the answer of the drain routes (host or GPU fields).
type Drain struct {
	Name           string          `json:"name,omitempty"`
	ProviderUUID   string          `json:"provider_uuid,omitempty"`
	Node           string          `json:"node,omitempty"`
	PCIAddress     string          `json:"pci_address,omitempty"`
	Drained        bool            `json:"drained"`
	DrainReason    string          `json:"drain_reason,omitempty"`
	DrainedBy      string          `json:"drained_by,omitempty"`
	DrainedAt      *time.Time      `json:"drained_at,omitempty"`
	Disabled       bool            `json:"disabled"`
	ForcedDown     bool            `json:"forced_down"`
	DisabledReason string          `json:"disabled_reason,omitempty"`
	Changed        bool            `json:"changed"`
	Raw            json.RawMessage `json:"-"`
}

// DrainKind names what a drain applies to.
type DrainKind string

// Drain kinds.
const (
	DrainHost DrainKind = "hosts"
	DrainGPU  DrainKind = "gpus"
)

// SetDrain drains (drain true, with a reason) or undrains a host (by
// compute service host or node name) or a GPU (by provider UUID).
func (c *Client) SetDrain(ctx context.Context, kind DrainKind, name, reason string, drain bool) (Drain, error) {
	call := Call{Method: http.MethodPost, Path: "/v1/" + string(kind) + "/" + url.PathEscape(name) + "/drain"}
	if drain {
		call.Body = map[string]string{"reason": reason}
	} else {
		call.Method = http.MethodDelete
		if reason != "" {
			call.Query = url.Values{"reason": {reason}}
		}
	}
	var out Drain
	raw, err := c.callInto(ctx, call, &out)
	out.Raw = raw
	return out, err
}

// AuditRecord is one audit log row.
type AuditRecord = controlswire.AuditRecord

// AuditList is a page of GET /v1/audit, oldest first.
type AuditList struct {
	Records    []AuditRecord   `json:"audit"`
	NextCursor string          `json:"next_cursor,omitempty"`
	Raw        json.RawMessage `json:"-"`
}

// AuditFilter narrows GET /v1/audit.
type AuditFilter struct {
	Since  time.Time
	Actor  string
	Action string // exact, or a prefix ending with '*'
	Object string // type/id or id
	// RequestID matches the bridge request id or the OpenStack request id.
	RequestID string
	Limit     int
	Cursor    string
}

// Audit returns a page of the audit log.
func (c *Client) Audit(ctx context.Context, f AuditFilter) (AuditList, error) {
	q := url.Values{}
	if !f.Since.IsZero() {
		q.Set("since", f.Since.UTC().Format(time.RFC3339Nano))
	}
	set(q, "actor", f.Actor)
	set(q, "action", f.Action)
	set(q, "object", f.Object)
	set(q, "request_id", f.RequestID)
	setInt(q, "limit", f.Limit)
	set(q, "cursor", f.Cursor)
	var out AuditList
	raw, err := c.getInto(ctx, "/v1/audit", q, &out)
	out.Raw = raw
	return out, err
}

// BridgeOwnedClass is the resource class of bridge-owned GPU providers
// (placement.BridgeClass, which this package does not import: a test
// keeps the two equal). Profile.BridgeOwned counts those GPUs.
const BridgeOwnedClass = "CUSTOM_VGPU_BRIDGE"

// Profile is one vGPU profile of the catalog with the fleet's counts.
type Profile struct {
	Name           string `json:"name"`
	TypeID         string `json:"type_id,omitempty"`
	Trait          string `json:"trait,omitempty"`
	FramebufferMiB int    `json:"framebuffer_mib"`
	MaxInstances   int    `json:"max_instances"`
	Series         string `json:"series"`
	GPU            string `json:"gpu"`
	Source         string `json:"source"`
	GPUs           int    `json:"gpus"`
	BridgeOwned    int    `json:"bridge_owned_gpus,omitempty"`
	NovaVF         int    `json:"nova_vf_gpus,omitempty"`
	Capacity       int    `json:"capacity"`
	Used           int    `json:"used"`
	Free           int    `json:"free"`
}

// ProfileList is the answer of GET /v1/profiles.
type ProfileList struct {
	Profiles []Profile       `json:"profiles"`
	Raw      json.RawMessage `json:"-"`
}

// Profiles lists the vGPU profile catalog; series and gpu filter ("" all).
func (c *Client) Profiles(ctx context.Context, series, gpu string) (ProfileList, error) {
	q := url.Values{}
	set(q, "series", series)
	set(q, "gpu", gpu)
	var out ProfileList
	raw, err := c.getInto(ctx, "/v1/profiles", q, &out)
	out.Raw = raw
	return out, err
}

// ReplayResult is the answer of POST /v1/dead-letters/{id}/replay.
type ReplayResult struct {
	controlswire.ReplayAnswer
	Raw json.RawMessage `json:"-"`
}

// ReplayDeadLetter runs a dead letter's body through ingest again (admin).
func (c *Client) ReplayDeadLetter(ctx context.Context, id int64) (ReplayResult, error) {
	var out ReplayResult
	raw, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/dead-letters/" + strconv.FormatInt(id, 10) + "/replay"}, &out)
	out.Raw = raw
	return out, err
}
