package requests

import (
	"time"

	"github.com/google/uuid"
)

// WebhookEvent is the payload of the inbox row (events, source
// "webhook:<name>") written for each accepted webhook event; the pipeline
// reads it back to build the policy's event. It is defined here, once, for
// both sides.
type WebhookEvent struct {
	RequestID   uuid.UUID      `json:"request_id"`
	Source      string         `json:"source"`
	Type        string         `json:"type"`
	VMID        string         `json:"vm_id"`
	Workload    string         `json:"workload,omitempty"`
	VGPUProfile string         `json:"vgpu_profile,omitempty"`
	Count       int            `json:"count,omitempty"`
	Metrics     map[string]any `json:"metrics,omitempty"`
	CallbackURL string         `json:"callback_url,omitempty"`
	GuestDriver string         `json:"guest_driver,omitempty"`
	// Tune is tuning the sender asks for (policy.TuneRequest); the policy
	// and the bridge decide whether it is applied.
	Tune  *WebhookTune  `json:"tune,omitempty"`
	Alert *WebhookAlert `json:"alert,omitempty"`
}

// WebhookTune is a webhook request's "tune": a vGPU scheduler
// (best_effort, equal_share, fixed_share), its timeslice in µs and an SM
// application clock in MHz; zero values leave a setting as it is.
type WebhookTune struct {
	Scheduler   string `json:"scheduler,omitempty"`
	TimesliceUS int    `json:"timeslice_us,omitempty"`
	ClocksMHz   int    `json:"clocks_mhz,omitempty"`
}

// WebhookAlert is one Alertmanager alert as a webhook event carries it.
type WebhookAlert struct {
	Status       string            `json:"status"`
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	StartsAt     time.Time         `json:"startsAt"`
	EndsAt       time.Time         `json:"endsAt"`
	GeneratorURL string            `json:"generatorURL,omitempty"`
	Fingerprint  string            `json:"fingerprint,omitempty"`
}
