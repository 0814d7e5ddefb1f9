package nova

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// EnvelopeVersion is the oslo.messaging message format the messagingv2 driver
// writes ("oslo.version").
const EnvelopeVersion = "2.0"

// Message is one decoded notification: the oslo envelope unwrapped and the
// inner message's fields, with the payload still a raw nova_object.
type Message struct {
	// Envelope is "2.0" for the messagingv2 envelope and "" for the legacy
	// un-enveloped form.
	Envelope    string
	MessageID   string
	PublisherID string
	// Service and Host split PublisherID ("nova-compute:host1"); Host is
	// Nova's compute service host for nova-compute.
	Service   string
	Host      string
	EventType string
	Event     EventType
	// Priority is upper case ("INFO", "ERROR").
	Priority  string
	Timestamp time.Time
	UniqueID  string
	Context   Context
	Payload   Object
	// RawPayload is the payload's JSON: its nova_object header and data.
	RawPayload json.RawMessage
}

// Context is the part of the flattened request context (_context_* keys)
// the bridge keeps. The rest (tokens, catalogs, roles…) is ignored.
type Context struct {
	RequestID       string `json:"request_id,omitempty"`
	GlobalRequestID string `json:"global_request_id,omitempty"`
	ProjectID       string `json:"project_id,omitempty"`
	UserID          string `json:"user_id,omitempty"`
}

// Object is a serialized nova_object with its data left raw.
type Object struct {
	Name      string          `json:"nova_object.name"`
	Namespace string          `json:"nova_object.namespace"`
	Version   string          `json:"nova_object.version"`
	Data      json.RawMessage `json:"nova_object.data"`
}

// wire holds both the envelope fields and the inner message's fields, so the
// legacy form needs one pass and the 2.0 form two.
type wire struct {
	OsloVersion *json.RawMessage `json:"oslo.version"`
	OsloMessage *json.RawMessage `json:"oslo.message"`

	MessageID   *string `json:"message_id"`
	PublisherID *string `json:"publisher_id"`
	EventType   *string `json:"event_type"`
	Priority    *string `json:"priority"`
	Timestamp   *string `json:"timestamp"`
	Payload     *Object `json:"payload"`
	UniqueID    *string `json:"_unique_id"`

	CtxRequestID       *string `json:"_context_request_id"`
	CtxGlobalRequestID *string `json:"_context_global_request_id"`
	CtxProjectID       *string `json:"_context_project_id"`
	CtxUserID          *string `json:"_context_user_id"`
}

// Decode unwraps an AMQP message body: the oslo 2.0 envelope or the legacy
// form, then the inner message. It checks what every notification must have
// (message_id, publisher_id, event_type, priority, timestamp and a nova_object
// payload); the payload's data is decoded later by (*Message).Decode.
//
// Errors are *Error; IsPoison tells whether the message is a dead letter.
func Decode(body []byte) (*Message, error) {
	buf := innerBufs.Get().(*[]byte)
	w, ver, ok := fastWire(body, buf)
	var m *Message
	var err error
	if ok {
		// fromWire copies what it keeps of w (strings, the payload).
		m, err = fromWire(&w, ver)
	}
	if cap(*buf) <= maxKeptInnerBuf {
		innerBufs.Put(buf)
	}
	if ok && err == nil {
		return m, nil
	}
	return decodeReference(body)
}

// decodeReference is Decode with encoding/json: it decides every message the
// fast path leaves to it, and gives the precise errors.
func decodeReference(body []byte) (*Message, error) {
	var w wire
	if err := unmarshalObject(body, &w); err != nil {
		return nil, wireErr(KindNotJSON, "", err)
	}
	ver := ""
	if w.OsloVersion != nil || w.OsloMessage != nil {
		if w.OsloVersion == nil || json.Unmarshal(*w.OsloVersion, &ver) != nil {
			return nil, errorf(KindBrokenEnvelope, "oslo.version", "missing or not a string")
		}
		if major, _, _ := strings.Cut(ver, "."); major != "2" {
			return nil, errorf(KindBrokenEnvelope, "oslo.version", "unsupported version %q (want %s)", ver, EnvelopeVersion)
		}
		var inner string
		if w.OsloMessage == nil || json.Unmarshal(*w.OsloMessage, &inner) != nil {
			return nil, errorf(KindBrokenEnvelope, "oslo.message", "missing or not a JSON string")
		}
		w = wire{}
		if err := unmarshalObject([]byte(inner), &w); err != nil {
			return nil, wireErr(KindBrokenEnvelope, "oslo.message", err)
		}
		if w.OsloVersion != nil || w.OsloMessage != nil {
			return nil, errorf(KindBrokenEnvelope, "oslo.message", "nested envelope")
		}
	}
	return fromWire(&w, ver)
}

