// Package requestid carries an OpenStack request id (req-<uuid>) through a
// context: the API's X-OpenStack-Request-ID, or Nova's global_request_id
// of the notification being processed. Outgoing OpenStack calls send it as
// X-OpenStack-Request-ID, which oslo.middleware takes as the call's
// global_request_id, so one id follows an operation through the bridge's
// logs, its audit rows, Placement and Nova.
//
// Wiring an HTTP client (gophercloud included):
//
//	hc := &http.Client{Transport: requestid.Transport(base)}
//	ctx = requestid.With(ctx, "req-…") // then every call made with ctx sends it
package requestid

import (
	"context"
	"log/slog"
	"net/http"
	"strings"

	"github.com/google/uuid"
)

// Header is OpenStack's request id header.
const Header = "X-OpenStack-Request-ID"

// LogKey is the slog attribute the Handler adds.
const LogKey = "global_request_id"

type ctxKey struct{}

// Valid reports whether id has OpenStack's form req-<uuid>.
func Valid(id string) bool {
	if !strings.HasPrefix(id, "req-") {
		return false
	}
	_, err := uuid.Parse(id[4:])
	return err == nil
}

// With returns ctx carrying id; an invalid id leaves ctx as it is.
func With(ctx context.Context, id string) context.Context {
	if !Valid(id) {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, id)
}

// From returns the id ctx carries, or "".
func From(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

// FromUUID makes a request id of a bridge request's uuid (webhook requests
// carry no OpenStack id of their own).
func FromUUID(u uuid.UUID) string { return "req-" + u.String() }

// roundTripper sets Header from the request's context.
type roundTripper struct{ next http.RoundTripper }

// Transport wraps next (nil: http.DefaultTransport) so that every request
// whose context carries an id, and which sets no Header itself, sends it.
func Transport(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return roundTripper{next: next}
}

// RoundTrip implements http.RoundTripper.
func (t roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	if id := From(r.Context()); id != "" && r.Header.Get(Header) == "" {
		r = r.Clone(r.Context())
		r.Header.Set(Header, id)
	}
	return t.next.RoundTrip(r)
}

// handler adds LogKey to records logged with a context carrying an id.
type handler struct{ slog.Handler }

// Handler wraps h so that records logged with a context (InfoContext,
// LogAttrs) carrying an id get it as the attribute global_request_id.
func Handler(h slog.Handler) slog.Handler { return handler{h} }

// Handle implements slog.Handler.
func (h handler) Handle(ctx context.Context, r slog.Record) error {
	if id := From(ctx); id != "" {
		r = r.Clone()
		r.AddAttrs(slog.String(LogKey, id))
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h handler) WithAttrs(as []slog.Attr) slog.Handler { return handler{h.Handler.WithAttrs(as)} }

// WithGroup implements slog.Handler.
func (h handler) WithGroup(name string) slog.Handler { return handler{h.Handler.WithGroup(name)} }
