// Package notify sends the bridge's own notifications, in
// oslo.messaging's versioned format, so that billing (CloudKitty) and any
// other consumer of OpenStack notifications can see what the bridge did.
//
// A change queues its notification (Queue) in the transaction that
// commits the change; a rolled-back change leaves nothing to send. The
// Relay publishes what committed, in order, from one replica at a time,
// with publisher confirms, and marks it sent. A crash between the
// broker's confirm and that mark sends the message again on restart with
// the same message_id and _unique_id (oslo.messaging listeners drop such
// duplicates): delivery is at least once.
package notify

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/failpoint"
)

// Namespace is the versioned objects' namespace.
const Namespace = "vgpu_bridge"

// Priority is a notification's priority; its lower case ends the routing
// key (versioned_notifications.info).
type Priority string

// Priorities the bridge sends.
const (
	Info  Priority = "INFO"
	Error Priority = "ERROR"
)

// Event types.
const (
	AttachStart  = "vgpu.attach.start"
	AttachEnd    = "vgpu.attach.end"
	DetachStart  = "vgpu.detach.start"
	DetachEnd    = "vgpu.detach.end"
	ResizeStart  = "vgpu.resize.start"
	ResizeEnd    = "vgpu.resize.end"
	RequestError = "vgpu.request.error"
	// PolicyNotify is a rule's notify(message): the bridge tells the
	// instance's tenant (and whoever listens) what a rule decided.
	PolicyNotify = "vgpu.policy.notify"
	Exists       = "vgpu.exists"
	// GPUFault: an agent reported a GPU fault and the bridge marked the
	// GPU (priority ERROR; payload GPUFaultPayload).
	GPUFault = "vgpu.gpu.fault"
)

// Object is a payload as oslo.versionedobjects serialises one:
// {"versioned_object.name": …, "versioned_object.namespace": "vgpu_bridge",
// "versioned_object.version": …, "versioned_object.data": {…}}.
type Object struct {
	Name    string
	Version string
	Data    any
}

// MarshalJSON writes o in oslo.versionedobjects' form.
func (o Object) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{
		"versioned_object.name":      o.Name,
		"versioned_object.namespace": Namespace,
		"versioned_object.version":   o.Version,
		"versioned_object.data":      o.Data,
	})
}

// Execer is a transaction (or the pool, for a notification of its own).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Channel is the Postgres NOTIFY channel a commit that queued
// notifications signals, so the relay sends at once.
const Channel = "vgpu_bridge_notifications"

// FailQueued followed by an event type ("notify.queued:vgpu.attach.start")
// is the failpoint (internal/failpoint) Queue hits once it has put that
// notification in the outbox and before the caller commits: a crash test
// kills the bridge there, and the notification must never be sent.
const FailQueued = "notify.queued:"

// Queue puts a notification in the outbox in q's transaction; the relay
// sends it once the transaction commits.
func Queue(ctx context.Context, q Execer, eventType string, prio Priority, payload Object) error {
	b, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("notification %s: %w", eventType, err)
	}
	if _, err := q.Exec(ctx, `WITH n AS (INSERT INTO bridge_notifications (event_type, priority, payload) VALUES ($1, $2, $3) RETURNING id)
		SELECT pg_notify('`+Channel+`', '') FROM n`, eventType, string(prio), b); err != nil {
		return fmt.Errorf("queue notification %s: %w", eventType, err)
	}
	failpoint.Hit(FailQueued + eventType)
	return nil
}

// QueueCTE is Queue as a CTE of another package's statement, one that
// makes the change the notification reports: name AS (an insert of one
// notification for each row of from). event, prio and payload are the
// statement's parameters ($n) of the event type, the priority and the
// JSON payload (json.Marshal of an Object). The statement selects
// Pinged(name) to send the NOTIFY, and the caller calls Queued after it.
func QueueCTE(name, from, event, prio, payload string) string {
	return name + ` AS (INSERT INTO bridge_notifications (event_type, priority, payload)
		SELECT ` + event + `::text, ` + prio + `::text, ` + payload + `::jsonb FROM ` + from + ` RETURNING id)`
}

