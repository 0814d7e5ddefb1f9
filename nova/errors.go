package nova

import (
	"errors"
	"fmt"
)

// Kind classifies a decoding failure. The consumer maps the "poison" kinds to
// dead letters and records the "unrecognized" kinds as events it does not act on.
type Kind string

// Kinds of decoding failures.
const (
	// KindNotJSON: the body is not a JSON object.
	KindNotJSON Kind = "not_json"
	// KindBrokenEnvelope: an oslo envelope that is not a 2.0 envelope
	// carrying a JSON object as a string.
	KindBrokenEnvelope Kind = "broken_envelope"
	// KindNoMessageID: the inner message has no message_id.
	KindNoMessageID Kind = "no_message_id"
	// KindSchema: a field is missing, has the wrong type or an impossible value.
	KindSchema Kind = "schema"
	// KindUnknownVersion: a nova_object whose major version this package does
	// not know. Not poison: the event is recorded but not applied.
	KindUnknownVersion Kind = "unknown_version"
)

// Error is a decoding error with a kind callers switch on.
type Error struct {
	Kind  Kind
	Field string // the offending field, when there is one
	Msg   string
	Err   error // underlying error, if any
}

func (e *Error) Error() string {
	s := string(e.Kind)
	if e.Field != "" {
		s += ": " + e.Field
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

func errorf(kind Kind, field, format string, args ...any) *Error {
	return &Error{Kind: kind, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// KindOf returns the Kind of a decoding error, or "" when err is nil or not
// an *Error.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return ""
}

// IsPoison reports whether err means the message can never be processed and
// belongs in the dead-letter table.
func IsPoison(err error) bool {
	switch KindOf(err) {
	case KindNotJSON, KindBrokenEnvelope, KindNoMessageID, KindSchema:
		return true
	}
	return false
}
