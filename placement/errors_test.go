package placement

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
)

func httpErr(status int, body string) error {
	return gophercloud.ErrUnexpectedResponseCode{Actual: status, Body: []byte(body), Method: "PUT", URL: "http://x/allocations/c"}
}

// Bodies as Placement 8.0 writes them.
const (
	consumerGen = `{"errors": [{"status": 409, "title": "Conflict", "detail": "There was a conflict when trying to complete your request.\n\n consumer generation conflict - expected null but got 1  ", "code": "placement.concurrent_update", "request_id": "req-1"}]}`
	providerGen = `{"errors": [{"status": 409, "title": "Conflict", "detail": "There was a conflict when trying to complete your request.\n\n Inventory and/or allocations changed while attempting to allocate: Another thread concurrently updated the data. Please retry your update  ", "code": "placement.concurrent_update", "request_id": "req-2"}]}`
	capacity    = `{"errors": [{"status": 409, "title": "Conflict", "detail": "There was a conflict when trying to complete your request.\n\n Unable to allocate inventory: Unable to create allocation for 'VGPU' on resource provider 'abc'. The requested amount would exceed the capacity.  ", "code": "placement.undefined_code", "request_id": "req-3"}]}`
	inUse       = `{"errors": [{"status": 409, "title": "Conflict", "detail": "Unable to delete resource provider abc: Resource provider has allocations.", "code": "placement.resource_provider.inuse"}]}`
	badReq      = `{"errors": [{"status": 400, "title": "Bad Request", "detail": "JSON does not validate", "code": "placement.undefined_code"}]}`
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want Kind
		code string
	}{
		{"consumer generation", httpErr(409, consumerGen), KindConflict, CodeConcurrentUpdate},
		{"provider generation", httpErr(409, providerGen), KindConflict, CodeConcurrentUpdate},
		{"capacity", httpErr(409, capacity), KindCapacity, CodeUndefined},
		{"provider in use is final", httpErr(409, inUse), KindFinal, CodeProviderInUse},
		{"bad request", httpErr(400, badReq), KindFinal, CodeUndefined},
		{"503 without json", httpErr(503, "Service Unavailable"), KindRetryable, ""},
		{"500", httpErr(500, `{"errors":[{"status":500,"code":"placement.undefined_code","detail":"boom"}]}`), KindRetryable, CodeUndefined},
		{"404", httpErr(404, `{"errors":[{"status":404,"code":"placement.resource_provider.not_found","detail":"No resource provider"}]}`), KindNotFound, CodeProviderNotFound},
		{"connection refused", fmt.Errorf("dial: %w", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), KindRetryable, ""},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), KindRetryable, ""},
		{"deadline", context.DeadlineExceeded, KindFinal, ""},
		{"other", errors.New("boom"), KindFinal, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := classify("PUT /allocations/{consumer}", tt.err)
			if got := KindOf(err); got != tt.want {
				t.Fatalf("kind = %v, want %v (%v)", got, tt.want, err)
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Code != tt.code {
				t.Fatalf("code = %q, want %q", pe.Code, tt.code)
			}
			if !errors.Is(err, tt.err) && !errors.As(err, new(gophercloud.ErrUnexpectedResponseCode)) {
				t.Fatalf("%v does not wrap its cause", err)
			}
			preds := map[Kind]func(error) bool{KindConflict: IsConflict, KindCapacity: IsCapacity, KindRetryable: IsRetryable, KindNotFound: IsNotFound}
			for k, p := range preds {
				if p(fmt.Errorf("claim: %w", err)) != (k == tt.want) {
					t.Errorf("predicate for %v disagrees", k)
				}
			}
		})
	}
}

func FuzzClassify(f *testing.F) {
	for _, b := range []string{consumerGen, providerGen, capacity, inUse, badReq, "", "{", `{"errors":[]}`} {
		f.Add(409, b)
	}
	f.Fuzz(func(t *testing.T, status int, body string) {
		err := classify("GET /x", httpErr(status, body))
		if err == nil || err.Error() == "" {
			t.Fatal("no error")
		}
	})
}

func TestBackoffCapped(t *testing.T) {
	b := Backoff{Base: 10e6, Max: 100e6}
	for i := 0; i < 50; i++ {
		if d := b.Next(); d <= 0 || d > 105e6 {
			t.Fatalf("wait %v outside (0, 105ms]", d)
		}
	}
}
