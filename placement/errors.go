package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/gophercloud/gophercloud/v2"
)

// Kind classifies a failed Placement call. Callers switch on it through
// the predicates IsRetryable, IsConflict, IsCapacity and IsNotFound.
type Kind int

// Kinds of failure.
const (
	KindFinal     Kind = iota // do not retry: a bad request, auth failure, or a caller's error
	KindRetryable             // 5xx or a connection failure: the same call may succeed later
	KindConflict              // placement.concurrent_update: a provider or consumer generation moved
	KindCapacity              // the allocation would exceed inventory or violate its constraints
	KindNotFound              // 404
)

func (k Kind) String() string {
	switch k {
	case KindRetryable:
		return "retryable"
	case KindConflict:
		return "conflict"
	case KindCapacity:
		return "capacity"
	case KindNotFound:
		return "not_found"
	default:
		return "final"
	}
}

// Placement error codes (placement/errors.py).
const (
	CodeConcurrentUpdate = "placement.concurrent_update"
	CodeInventoryInUse   = "placement.inventory.inuse"
	CodeDuplicateName    = "placement.duplicate_name"
	CodeProviderInUse    = "placement.resource_provider.inuse"
	CodeProviderNotFound = "placement.resource_provider.not_found"
	CodeUndefined        = "placement.undefined_code"
)

// Error is a failed Placement call.
type Error struct {
	Op     string // "PUT /allocations/{consumer}"
	Kind   Kind
	Status int    // HTTP status, 0 if none came back
	Code   string // errors[0].code of Placement's body
	Detail string // errors[0].detail
	Err    error  // underlying error
}

func (e *Error) Error() string {
	if e.Status != 0 {
		d := e.Detail
		if d == "" && e.Err != nil {
			d = e.Err.Error()
		}
		return fmt.Sprintf("placement %s: %d %s (%s): %s", e.Op, e.Status, http.StatusText(e.Status), e.Code, d)
	}
	return fmt.Sprintf("placement %s: %v", e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// KindOf returns the kind of err (KindFinal when err is not a Placement error).
func KindOf(err error) Kind {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Kind
	}
	return KindFinal
}

// IsRetryable reports whether err is a 5xx or connection failure.
func IsRetryable(err error) bool { return KindOf(err) == KindRetryable }

// IsConflict reports whether err is a generation conflict
// (placement.concurrent_update), of a provider or of a consumer.
func IsConflict(err error) bool { return KindOf(err) == KindConflict }

// IsCapacity reports whether err says the allocation does not fit the
// inventory (capacity exceeded, or min_unit/max_unit/step_size violated).
func IsCapacity(err error) bool { return KindOf(err) == KindCapacity }

// IsNotFound reports whether err is a 404.
func IsNotFound(err error) bool { return KindOf(err) == KindNotFound }

// ErrNoCapacity is returned by claims when no candidate is left.
var ErrNoCapacity = errors.New("no vGPU capacity left for the request")

// ErrConsumerGone says a consumer a write needs to exist has no
// allocations (TransferReservation: the instance was deleted).
var ErrConsumerGone = errors.New("consumer has no allocations")

// placementErrors is Placement's JSON error body.
type placementErrors struct {
	Errors []struct {
		Status int    `json:"status"`
		Title  string `json:"title"`
		Detail string `json:"detail"`
		Code   string `json:"code"`
	} `json:"errors"`
}

// classify is the one place where Placement failures get their kind.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var pe *Error
	if errors.As(err, &pe) {
		return err
	}
	e := &Error{Op: op, Kind: KindFinal, Err: err}
	var rc gophercloud.ErrUnexpectedResponseCode
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		// The caller gave up: final for this call.
	case errors.As(err, &rc):
		e.Status = rc.Actual
		var body placementErrors
		if json.Unmarshal(rc.Body, &body) == nil && len(body.Errors) > 0 {
			e.Code, e.Detail = body.Errors[0].Code, body.Errors[0].Detail
		} else {
			e.Detail = strings.TrimSpace(string(rc.Body))
		}
		e.Kind = kindOfStatus(rc.Actual, e.Code, e.Detail)
	default:
		var ne net.Error
		var oe *net.OpError
		if errors.As(err, &ne) || errors.As(err, &oe) || isConnErr(err) {
			e.Kind = KindRetryable
		}
	}
	return e
}

func kindOfStatus(status int, code, detail string) Kind {
	switch {
	case status >= 500 || status == http.StatusTooManyRequests:
		return KindRetryable
	case status == http.StatusNotFound:
		return KindNotFound
	case status == http.StatusConflict && code == CodeConcurrentUpdate:
		return KindConflict
	case status == http.StatusConflict && (code == "" || code == CodeUndefined) && isCapacityDetail(detail):
		// Placement gives capacity failures no code of their own
		// (InvalidInventory → HTTPConflict without comment), so this is
		// the one place that reads the message.
		return KindCapacity
	default:
		return KindFinal
	}
}

func isCapacityDetail(d string) bool {
	return strings.Contains(d, "Unable to allocate inventory") ||
		strings.Contains(d, "would violate inventory constraints") ||
		strings.Contains(d, "exceed the capacity")
}

func isConnErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
