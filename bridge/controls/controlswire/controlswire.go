// Package controlswire holds the JSON shapes of the controls routes
// (/v1/controls, /v1/audit, dead-letter replay): the server answers them and
// vgpuctl's client reads them. It imports nothing of the server.
package controlswire

import (
	"encoding/json"
	"time"
)

// Mode is the global switches.
type Mode struct {
	Paused       bool       `json:"paused"`
	ObserveOnly  bool       `json:"observe_only"`
	Reason       string     `json:"reason,omitempty"`
	Actor        string     `json:"actor,omitempty"`
	RequestID    string     `json:"request_id,omitempty"`
	PausedAt     *time.Time `json:"paused_at,omitempty"`
	ObserveSince *time.Time `json:"observe_since,omitempty"`
	UpdatedAt    time.Time  `json:"updated_at"`
}

// Holds reports whether the outbox is held (paused or observe-only).
func (m Mode) Holds() bool { return m.Paused || m.ObserveOnly }

// Change is a request to change the mode (the body of POST /v1/controls);
// nil fields keep their value.
type Change struct {
	Paused      *bool  `json:"paused,omitempty"`
	ObserveOnly *bool  `json:"observe_only,omitempty"`
	Reason      string `json:"reason"`
}

// AuditRecord is one audit_log row as the API answers it.
type AuditRecord struct {
	ID              int64           `json:"id"`
	At              time.Time       `json:"at"`
	Actor           string          `json:"actor"`
	Action          string          `json:"action"`
	ObjectType      string          `json:"object_type"`
	ObjectID        string          `json:"object_id"`
	RequestID       *string         `json:"request_id"`
	GlobalRequestID *string         `json:"global_request_id"`
	Detail          json.RawMessage `json:"detail"`
}

// ReplayAnswer is the answer of POST /v1/dead-letters/{id}/replay.
type ReplayAnswer struct {
	DeadLetterID int64 `json:"dead_letter_id"`
	// Outcome: accepted (a new inbox event), duplicate (the inbox held the
	// message id already: nothing new).
	Outcome   string `json:"outcome"`
	EventID   int64  `json:"event_id,omitempty"`
	MessageID string `json:"message_id,omitempty"`
	EventType string `json:"event_type,omitempty"`
}
