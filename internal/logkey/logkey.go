// Package logkey names the attributes of the structured logs of
// vgpu-bridge, vgpu-agent and vgpuctl, once for all packages, so that one
// thing has one key everywhere (a command is always command_id, an error
// always err) and log queries work across components.
package logkey

// Keys of log attributes.
const (
	Action          = "action"
	Actor           = "actor"
	Attempt         = "attempt"
	Backoff         = "backoff"
	Batch           = "batch"
	Broker          = "broker"
	Changed         = "changed"
	Code            = "code"
	Command         = "command_id"
	Consumer        = "consumer_uuid" // a Placement consumer
	Deleted         = "deleted"
	Detail          = "detail"
	Device          = "device"
	Duration        = "duration"
	Err             = "err"
	Event           = "event_id" // an inbox row
	Full            = "full"
	GlobalRequestID = "global_request_id"
	Host            = "host" // a compute service host
	Instance        = "instance_uuid"
	Kind            = "kind"
	Mdev            = "mdev_uuid"
	MessageID       = "message_id"
	Method          = "method"
	NeedsRestart    = "needs_restart"
	Object          = "object"
	Outcome         = "outcome"
	Path            = "path"
	Principal       = "principal"
	Project         = "project_id"
	Provider        = "provider" // a Placement resource provider's uuid
	Providers       = "providers"
	Queue           = "queue"
	Reason          = "reason"
	Remote          = "remote"
	Removed         = "removed"
	RequestID       = "request_id" // a bridge request, or an HTTP request's id
	Role            = "role"
	SilentFor       = "silent_for"
	Source          = "source"
	Status          = "status"
	Step            = "step"
	Table           = "table"
	User            = "user_id"
)