// Pinged is the expression, of a statement with QueueCTE(name, ...),
// that sends the NOTIFY Queue sends for the notifications it queued.
func Pinged(name string) string {
	return `(SELECT count(pg_notify('` + Channel + `', '')) FROM ` + name + `)`
}

// Queued marks that a statement with QueueCTE queued a notification of
// eventType (the failpoint Queue hits).
func Queued(eventType string) {
	failpoint.Hit(FailQueued + eventType)
}

// VGPU is one vGPU in a payload.
type VGPU struct {
	AttachmentID  string `json:"attachment_id,omitempty"` // the mdev UUID, direct path
	Profile       string `json:"profile"`
	VGPUType      string `json:"vgpu_type,omitempty"`
	ResourceClass string `json:"resource_class"`
	Amount        int    `json:"amount"`
	Host          string `json:"host,omitempty"`
	ProviderUUID  string `json:"provider_uuid,omitempty"`
	PCIAddress    string `json:"pci_address,omitempty"`
	State         string `json:"state,omitempty"`
}

// ActionPayload is the payload of vgpu.attach.*, vgpu.detach.*,
// vgpu.resize.* and vgpu.request.error (versioned object
// VGPUActionPayload 1.0): a request of the bridge's and the vGPUs it
// gives the instance (VGPUs) and takes back (OldVGPUs).
type ActionPayload struct {
	RequestID    string `json:"request_id"`
	RequestKind  string `json:"request_kind"`
	Source       string `json:"source"`
	InstanceUUID string `json:"instance_uuid,omitempty"`
	ProjectID    string `json:"project_id,omitempty"`
	UserID       string `json:"user_id,omitempty"`
	Path         string `json:"path,omitempty"` // direct (hot-plug through the agent) or nova (a resize to a flavor)
	State        string `json:"state"`          // the request's state
	Code         string `json:"code,omitempty"`
	Reason       string `json:"reason,omitempty"`
	Flavor       string `json:"flavor,omitempty"`     // nova path: the flavor resized to
	OldFlavor    string `json:"old_flavor,omitempty"` // nova path: the flavor before
	VGPUs        []VGPU `json:"vgpus"`
	OldVGPUs     []VGPU `json:"old_vgpus"`
}

// ActionPayloadVersion is ActionPayload's version; a new field raises
// the minor, a change of meaning the major.
const ActionPayloadVersion = "1.0"

// Action returns p as its versioned object.
func Action(p ActionPayload) Object {
	if p.VGPUs == nil {
		p.VGPUs = []VGPU{}
	}
	if p.OldVGPUs == nil {
		p.OldVGPUs = []VGPU{}
	}
	return Object{Name: "VGPUActionPayload", Version: ActionPayloadVersion, Data: p}
}

// ExistsPayload is the payload of vgpu.exists (versioned object
// VGPUExistsPayload 1.0): one vGPU's usage within a closed audit period.
type ExistsPayload struct {
	InstanceUUID  string `json:"instance_uuid"`
	ProjectID     string `json:"project_id,omitempty"`
	UserID        string `json:"user_id,omitempty"`
	Path          string `json:"path"` // direct or flavor
	AttachmentID  string `json:"attachment_id,omitempty"`
	Flavor        string `json:"flavor,omitempty"`
	Host          string `json:"host,omitempty"`
	Profile       string `json:"profile"`
	VGPUType      string `json:"vgpu_type,omitempty"`
	ResourceClass string `json:"resource_class"`
	Amount        int    `json:"amount"`
	// Seconds the vGPU was held within the period; VGPUSeconds is
	// Seconds × Amount.
	Seconds     int64  `json:"seconds"`
	VGPUSeconds int64  `json:"vgpu_seconds"`
	AuditPeriod Object `json:"audit_period"`
}

// ExistsPayloadVersion is ExistsPayload's version.
const ExistsPayloadVersion = "1.0"

// AuditPeriod is Nova's AuditPeriodPayload: the period's bounds, UTC,
// RFC 3339.
func AuditPeriod(begin, end string) Object {
	return Object{Name: "AuditPeriodPayload", Version: "1.0",
		Data: map[string]string{"audit_period_beginning": begin, "audit_period_ending": end}}
}

