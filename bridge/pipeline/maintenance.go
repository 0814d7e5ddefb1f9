// SPDX-License-Identifier: Apache-2.0

package pipeline

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
)

// Host maintenance (bridge/maintenance) moves a direct-path VM off a host
// in halves the pipeline makes, as it makes those of a Nova move
// (package direct, move.go): before the move, a detach (detach and remove the VM's
// direct-path vGPUs through the agent, their claims given back); after
// it, an attach of the same profiles on the instance's new host, whose
// claim is the maintenance reservation moved into the instance's
// consumer (DirectPath.Claim adopts it). The executor writes a bridge event of type
// EventMaintenance into the inbox and waits on the request it names.

// EventMaintenance is the type of the executor's events.
const EventMaintenance = "maintenance"

// Maintenance halves (MaintenanceEvent.Half).
const (
	MaintenanceDetach = "detach"
	MaintenanceAttach = "attach"
)

// MaintenanceVGPU is one vGPU to attach again after the move.
type MaintenanceVGPU struct {
	Profile string `json:"profile"`
	TypeID  string `json:"type_id"`
	Trait   string `json:"trait"`
	Amount  int    `json:"amount"`
}

// MaintenanceEvent is the payload of an EventMaintenance event.
type MaintenanceEvent struct {
	Request  uuid.UUID         `json:"request_id"`
	Instance string            `json:"instance_uuid"`
	Half     string            `json:"change"` // detach, attach
	VGPUs    []MaintenanceVGPU `json:"vgpus,omitempty"`
	// Host and Node are where Nova says the instance is (attach), read by
	// the maintenance runner once the move's last notification was
	// processed: the attach goes ahead only where the bridge's own record
	// (from the notifications) agrees.
	Host string `json:"host,omitempty"`
	Node string `json:"node,omitempty"`
}

// RecordMaintenance writes the executor's event into the inbox (once per
// request id); the processor makes its request.
func RecordMaintenance(ctx context.Context, q requests.Execer, e MaintenanceEvent) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if err := requests.QueueEvent(ctx, q, requests.Event{Source: BridgeSource, MessageID: EventMaintenance + ":" + e.Request.String(),
		Type: EventMaintenance, Instance: e.Instance, Payload: b}); err != nil {
		return fmt.Errorf("maintenance %s of %s: record the event: %w", e.Half, e.Instance, err)
	}
	return nil
}
