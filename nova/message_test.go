package nova_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
)

func TestParseTimestamp(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Time
	}{
		{"2024-05-01 12:00:00.123456", time.Date(2024, 5, 1, 12, 0, 0, 123456000, time.UTC)},
		{"2024-05-01 12:00:00", time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)}, // microseconds 0: no fraction
		{"2024-05-01 12:00:00.000001", time.Date(2024, 5, 1, 12, 0, 0, 1000, time.UTC)},
		{"2024-05-01T12:00:00.5", time.Date(2024, 5, 1, 12, 0, 0, 500000000, time.UTC)},
		{"2024-05-01T14:00:00+02:00", time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)},
		{"2012-10-29T13:42:11Z", time.Date(2012, 10, 29, 13, 42, 11, 0, time.UTC)},
	} {
		got, err := nova.ParseTimestamp(tc.in)
		if err != nil || !got.Equal(tc.want) || got.Location() != time.UTC {
			t.Errorf("ParseTimestamp(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "yesterday", "2024-05-01", "2024-13-01 00:00:00", "1714564800"} {
		if _, err := nova.ParseTimestamp(bad); err == nil {
			t.Errorf("ParseTimestamp(%q): want error", bad)
		}
	}
}

func TestFormatTimestamp(t *testing.T) {
	for _, tc := range []struct {
		in   time.Time
		want string
	}{
		{time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC), "2024-05-01 12:00:00"},
		{time.Date(2024, 5, 1, 12, 0, 0, 999, time.UTC), "2024-05-01 12:00:00"},
		{time.Date(2024, 5, 1, 12, 0, 0, 120000000, time.UTC), "2024-05-01 12:00:00.120000"},
		{time.Date(2024, 5, 1, 14, 0, 0, 1000, time.FixedZone("x", 7200)), "2024-05-01 12:00:00.000001"},
	} {
		if got := nova.FormatTimestamp(tc.in); got != tc.want {
			t.Errorf("FormatTimestamp(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseEventType(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want nova.EventType
	}{
		{"instance.resize_prep.start", nova.EventType{"instance", "resize_prep", nova.PhaseStart}},
		{"instance.update", nova.EventType{"instance", "update", ""}},
		{"compute_task.build_instances.error", nova.EventType{"compute_task", "build_instances", nova.PhaseError}},
		{"aggregate.cache_images.progress", nova.EventType{"aggregate", "cache_images", nova.PhaseProgress}},
		{"instance", nova.EventType{"instance", "", ""}},
	} {
		if got := nova.ParseEventType(tc.in); got != tc.want {
			t.Errorf("ParseEventType(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
	if !nova.ParseEventType("instance.resize_prep.start").KnownEvent() || nova.ParseEventType("instance.teleport.end").KnownEvent() {
		t.Error("KnownEvent")
	}
	if !(nova.PhaseStart.Rank() < nova.PhaseNone.Rank() && nova.PhaseNone.Rank() < nova.PhaseEnd.Rank() && nova.PhaseError.Rank() == nova.PhaseEnd.Rank()) {
		t.Error("phase ranks out of order")
	}
}

const inner = `{"message_id":"m1","publisher_id":"nova-compute:cmp-1.example","event_type":"service.update","priority":"info","timestamp":"2024-05-01 12:00:00","payload":{"nova_object.name":"ServiceStatusPayload","nova_object.namespace":"nova","nova_object.version":"1.1","nova_object.data":{"host":"cmp-1.example","binary":"nova-compute","future_field":{"x":1}}},"_unique_id":"u1","_context_request_id":"req-1","_context_global_request_id":"greq-1","_context_project_id":"p1","_context_user_id":"u1","_context_auth_token":"secret","_context_roles":["admin"]}`

func envelope(s string) string {
	b, _ := json.Marshal(map[string]string{"oslo.version": "2.0", "oslo.message": s})
	return string(b)
}

func TestDecode(t *testing.T) {
	for _, body := range []string{inner, envelope(inner)} {
		m, err := nova.Decode([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if m.MessageID != "m1" || m.Service != "nova-compute" || m.Host != "cmp-1.example" || m.Priority != "INFO" || m.UniqueID != "u1" {
			t.Errorf("got %+v", m)
		}
		want := nova.Context{RequestID: "req-1", GlobalRequestID: "greq-1", ProjectID: "p1", UserID: "u1"}
		if m.Context != want {
			t.Errorf("context %+v, want %+v", m.Context, want)
		}
		p, err := m.Decode()
		if err != nil {
			t.Fatal(err)
		}
		if s, ok := p.(*nova.ServiceStatus); !ok || s.Host != "cmp-1.example" {
			t.Errorf("payload %#v", p)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	repl := func(old, new string) string { return strings.Replace(inner, old, new, 1) }
	for _, tc := range []struct {
		name string
		body string
		kind nova.Kind
		// field is checked when set
		field string
	}{
		{"empty", ``, nova.KindNotJSON, ""},
		{"text", `hello`, nova.KindNotJSON, ""},
		{"array", `[1]`, nova.KindNotJSON, ""},
		{"null", `null`, nova.KindNotJSON, ""},
		{"truncated", inner[:40], nova.KindNotJSON, ""},
		{"envelope version", `{"oslo.version":"3.0","oslo.message":"{}"}`, nova.KindBrokenEnvelope, "oslo.version"},
		{"envelope version type", `{"oslo.version":2,"oslo.message":"{}"}`, nova.KindBrokenEnvelope, "oslo.version"},
		{"envelope no message", `{"oslo.version":"2.0"}`, nova.KindBrokenEnvelope, "oslo.message"},
		{"envelope message object", `{"oslo.version":"2.0","oslo.message":{}}`, nova.KindBrokenEnvelope, "oslo.message"},
		{"envelope message not json", `{"oslo.version":"2.0","oslo.message":"nope"}`, nova.KindBrokenEnvelope, "oslo.message"},
		{"nested envelope", envelope(envelope(inner)), nova.KindBrokenEnvelope, "oslo.message"},
		{"no message_id", repl(`"message_id":"m1",`, ``), nova.KindNoMessageID, "message_id"},
		{"empty message_id", repl(`"message_id":"m1"`, `"message_id":""`), nova.KindNoMessageID, "message_id"},
		{"message_id number", repl(`"message_id":"m1"`, `"message_id":1`), nova.KindSchema, "message_id"},
		{"no event_type", repl(`"event_type":"service.update",`, ``), nova.KindSchema, "event_type"},
		{"no publisher", repl(`"publisher_id":"nova-compute:cmp-1.example",`, ``), nova.KindSchema, "publisher_id"},
		{"no priority", repl(`"priority":"info",`, ``), nova.KindSchema, "priority"},
		{"no timestamp", repl(`"timestamp":"2024-05-01 12:00:00",`, ``), nova.KindSchema, "timestamp"},
		{"bad timestamp", repl(`2024-05-01 12:00:00`, `soon`), nova.KindSchema, "timestamp"},
		{"payload string", repl(`"payload":{`, `"payload":"x","p":{`), nova.KindSchema, "payload"},
		{"payload no name", repl(`"nova_object.name":"ServiceStatusPayload",`, ``), nova.KindSchema, "payload.nova_object.name"},
		{"payload bad version", repl(`"nova_object.version":"1.1"`, `"nova_object.version":"one"`), nova.KindSchema, "payload.nova_object.version"},
		{"payload data list", repl(`"nova_object.data":{`, `"nova_object.data":[],"x":{`), nova.KindSchema, "payload.nova_object.data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := nova.Decode([]byte(tc.body))
			if nova.KindOf(err) != tc.kind {
				t.Fatalf("err %v, want kind %s", err, tc.kind)
			}
			if !nova.IsPoison(err) {
				t.Errorf("%v: want poison", err)
			}
			var e *nova.Error
			if tc.field != "" && (!asError(err, &e) || e.Field != tc.field) {
				t.Errorf("err %v: want field %s", err, tc.field)
			}
		})
	}
}

func asError(err error, e **nova.Error) bool {
	v, ok := err.(*nova.Error)
	*e = v
	return ok
}

func TestDecodePayloadErrors(t *testing.T) {
	obj := func(name, version, data string) nova.Object {
		return nova.Object{Name: name, Namespace: "nova", Version: version, Data: json.RawMessage(data)}
	}
	for _, tc := range []struct {
		name  string
		obj   nova.Object
		kind  nova.Kind
		field string
	}{
		{"instance no uuid", obj("InstanceActionPayload", "1.9", `{"host":"h"}`), nova.KindSchema, "payload.uuid"},
		{"instance uuid number", obj("InstanceActionPayload", "1.9", `{"uuid":5}`), nova.KindSchema, "payload.uuid"},
		{"flavor wrong object", obj("InstanceActionPayload", "1.9", `{"uuid":"178b0921-8f85-4257-88b6-2e743b5a975c","flavor":{"nova_object.name":"Nope","nova_object.version":"1.0","nova_object.data":{}}}`), nova.KindSchema, "payload.flavor.nova_object.name"},
		{"extra_specs not strings", obj("FlavorPayload", "1.4", `{"flavorid":"f","extra_specs":{"resources:VGPU":1}}`), nova.KindSchema, "payload.extra_specs"},
		{"new major", obj("InstanceActionPayload", "2.0", `{"uuid":"178b0921-8f85-4257-88b6-2e743b5a975c"}`), nova.KindUnknownVersion, "payload"},
		{"update old major", obj("InstanceUpdatePayload", "1.9", `{"uuid":"178b0921-8f85-4257-88b6-2e743b5a975c"}`), nova.KindUnknownVersion, "payload"},
		{"nested flavor major", obj("InstanceActionPayload", "1.9", `{"uuid":"178b0921-8f85-4257-88b6-2e743b5a975c","flavor":{"nova_object.name":"FlavorPayload","nova_object.version":"2.0","nova_object.data":{}}}`), nova.KindUnknownVersion, "payload.flavor"},
		{"instance bad uuid", obj("InstanceActionPayload", "1.9", `{"uuid":"not-a-uuid"}`), nova.KindSchema, "payload.uuid"},
		{"task no uuid", obj("ComputeTaskPayload", "1.0", `{"state":"error"}`), nova.KindSchema, "payload.instance_uuid"},
		{"service no host", obj("ServiceStatusPayload", "1.1", `{}`), nova.KindSchema, "payload.host"},
		{"bad time", obj("InstanceActionPayload", "1.9", `{"uuid":"178b0921-8f85-4257-88b6-2e743b5a975c","deleted_at":"never"}`), nova.KindSchema, "payload"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := nova.DecodeObject(tc.obj)
			var e *nova.Error
			if !asError(err, &e) || e.Kind != tc.kind || e.Field != tc.field {
				t.Fatalf("err %v, want %s at %s", err, tc.kind, tc.field)
			}
		})
	}
	// Unknown objects and fields are tolerated.
	p, err := nova.DecodeObject(obj("BrandNewPayload", "7.3", `{"x":1}`))
	if o, ok := p.(*nova.Other); err != nil || !ok || o.Name != "BrandNewPayload" {
		t.Errorf("unknown object: %#v, %v", p, err)
	}
	p, err = nova.DecodeObject(obj("InstanceActionPayload", "1.99", `{"uuid":"178b0921-8f85-4257-88b6-2e743b5a975c","gpu_magic":{"a":[1,2]},"flavor":null}`))
	if a, ok := p.(*nova.InstanceAction); err != nil || !ok || a.UUID == "" || a.Flavor != nil {
		t.Errorf("new minor: %#v, %v", p, err)
	}
}

// FuzzDecode: no input may panic, and an accepted message has what the
// consumer relies on.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(inner))
	f.Add([]byte(envelope(inner)))
	f.Add([]byte(`{"oslo.version":"2.0","oslo.message":"{\"message_id\":1}"}`))
	f.Add([]byte(`{"oslo.version":"2.0","oslo.message":null}`))
	f.Add([]byte(`{}`))
	if samples, err := novatest.Samples(samplesDir); err == nil {
		for i, s := range samples {
			if i%7 == 0 {
				f.Add(s.Wire("id", time.Unix(1714564800, 0)))
			}
		}
	}
	if b, err := os.ReadFile("testdata/notification_samples/instance-update.json"); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := nova.Decode(body)
		if err != nil {
			if nova.KindOf(err) == "" {
				t.Fatalf("error without kind: %v", err)
			}
			return
		}
		if m.MessageID == "" || m.EventType == "" || m.Payload.Name == "" || m.Timestamp.IsZero() && m.Timestamp.Year() != 1 {
			t.Fatalf("accepted incomplete message %+v", m)
		}
		p, err := m.Decode()
		if err != nil && nova.KindOf(err) == "" {
			t.Fatalf("payload error without kind: %v", err)
		}
		if err == nil && p == nil {
			t.Fatal("nil payload without error")
		}
	})
}
