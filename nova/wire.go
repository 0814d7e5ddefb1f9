package nova

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// WireMessage turns a notification as Nova's samples show it
// ({"event_type", "payload", "priority", "publisher_id"}, $ref already
// resolved) into what oslo.messaging's messagingv2 driver puts on the wire:
// message_id and timestamp added (notifier.py), _unique_id and the request
// context flattened into _context_* keys (amqpdriver.py), all JSON-encoded as a
// string inside {"oslo.version": "2.0", "oslo.message": …}.
//
// It is used by tests, the benchmark and the demo to publish real-shaped
// messages; the context values are plausible, derived from id.
func WireMessage(sample []byte, id string, ts time.Time) ([]byte, error) {
	var msg map[string]any
	if err := json.Unmarshal(sample, &msg); err != nil {
		return nil, fmt.Errorf("sample: %w", err)
	}
	if msg == nil {
		return nil, fmt.Errorf("sample: not a JSON object")
	}
	sum := sha256.Sum256([]byte(id))
	h := hex.EncodeToString(sum[:])
	req := "req-" + h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
	msg["message_id"] = id
	msg["timestamp"] = FormatTimestamp(ts)
	msg["_unique_id"] = h[32:64]
	for k, v := range map[string]any{
		"user":                  "fake",
		"user_id":               "fake",
		"user_name":             "admin",
		"tenant":                "6f70656e737461636b20342065766572",
		"project":               "6f70656e737461636b20342065766572",
		"project_id":            "6f70656e737461636b20342065766572",
		"project_name":          "admin",
		"system_scope":          nil,
		"domain":                nil,
		"user_domain":           "default",
		"project_domain":        "default",
		"is_admin":              true,
		"is_admin_project":      true,
		"read_only":             false,
		"show_deleted":          false,
		"read_deleted":          "no",
		"auth_token":            "***",
		"request_id":            req,
		"global_request_id":     nil,
		"resource_uuid":         nil,
		"roles":                 []string{"admin", "member", "reader"},
		"user_identity":         "fake 6f70656e737461636b20342065766572 - default default",
		"remote_address":        "127.0.0.1",
		"timestamp":             ts.UTC().Format("2006-01-02T15:04:05.000000"),
		"quota_class":           nil,
		"service_catalog":       []any{},
		"instance_lock_checked": false,
	} {
		msg["_context_"+k] = v
	}
	inner, err := json.Marshal(msg)
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]string{"oslo.version": EnvelopeVersion, "oslo.message": string(inner)})
}
