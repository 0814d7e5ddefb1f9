// Package apiclient is a Go client of the vgpu-bridge operator API
// (GET /v1/openapi.json) and a signing sender for its webhook endpoint.
// vgpuctl and the integration tests share it.
//
// It depends on nothing of the bridge daemon: its types mirror the JSON the
// API answers, and every typed result keeps the answer as sent in Raw, for
// callers that re-emit it unchanged.
//
//	c := apiclient.New(apiclient.Config{URL: "http://127.0.0.1:9797", Token: os.Getenv("VGPUCTL_TOKEN")})
//	hosts, err := c.Hosts(ctx)
//	switch {
//	case apiclient.IsUnreachable(err): // nothing answered
//	case apiclient.StatusCode(err) == http.StatusForbidden: // the token lacks the role
//	}
//
// Errors the API answers (application/problem+json) are *Error values with
// the problem's title, detail and invalid parameters.
package apiclient
