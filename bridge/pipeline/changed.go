package pipeline

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
)

// After every change of an instance's vGPUs the bridge made (an attach,
// a profile change, a release, on the direct or the Nova path, or a
// direct-path vGPU that followed a move), the request that made it writes
// an event of its own into the inbox, in the transaction that ends it:
// source "bridge", type "vgpu_changed", policy kind bridge.vgpu_changed.
// Rules on it tune the GPU and set the VM's limits with the vGPU and its
// physical GPU known, which a rule on the request itself cannot (the GPU
// is chosen later). They may not change vGPUs: that would loop.

// BridgeSource is the inbox source of the bridge's own events.
const BridgeSource = "bridge"

// BridgeKindPrefix starts the policy kind of the bridge's own events.
const BridgeKindPrefix = "bridge."

// EventVGPUChanged is the type of the event written after a change.
const EventVGPUChanged = "vgpu_changed"

// KindVGPUChanged is its policy kind.
const KindVGPUChanged = BridgeKindPrefix + EventVGPUChanged

// Changes (Change.Change, the event's labels.change).
const (
	ChangeAttach  = "attach"
	ChangeResize  = "resize"
	ChangeRelease = "release"
	ChangeMove    = "move"
)

// Paths (Change.Path, the event's labels.path).
const (
	PathDirect = "direct"
	PathNova   = "nova"
)

// Change is what a request changed, as its bridge.vgpu_changed event
// says.
type Change struct {
	Request  uuid.UUID `json:"request_id"`
	Instance string    `json:"instance_uuid"`
	Change   string    `json:"change"`            // attach, resize, release, move
	Path     string    `json:"path"`              // direct, nova
	Profile  string    `json:"profile,omitempty"` // the vGPU's profile now ("" after a release)
	Host     string    `json:"host,omitempty"`
	// Workload is the workload the request named (training, rendering …).
	Workload string `json:"workload,omitempty"`
	// WorkloadRead: Workload is what the request named, "" included
	// (RecordChange need not read it).
	WorkloadRead bool `json:"-"`
	// Unheard: no rule of the policy listens to bridge.vgpu_changed, so
	// the event is written processed (the pipeline would decide nothing).
	Unheard bool `json:"-"`
}

// RecordChange writes c's bridge.vgpu_changed event into the inbox in
// tx (once per request: a repeated call writes nothing). The workload,
// when empty, is read from the request's body.
func RecordChange(ctx context.Context, tx pgx.Tx, c Change) error {
	e, err := changeEvent(ctx, tx, c)
	if err != nil || e == nil {
		return err
	}
	if err := requests.QueueEvent(ctx, tx, *e); err != nil {
		return fmt.Errorf("request %s: record the change of instance %s: %w", c.Request, c.Instance, err)
	}
	return nil
}

// changeEvent is the inbox event RecordChange writes for c; nil when none.
func changeEvent(ctx context.Context, tx pgx.Tx, c Change) (*requests.Event, error) {
	if c.Instance == "" {
		return nil, nil
	}
	if c.Workload == "" && !c.WorkloadRead {
		if err := tx.QueryRow(ctx, `SELECT coalesce(body->>'workload', '') FROM requests WHERE id = $1`, c.Request).Scan(&c.Workload); err != nil {
			return nil, fmt.Errorf("request %s: read workload: %w", c.Request, err)
		}
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return &requests.Event{Source: BridgeSource, MessageID: EventVGPUChanged + ":" + c.Request.String(),
		Type: EventVGPUChanged, Instance: c.Instance, Payload: b, Processed: c.Unheard}, nil
}

// mapBridgeEvent maps a bridge event to the policy's: kind
// bridge.<type>; the profile it left; labels change, path and
// request_id.
func mapBridgeEvent(r InboxRow, ev policy.Event) (policy.Event, error) {
	if r.EventType == EventVGPULoad {
		return mapLoadEvent(r, ev)
	}
	if r.EventType == requests.EventGPUFault {
		var f requests.GPUFaultEvent
		if err := json.Unmarshal(r.Payload, &f); err != nil {
			return ev, fmt.Errorf("event %d: GPU fault payload: %w", r.ID, err)
		}
		ev.Kind, ev.Source = policy.KindGPUFault, BridgeSource
		ev.Labels = map[string]string{"gpu": f.PCIAddress, "provider_uuid": f.ProviderUUID, "host": f.Host,
			"fault_source": f.Source, "reason": f.Reason}
		if f.Xid != 0 {
			ev.Labels["xid"] = fmt.Sprint(f.Xid)
		}
		return ev, nil
	}
	ev.Kind, ev.Source = BridgeKindPrefix+r.EventType, BridgeSource
	if r.EventType == EventHostDown {
		return ev, nil // package direct reads its payload (hostdown.go)
	}
	var c Change
	if err := json.Unmarshal(r.Payload, &c); err != nil {
		return ev, fmt.Errorf("event %d: bridge event payload: %w", r.ID, err)
	}
	ev.Profile, ev.Workload = c.Profile, c.Workload
	ev.Labels = map[string]string{"change": c.Change, "path": c.Path, "request_id": c.Request.String()}
	if c.Host != "" {
		ev.Labels["host"] = c.Host
	}
	return ev, nil
}

// onlyFollowUps keeps, of a decision on a bridge event, the intents that
// do not change vGPUs (tune, set_limits, notify); the others are refused
// with the reason, since each change would write another such event.
func onlyFollowUps(d *policy.Decision, kind string) {
	if kind != KindVGPUChanged {
		return
	}
	kept := d.Intents[:0]
	for _, in := range d.Intents {
		switch in.Kind {
		case policy.IntentAttach, policy.IntentRelease, policy.IntentResize, policy.IntentMove:
			d.Refused = append(d.Refused, policy.Refusal{Intent: in, Reason: fmt.Sprintf("rule %s: a %s event may tune, set limits or notify, "+
				"not %s vGPUs (the change would make another %s event)", in.Rule, kind, in.Kind, kind)})
		default:
			kept = append(kept, in)
		}
	}
	d.Intents = kept
}
