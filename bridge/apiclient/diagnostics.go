// SPDX-License-Identifier: Apache-2.0

package apiclient

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/diagnostics/diagnosticswire"
)

// MaxBundleBytes bounds a diagnostics bundle's download (the agents'
// max_bundle_bytes is at most 64 MiB).
const MaxBundleBytes = 64 << 20

// Diagnostics is a diagnostics request (POST /v1/hosts/{name}/diagnostics,
// GET /v1/diagnostics/{id}).
type Diagnostics = diagnosticswire.Diagnostics

// RequestDiagnostics asks host's agent for a bundle (admin); instance
// may be empty, timeout 0 takes the bridge's default.
func (c *Client) RequestDiagnostics(ctx context.Context, host, instance string, timeout time.Duration) (Diagnostics, error) {
	var d Diagnostics
	body := map[string]any{}
	if instance != "" {
		body["instance"] = instance
	}
	if timeout > 0 {
		body["timeout_seconds"] = int(timeout.Seconds())
	}
	_, err := c.callInto(ctx, Call{Method: http.MethodPost, Path: "/v1/hosts/" + url.PathEscape(host) + "/diagnostics", Body: body}, &d)
	return d, err
}

// Diagnostics reads a diagnostics request.
func (c *Client) Diagnostics(ctx context.Context, id string) (Diagnostics, error) {
	var d Diagnostics
	_, err := c.getInto(ctx, "/v1/diagnostics/"+url.PathEscape(id), nil, &d)
	return d, err
}

// DiagnosticsBundle downloads a complete request's tar.gz.
func (c *Client) DiagnosticsBundle(ctx context.Context, id string) ([]byte, error) {
	r, err := c.Do(ctx, Call{Method: http.MethodGet, Path: "/v1/diagnostics/" + url.PathEscape(id) + "/bundle", MaxBytes: MaxBundleBytes})
	if err != nil {
		return nil, err
	}
	return r.Body, nil
}
