// SPDX-License-Identifier: Apache-2.0

package pipeline

import (
	"os"
	"testing"
)

// ServiceHost reads the host of a nova-compute service notification from
// the payload as Nova sends it (its sample), and nothing from the other
// events of the inbox.
func TestServiceHost(t *testing.T) {
	sample, err := os.ReadFile("../../nova/testdata/notification_samples/common_payloads/ServiceStatusPayload.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		row  InboxRow
		want string
	}{
		{"nova-compute service", InboxRow{Source: "nova", EventType: "service.update", Payload: sample}, "host2"},
		{"another binary", InboxRow{Source: "nova", EventType: "service.update",
			Payload: []byte(`{"nova_object.data": {"host": "c1", "binary": "nova-conductor"}}`)}, ""},
		{"an instance's event", InboxRow{Source: "nova", EventType: "service.update", InstanceUUID: inst, Payload: sample}, ""},
		{"a webhook", InboxRow{Source: WebhookSourcePrefix + "x", EventType: "service.update", Payload: sample}, ""},
		{"the bridge's own", InboxRow{Source: BridgeSource, EventType: EventHostDown, Payload: sample}, ""},
		{"not JSON", InboxRow{Source: "nova", EventType: "service.update", Payload: []byte(`{`)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ServiceHost(tc.row); got != tc.want {
				t.Errorf("ServiceHost = %q, want %q", got, tc.want)
			}
		})
	}
}

// A host-down event maps to its own kind whatever its payload, which
// package direct reads.
func TestMapHostDownEvent(t *testing.T) {
	ev, err := MapEvent(InboxRow{Source: BridgeSource, EventType: EventHostDown, InstanceUUID: inst,
		Payload: []byte(`{"instance_uuid":"` + inst + `","host":"c1","half":"hold","service_event_id":7}`)})
	if err != nil || ev.Kind != BridgeKindPrefix+EventHostDown || ev.InstanceUUID != inst {
		t.Fatalf("MapEvent = %+v, %v", ev, err)
	}
}
