package notify

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
)

// The body is what oslo.messaging's messagingv2 driver sends: an envelope
// whose oslo.message is a JSON string holding the message.
func TestEnvelope(t *testing.T) {
	id := uuid.MustParse("6f9b4a5e-2c1d-4e8f-9a0b-1c2d3e4f5a6b")
	at := time.Date(2026, 12, 5, 13, 0, 1, 0, time.FixedZone("CET", 3600))
	payload, err := json.Marshal(Action(ActionPayload{RequestID: "r1", RequestKind: "GPU_REQUEST", Source: "webhook:batch", State: "decided",
		VGPUs: []VGPU{{Profile: "T4-4Q", ResourceClass: "VGPU", Amount: 1}}}))
	if err != nil {
		t.Fatal(err)
	}
	body, err := Envelope(id, "vgpu-bridge:ctl1", AttachStart, string(Info), payload, at)
	if err != nil {
		t.Fatal(err)
	}
	var env map[string]string
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatal(err)
	}
	if env["oslo.version"] != "2.0" || len(env) != 2 {
		t.Fatalf("envelope = %v", env)
	}
	var msg map[string]any
	if err := json.Unmarshal([]byte(env["oslo.message"]), &msg); err != nil {
		t.Fatalf("oslo.message is not a JSON string of the message: %v", err)
	}
	want := map[string]any{
		"message_id":   id.String(),
		"publisher_id": "vgpu-bridge:ctl1",
		"event_type":   "vgpu.attach.start",
		"priority":     "INFO",
		"timestamp":    "2026-12-05 12:00:01.000000", // UTC, as oslo's str(utcnow())
		"_unique_id":   "6f9b4a5e2c1d4e8f9a0b1c2d3e4f5a6b",
	}
	for k, v := range want {
		if msg[k] != v {
			t.Errorf("%s = %v, want %v", k, msg[k], v)
		}
	}
	p := msg["payload"].(map[string]any)
	if p["versioned_object.name"] != "VGPUActionPayload" || p["versioned_object.namespace"] != "vgpu_bridge" ||
		p["versioned_object.version"] != "1.0" {
		t.Errorf("payload object = %v", p)
	}
	data := p["versioned_object.data"].(map[string]any)
	if data["request_id"] != "r1" || len(data["old_vgpus"].([]any)) != 0 || len(data["vgpus"].([]any)) != 1 {
		t.Errorf("payload data = %v", data)
	}
}

func TestRoutingKey(t *testing.T) {
	if got := RoutingKey("versioned_notifications", Error); got != "versioned_notifications.error" {
		t.Errorf("RoutingKey = %q", got)
	}
}
