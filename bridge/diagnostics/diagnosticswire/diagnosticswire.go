// Package diagnosticswire holds the JSON shape of a diagnostics request
// (POST /v1/hosts/{name}/diagnostics, GET /v1/diagnostics/{id}): the server
// answers it and vgpuctl's client reads it. It imports nothing of the server.
package diagnosticswire

import (
	"encoding/json"
	"time"
)

// Diagnostics is one record, without its bundle.
type Diagnostics struct {
	ID          string          `json:"id"`
	Host        string          `json:"host"`
	Instance    string          `json:"instance,omitempty"`
	RequestedBy string          `json:"requested_by"`
	RequestedAt time.Time       `json:"requested_at"`
	ExpiresAt   time.Time       `json:"expires_at"`
	CompletedAt *time.Time      `json:"completed_at,omitempty"`
	Status      string          `json:"status"` // pending | complete | failed
	Error       string          `json:"error,omitempty"`
	Size        int64           `json:"size,omitempty"`
	SHA256      string          `json:"sha256,omitempty"`
	Manifest    json.RawMessage `json:"manifest,omitempty"`
	CommandID   string          `json:"command_id"`
	BundleHref  string          `json:"bundle_href,omitempty"`
}
