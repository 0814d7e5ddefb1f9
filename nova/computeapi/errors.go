package computeapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/gophercloud/gophercloud/v2"
)

// Kind classifies a failed Nova call.
type Kind int

// Kinds of failure.
const (
	KindFinal     Kind = iota // a bad request, auth failure, forbidden: retrying does not help
	KindRetryable             // 5xx, 429 or a connection failure
	KindConflict              // 409: the server is not in a state that allows the action
	KindNotFound              // 404: no such server or flavor
)

// Error is a failed Nova call.
type Error struct {
	Op      string // "POST /servers/{id}/action resize"
	Kind    Kind
	Status  int    // HTTP status, 0 if none came back
	Message string // Nova's message ({"conflictingRequest": {"message": …}})
	Err     error
}

func (e *Error) Error() string {
	if e.Status != 0 {
		m := e.Message
		if m == "" && e.Err != nil {
			m = e.Err.Error()
		}
		return fmt.Sprintf("nova %s: %d %s: %s", e.Op, e.Status, http.StatusText(e.Status), m)
	}
	return fmt.Sprintf("nova %s: %v", e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

func kindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindFinal
}

// IsRetryable reports whether the same call may succeed later.
func IsRetryable(err error) bool { return kindOf(err) == KindRetryable }

// IsConflict reports a 409 (the server's state forbids the action).
func IsConflict(err error) bool { return kindOf(err) == KindConflict }

// IsNotFound reports a 404.
func IsNotFound(err error) bool { return kindOf(err) == KindNotFound }

// classify turns a gophercloud error into an *Error; the one place that
// decides what is retryable.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	e := &Error{Op: op, Err: err}
	var ue gophercloud.ErrUnexpectedResponseCode
	switch {
	case errors.As(err, &ue):
		e.Status, e.Message = ue.Actual, novaMessage(ue.Body)
		switch {
		case ue.Actual == http.StatusNotFound:
			e.Kind = KindNotFound
		case ue.Actual == http.StatusConflict:
			e.Kind = KindConflict
		case ue.Actual == http.StatusTooManyRequests || ue.Actual >= 500:
			e.Kind = KindRetryable
		}
	default:
		var ne net.Error
		var oe *net.OpError
		if errors.As(err, &ne) || errors.As(err, &oe) {
			e.Kind = KindRetryable
		}
	}
	return e
}

// novaMessage reads Nova's error body: {"<kind>": {"code": 409, "message": "…"}}.
func novaMessage(body []byte) string {
	var m map[string]struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &m) == nil {
		for _, v := range m {
			if v.Message != "" {
				return v.Message
			}
		}
	}
	if len(body) > 300 {
		body = body[:300]
	}
	return string(body)
}
