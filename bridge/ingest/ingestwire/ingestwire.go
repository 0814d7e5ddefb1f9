// Package ingestwire holds the JSON shapes of the inbox routes
// (/v1/instances, /v1/events, /v1/dead-letters): the server answers them
// and vgpuctl's client reads them. It imports nothing of the server.
package ingestwire

import (
	"encoding/json"
	"time"
)

// Instance is an instance as the API answers it.
type Instance struct {
	UUID             string          `json:"uuid"`
	ProjectID        *string         `json:"project_id"`
	UserID           *string         `json:"user_id"`
	Host             *string         `json:"host"`
	Node             *string         `json:"node"`
	DisplayName      *string         `json:"display_name"`
	AvailabilityZone *string         `json:"availability_zone"`
	VMState          *string         `json:"vm_state"`
	TaskState        *string         `json:"task_state"`
	PowerState       *string         `json:"power_state"`
	Flavor           json.RawMessage `json:"flavor"`
	NewFlavor        json.RawMessage `json:"new_flavor"`
	VGPUDemand       json.RawMessage `json:"vgpu_demand"`
	VGPUs            int             `json:"vgpus"`
	HasVGPU          bool            `json:"has_vgpu"`
	Fault            json.RawMessage `json:"fault"`
	LastEventType    *string         `json:"last_event_type"`
	LastEventAt      *time.Time      `json:"last_event_at"`
	DeletedAt        *time.Time      `json:"deleted_at"`
	CreatedAt        time.Time       `json:"created_at"`
	UpdatedAt        time.Time       `json:"updated_at"`
}

// EventRecord is an inbox row as the API answers it.
type EventRecord struct {
	ID              int64           `json:"id"`
	Source          string          `json:"source"`
	MessageID       string          `json:"message_id"`
	EventType       string          `json:"event_type"`
	InstanceUUID    *string         `json:"instance_uuid"`
	PublisherID     *string         `json:"publisher_id"`
	Priority        *string         `json:"priority"`
	RequestID       *string         `json:"request_id"`
	GlobalRequestID *string         `json:"global_request_id"`
	OccurredAt      *time.Time      `json:"occurred_at"`
	ReceivedAt      time.Time       `json:"received_at"`
	ProcessedAt     *time.Time      `json:"processed_at"`
	Status          *string         `json:"status"`
	Detail          *string         `json:"detail"`
	Payload         json.RawMessage `json:"payload,omitempty"`
}

// DeadLetter is a dead letter as the API answers it. Raw is the (capped)
// body as text, or base64 when it is not UTF-8 (RawEncoding "base64").
type DeadLetter struct {
	ID           int64           `json:"id"`
	Source       string          `json:"source"`
	Reason       string          `json:"reason"`
	Detail       *string         `json:"detail"`
	MessageID    *string         `json:"message_id"`
	Raw          string          `json:"raw"`
	RawEncoding  string          `json:"raw_encoding"`
	RawTruncated bool            `json:"raw_truncated"`
	Headers      json.RawMessage `json:"headers"`
	ReceivedAt   time.Time       `json:"received_at"`
}
