// Package webhookwire holds the JSON shapes of the webhook answers
// (POST /v1/webhooks/{source}) that vgpuctl's client reads too. It imports
// nothing of the server.
package webhookwire

// Skipped names an alert that was not turned into an event.
type Skipped struct {
	Index       int    `json:"index"`
	Fingerprint string `json:"fingerprint,omitempty"`
	AlertName   string `json:"alertname,omitempty"`
	Reason      string `json:"reason"`
}