// ExistsObject returns p as its versioned object.
func ExistsObject(p ExistsPayload) Object {
	return Object{Name: "VGPUExistsPayload", Version: ExistsPayloadVersion, Data: p}
}

// NotifyPayload is the payload of vgpu.policy.notify (versioned object
// VGPUNotifyPayload 1.0): a rule's notify(message), with the request and
// the instance it is about.
type NotifyPayload struct {
	RequestID    string `json:"request_id"`
	RequestKind  string `json:"request_kind"`
	Source       string `json:"source"`
	InstanceUUID string `json:"instance_uuid,omitempty"`
	ProjectID    string `json:"project_id,omitempty"`
	UserID       string `json:"user_id,omitempty"`
	Rule         string `json:"rule"`
	Message      string `json:"message"`
	Why          string `json:"why,omitempty"` // the rule's explanation: what made it fire
}

// NotifyPayloadVersion is NotifyPayload's version.
const NotifyPayloadVersion = "1.0"

// NotifyObject returns p as its versioned object.
func NotifyObject(p NotifyPayload) Object {
	return Object{Name: "VGPUNotifyPayload", Version: NotifyPayloadVersion, Data: p}
}

// GPUFaultPayload is the payload of vgpu.gpu.fault (versioned object
// VGPUGPUFaultPayload 1.0): a GPU its agent reported faulted, now drained
// and carrying the fault trait, and the instances whose vGPUs run on it.
type GPUFaultPayload struct {
	ProviderUUID string `json:"provider_uuid"`
	Host         string `json:"host"`
	Node         string `json:"node,omitempty"`
	PCIAddress   string `json:"pci_address"`
	// Source: xid, ecc, row_remap, retired_pages or gpu_lost; Xid when xid.
	Source string `json:"source"`
	Xid    uint64 `json:"xid,omitempty"`
	Reason string `json:"reason"`
	// Trait is the Placement trait the GPU's provider gets.
	Trait string `json:"trait"`
	// Instances run a vGPU on the GPU (the agent's report).
	Instances []string `json:"instances"`
}

// GPUFaultPayloadVersion is GPUFaultPayload's version.
const GPUFaultPayloadVersion = "1.0"

// GPUFaultObject returns p as its versioned object.
func GPUFaultObject(p GPUFaultPayload) Object {
	if p.Instances == nil {
		p.Instances = []string{}
	}
	return Object{Name: "VGPUGPUFaultPayload", Version: GPUFaultPayloadVersion, Data: p}
}

// Item is one notification for QueueAll.
type Item struct {
	EventType string
	Priority  Priority
	Payload   Object
}

// QueueAll puts items in the outbox in one statement of q's transaction.
func QueueAll(ctx context.Context, q Execer, items []Item) error {
	if len(items) == 0 {
		return nil
	}
	p, err := QueueAllPart(items)
	if err != nil {
		return err
	}
	if _, err := q.Exec(ctx, `WITH n AS (`+p.SQL+`)
		SELECT pg_notify('`+Channel+`', '') FROM n LIMIT 1`, p.Args...); err != nil {
		return fmt.Errorf("queue %d notifications: %w", len(items), err)
	}
	return nil
}

// QueueAllPart is QueueAll's insert as a part of a statement
// (store.With): it returns the ids of the notifications, and the
// statement signals Channel when it returned any (pg_notify). The
// caller hits the failpoints of Queue (FailQueued) once it ran.
func QueueAllPart(items []Item) (store.Part, error) {
	types := make([]string, len(items))
	prios := make([]string, len(items))
	payloads := make([]string, len(items))
	for i, it := range items {
		b, err := json.Marshal(it.Payload)
		if err != nil {
			return store.Part{}, fmt.Errorf("notification %s: %w", it.EventType, err)
		}
		types[i], prios[i], payloads[i] = it.EventType, string(it.Priority), string(b)
	}
	return store.Part{SQL: `INSERT INTO bridge_notifications (event_type, priority, payload)
			SELECT t, p, b::jsonb FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS x(t, p, b, o) ORDER BY o
			RETURNING id`, Args: []any{types, prios, payloads}}, nil
}
