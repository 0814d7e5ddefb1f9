// SPDX-License-Identifier: Apache-2.0

package pipeline

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
)

// Evacuation of a VM with a direct-path vGPU. Nova 26's evacuation claims
// the destination under the instance's own consumer, keeping the source's
// allocation in it, and hands the destination's spawn the whole
// allocation: the libvirt driver refuses a VGPU on another host's GPU and
// the evacuation fails. An evacuation needs the source's compute service
// forced down first; so, when Nova says a nova-compute service is forced
// down (service.update), the bridge writes one EventHostDown event per
// instance of the host with direct-path vGPUs (HalfHold): package direct
// takes their claims out of the consumer (the agent of a dead host cannot
// act: the mdev stays) and marks them held (flow.AttHeld). An evacuation
// (instance.rebuild.end on another host) applies them again there (a
// Nova move, package direct's move.go). When the service is up again
// (HalfRestore), a held vGPU whose instance stayed is claimed again on
// the same GPU and attached; one applied elsewhere has its mdev removed
// from the host.

// EventHostDown is the type of the per-instance events written for a
// forced-down (or again up) compute service.
const EventHostDown = "host_down"

// Halves of an EventHostDown event (HostDownEvent.Half).
const (
	HalfHold    = "hold"    // the host is forced down: take the claims out of the consumer
	HalfRestore = "restore" // the host is up again: claim again, or remove the mdev left
)

// HostDownEvent is the payload of an EventHostDown event.
type HostDownEvent struct {
	Instance string `json:"instance_uuid"`
	Host     string `json:"host"`
	Half     string `json:"half"`
	// ServiceEvent is the inbox id of Nova's service.update it follows.
	ServiceEvent int64 `json:"service_event_id"`
}

// RecordHostDown writes e into the inbox (once per service event and
// instance).
func RecordHostDown(ctx context.Context, q requests.Execer, e HostDownEvent) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if err := requests.QueueEvent(ctx, q, requests.Event{Source: BridgeSource,
		MessageID: fmt.Sprintf("%s:%d:%s", EventHostDown, e.ServiceEvent, e.Instance),
		Type:      EventHostDown, Instance: e.Instance, Payload: b}); err != nil {
		return fmt.Errorf("host %s %s of %s: record the event: %w", e.Host, e.Half, e.Instance, err)
	}
	return nil
}

// ServiceHost is the host of a nova-compute service notification
// (service.update …) in the inbox; "" for another binary or a payload
// that names none.
func ServiceHost(r InboxRow) string {
	if r.Webhook() || r.Source == BridgeSource || r.InstanceUUID != "" {
		return ""
	}
	var p struct {
		Data struct {
			Host   string `json:"host"`
			Binary string `json:"binary"`
		} `json:"nova_object.data"`
	}
	if json.Unmarshal(r.Payload, &p) != nil || p.Data.Binary != "nova-compute" {
		return ""
	}
	return p.Data.Host
}