// fromWire checks the inner message's fields and builds the Message; ver
// is the envelope's version, "" for the legacy form.
func fromWire(w *wire, ver string) (*Message, error) {
	m := &Message{Envelope: ver}
	if w.MessageID == nil || *w.MessageID == "" {
		return nil, errorf(KindNoMessageID, "message_id", "missing")
	}
	m.MessageID = *w.MessageID
	if len(m.MessageID) > 255 {
		return nil, errorf(KindSchema, "message_id", "longer than 255 bytes")
	}
	if w.EventType == nil || *w.EventType == "" {
		return nil, errorf(KindSchema, "event_type", "missing")
	}
	m.EventType = *w.EventType
	m.Event = ParseEventType(m.EventType)
	if w.PublisherID == nil || *w.PublisherID == "" {
		return nil, errorf(KindSchema, "publisher_id", "missing")
	}
	m.PublisherID = *w.PublisherID
	m.Service, m.Host, _ = strings.Cut(m.PublisherID, ":")
	if w.Priority == nil || *w.Priority == "" {
		return nil, errorf(KindSchema, "priority", "missing")
	}
	m.Priority = strings.ToUpper(*w.Priority)
	if w.Timestamp == nil {
		return nil, errorf(KindSchema, "timestamp", "missing")
	}
	ts, err := ParseTimestamp(*w.Timestamp)
	if err != nil {
		return nil, &Error{Kind: KindSchema, Field: "timestamp", Err: err}
	}
	m.Timestamp = ts
	if w.UniqueID != nil {
		m.UniqueID = *w.UniqueID
	}
	m.Context = Context{
		RequestID:       deref(w.CtxRequestID),
		GlobalRequestID: deref(w.CtxGlobalRequestID),
		ProjectID:       deref(w.CtxProjectID),
		UserID:          deref(w.CtxUserID),
	}

	if w.Payload == nil {
		return nil, errorf(KindSchema, "payload", "missing or null")
	}
	m.Payload = *w.Payload
	if m.Payload.Name == "" {
		return nil, errorf(KindSchema, "payload.nova_object.name", "missing")
	}
	if _, _, ok := splitVersion(m.Payload.Version); !ok {
		return nil, errorf(KindSchema, "payload.nova_object.version", "want MAJOR.MINOR, got %q", m.Payload.Version)
	}
	if len(m.Payload.Data) == 0 || m.Payload.Data[0] != '{' {
		return nil, errorf(KindSchema, "payload.nova_object.data", "missing or not an object")
	}
	m.RawPayload = m.Payload.JSON()
	// The data, as a slice of RawPayload: one copy, not aliasing the input.
	m.Payload.Data = m.RawPayload[len(m.RawPayload)-1-len(m.Payload.Data) : len(m.RawPayload)-1 : len(m.RawPayload)-1]
	return m, nil
}

// wireErr classifies a decoding error of the message: a wrong type in a
// known field is a schema violation naming the field, anything else is
// kind (the JSON itself is broken).
func wireErr(kind Kind, field string, err error) error {
	if te, ok := err.(*json.UnmarshalTypeError); ok {
		f := te.Field
		if f == "" {
			f = field
		}
		return &Error{Kind: KindSchema, Field: f, Msg: fmt.Sprintf("want %s, got JSON %s", te.Type, te.Value)}
	}
	if kind == KindBrokenEnvelope {
		return &Error{Kind: kind, Field: field, Msg: "not a JSON object", Err: err}
	}
	return &Error{Kind: kind, Err: err}
}

// JSON re-encodes the object: its name, namespace, version and data (other
// header keys such as nova_object.changes are not kept).
func (o Object) JSON() json.RawMessage {
	// The keys, quotes and braces take 95 bytes; names that need escapes
	// grow it.
	b := make([]byte, 0, len(o.Data)+len(o.Name)+len(o.Namespace)+len(o.Version)+96)
	b = append(b, `{"nova_object.name":`...)
	b = appendQuoted(b, o.Name)
	b = append(b, `,"nova_object.namespace":`...)
	b = appendQuoted(b, o.Namespace)
	b = append(b, `,"nova_object.version":`...)
	b = appendQuoted(b, o.Version)
	b = append(b, `,"nova_object.data":`...)
	b = append(b, o.Data...)
	return append(b, '}')
}

// appendQuoted appends s as json.Marshal writes it: directly when it is
// printable ASCII that needs no escape, else through json.Marshal.
func appendQuoted(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// unmarshalObject decodes b into v, insisting that b is a JSON object (so
// "null", numbers and arrays are rejected rather than silently ignored).
func unmarshalObject(b []byte, v any) error {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 || b[0] != '{' {
		return errNotObject
	}
	return json.Unmarshal(b, v)
}

type notObjectError struct{}

func (notObjectError) Error() string { return "not a JSON object" }

var errNotObject error = notObjectError{}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// splitVersion splits "MAJOR.MINOR".
func splitVersion(v string) (major, minor int, ok bool) {
	a, b, found := strings.Cut(v, ".")
	if !found {
		return 0, 0, false
	}
	major, ok1 := atoi(a)
	minor, ok2 := atoi(b)
	return major, minor, ok1 && ok2
}

func atoi(s string) (int, bool) {
	if s == "" || len(s) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// EventType is an event_type split into its parts:
// "instance.resize_prep.start" → Object "instance", Action "resize_prep",
// Phase "start". "instance.update" has Action "update" and no Phase.
type EventType struct {
	Object string
	Action string
	Phase  Phase
}

// Phase is the last part of an action's event type.
type Phase string

// Phases Nova emits.
const (
	PhaseNone     Phase = ""
	PhaseStart    Phase = "start"
	PhaseProgress Phase = "progress"
	PhaseEnd      Phase = "end"
	PhaseError    Phase = "error"
)

// Rank orders the phases of one action for events with the same timestamp:
// start < (no phase) < progress < end, error. Used so that an older event
// never overwrites newer instance state.
func (p Phase) Rank() int {
	switch p {
	case PhaseStart:
		return 1
	case PhaseNone:
		return 2
	case PhaseProgress:
		return 3
	case PhaseEnd, PhaseError:
		return 4
	}
	return 2
}

// ParseEventType splits an event type. Unknown shapes keep the whole tail in
// Action.
func ParseEventType(s string) EventType {
	obj, rest, _ := strings.Cut(s, ".")
	et := EventType{Object: obj, Action: rest}
	if i := strings.LastIndexByte(rest, '.'); i >= 0 {
		switch p := Phase(rest[i+1:]); p {
		case PhaseStart, PhaseEnd, PhaseError, PhaseProgress:
			et.Action, et.Phase = rest[:i], p
		}
	}
	return et
}
