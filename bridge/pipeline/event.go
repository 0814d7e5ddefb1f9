package pipeline

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// WebhookSourcePrefix starts the inbox source of webhook events
// ("webhook:<name>"); other sources ("nova") are notifications.
const WebhookSourcePrefix = requests.WebhookSourcePrefix

// InboxRow is one events row as the pipeline reads it.
type InboxRow struct {
	ID           int64
	Source       string // "nova", "webhook:<name>"
	MessageID    string
	EventType    string // Nova's event_type, or the webhook type (GPU_REQUEST)
	InstanceUUID string
	OccurredAt   time.Time // the source's own time (Nova's timestamp)
	ReceivedAt   time.Time // when the bridge received it (its own clock)
	Payload      json.RawMessage
	RequestID    string // webhook: the bridge's request id; nova: Nova's req-… id
	ProjectID    string
	Attempts     int
	// DeferredFrom is, for a follow-up (a deferred evaluation, defer.go),
	// the event first held back; DeferredRules the rules to evaluate
	// again, and NotBefore when the follow-up was due.
	DeferredFrom  int64
	DeferredRules []string
	NotBefore     time.Time
	// observeOnly: operators set observe-only mode (read in the event's
	// decision transaction).
	observeOnly bool
	// planned: an earlier attempt at the event planned claims it did not
	// record (requests.PlanClaims).
	planned bool
	// earlier: an earlier event of the same instance is still open, and
	// goes first. A deferred evaluation waiting for its hold to end does
	// not count (defer.go).
	earlier bool
	// request is the row's own request (BridgeRequest) as the statement
	// that locked the row locked and read it (lockEventWith); read false:
	// not read there.
	request ownRequest
}

// ownRequest is a webhook row's request, locked and read with the row:
// its state, nil when there is no such request.
type ownRequest struct {
	read  bool
	state *string
}

// Webhook reports whether the row came by webhook.
func (r InboxRow) Webhook() bool { return strings.HasPrefix(r.Source, WebhookSourcePrefix) }

// BridgeRequest returns the id of the bridge request the row belongs to
// (webhook rows only).
func (r InboxRow) BridgeRequest() (uuid.UUID, bool) {
	if !r.Webhook() || r.RequestID == "" {
		return uuid.Nil, false
	}
	id, err := uuid.Parse(r.RequestID)
	return id, err == nil
}

// NovaKindPrefix starts the policy kind of a Nova notification
// ("nova.instance.delete.end").
const NovaKindPrefix = "nova."

// MapEvent turns an inbox row into the policy's event. It is pure.
func MapEvent(r InboxRow) (policy.Event, error) {
	ev := policy.Event{InstanceUUID: r.InstanceUUID, ProjectID: r.ProjectID, Time: r.OccurredAt}
	if r.Source == BridgeSource {
		return mapBridgeEvent(r, ev)
	}
	if !r.Webhook() {
		ev.Kind = NovaKindPrefix + r.EventType
		ev.Source = r.Source
		return ev, nil
	}
	var p requests.WebhookEvent
	if err := json.Unmarshal(r.Payload, &p); err != nil {
		return ev, fmt.Errorf("event %d: webhook payload: %w", r.ID, err)
	}
	ev.Source = p.Source
	if ev.Source == "" {
		ev.Source = strings.TrimPrefix(r.Source, WebhookSourcePrefix)
	}
	if ev.InstanceUUID == "" {
		ev.InstanceUUID = p.VMID
	}
	ev.Workload, ev.Profile, ev.Count, ev.GuestDriver = p.Workload, p.VGPUProfile, p.Count, p.GuestDriver
	if p.Tune != nil {
		ev.Tune = &policy.TuneRequest{Scheduler: p.Tune.Scheduler, TimesliceUS: p.Tune.TimesliceUS, ClocksMHz: p.Tune.ClocksMHz}
	}
	if len(p.Metrics) > 0 {
		ev.Metrics = make(map[string]float64, len(p.Metrics))
		for k, v := range p.Metrics {
			if f, ok := number(v); ok {
				ev.Metrics[k] = f
			}
		}
	}
	if p.Alert != nil {
		ev.Kind = policy.KindAlert
		ev.Status = p.Alert.Status
		ev.Labels = p.Alert.Labels
		return ev, nil
	}
	t := p.Type
	if t == "" {
		t = r.EventType
	}
	ev.Kind = "webhook." + t
	return ev, nil
}

// number reads a JSON metric as a float; strings holding numbers count
// (Alertmanager annotations are strings).
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, !math.IsNaN(x) && !math.IsInf(x, 0)
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		return f, err == nil && !math.IsNaN(f) && !math.IsInf(f, 0)
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}
