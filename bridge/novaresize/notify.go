package novaresize

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

// event follows a Nova notification into the resize of its instance.
// handled is true when the event belonged to a bridge resize (the policy
// does not see it); outbox when a command was queued.
func (p *Path) event(ctx context.Context, w *pipeline.Work) (handled, outbox bool, err error) {
	defer wrapErr(&err, "event %d of instance %s", w.Row.ID, w.Row.InstanceUUID)
	tx, row := w.Tx, w.Row
	if row.Webhook() || row.InstanceUUID == "" {
		return false, false, nil
	}
	et := row.EventType
	finish := et == "instance.resize_finish.end"
	novaErr := et == "compute_task.migrate_server.error" || (strings.HasPrefix(et, "instance.resize") && strings.HasSuffix(et, ".error"))
	confirmed := et == "instance.resize_confirm.end"
	reverted := et == "instance.resize_revert.end"
	if !finish && !novaErr && !confirmed && !reverted {
		return false, false, nil
	}
	if p.nova == nil {
		return false, false, p.tenantResize(ctx, w, finish)
	}
	r, ok, err := lockResize(ctx, tx, `r.instance_uuid = $1 AND r.step <> 'done'`, false, row.InstanceUUID)
	if err != nil {
		return false, false, err
	}
	if !ok {
		return false, false, p.tenantResize(ctx, w, finish)
	}
	pl := decodeNovaPayload(row.Payload)
	if err := p.auditNova(ctx, tx, r, "nova_event", map[string]any{"event_type": et, "event_id": row.ID, "step": r.Step}); err != nil {
		return false, false, err
	}
	switch {
	case finish && (r.Step == stepResize || r.Step == stepResizing):
		host := pl.host
		if host == "" {
			host = r.SourceHost
		}
		if r.RequestState.Final() {
			r.TargetHost = host
			return true, false, p.startRevert(ctx, tx, r, flow.CodeNovaFailed, "the request ended while Nova resized")
		}
		if r.FlavorName == "" {
			r.FlavorName = pl.flavor
			if err := requests.SetResizeFlavorName(ctx, tx, r.RequestID, pl.flavor); err != nil {
				return false, false, err
			}
		}
		outbox, err := p.finished(ctx, tx, r, host)
		return true, outbox, err
	case novaErr && (r.Step == stepResize || r.Step == stepResizing):
		why := pl.reason
		if why == "" {
			why = "no reason given"
		}
		return true, false, p.finishFailed(ctx, tx, r, flow.CodeNovaFailed,
			fmt.Sprintf("Nova could not resize instance %s to flavor %s (%s): %s", r.Instance, cmp.Or(r.FlavorName, "?"), et, why))
	case confirmed && (r.Step == stepConfirm || r.Step == stepConfirming):
		return true, false, p.finishSucceeded(ctx, tx, r, "Nova confirmed the resize")
	case reverted && (r.Step == stepRevert || r.Step == stepReverting):
		return true, false, p.finishFailed(ctx, tx, r, cmp.Or(r.FailCode, flow.CodeVerifyFailed), r.FailReason+"; Nova reverted the resize")
	case novaErr && (r.Step == stepConfirm || r.Step == stepConfirming || r.Step == stepRevert || r.Step == stepReverting):
		return true, false, p.finishFailed(ctx, tx, r, flow.CodeNovaFailed,
			fmt.Sprintf("Nova failed while %s the resize of instance %s (%s): %s", map[bool]string{true: "confirming", false: "reverting"}[r.Step == stepConfirm || r.Step == stepConfirming],
				r.Instance, et, cmp.Or(pl.reason, "no reason given")))
	}
	return true, false, nil // a late or repeated notification of this resize
}

type novaPayload struct {
	host, flavor, reason string
	vgpus                int
	traits               []string
}

// decodeNovaPayload reads what the Nova path needs of an event's payload
// (a nova_object): the host, the flavor's name and vGPU demand, and the
// reason of a compute task's error or the instance's fault.
func decodeNovaPayload(raw json.RawMessage) novaPayload {
	var out novaPayload
	var o nova.Object
	if json.Unmarshal(raw, &o) != nil {
		return out
	}
	pl, _ := nova.DecodeObject(o)
	exc := func(e *nova.Exception) string {
		if e == nil {
			return ""
		}
		// Remote exceptions carry the traceback after the message.
		msg, _, _ := strings.Cut(strings.TrimSpace(e.ExceptionMessage), "\n")
		if msg = strings.TrimSpace(msg); msg != "" && e.Exception != "" {
			return e.Exception + ": " + msg
		}
		return e.Exception + msg
	}
	switch x := pl.(type) {
	case *nova.InstanceAction:
		if x.Host != nil {
			out.host = *x.Host
		}
		if x.Flavor != nil {
			out.flavor = x.Flavor.Name
			if d, err := nova.ParseExtraSpecs(x.Flavor.ExtraSpecs); err == nil {
				out.vgpus = d.VGPUs()
				for _, g := range d.VGPUGroups() {
					out.traits = append(out.traits, g.Required...)
				}
			}
		}
		out.reason = exc(x.Fault)
	case *nova.ComputeTask:
		out.reason = exc(x.Reason)
	}
	return out
}

// tenantResize records a resize to a vGPU flavor the bridge did not ask
// for (a tenant's): the instance's vGPU demand is in instances (ingest);
// this records it in the audit log and, before the policy sees the event,
// waits (pipeline.Retry) until the host's agent reports the vGPU, so the
// policy's tuning intents know its physical GPU.
func (p *Path) tenantResize(ctx context.Context, w *pipeline.Work, finish bool) (err error) {
	defer wrapErr(&err, "record the resize of instance %s", w.Row.InstanceUUID)
	tx, row := w.Tx, w.Row
	if !finish {
		return nil
	}
	pl := decodeNovaPayload(row.Payload)
	if pl.vgpus == 0 {
		return nil
	}
	v, reported, err := pipeline.ReportedVGPU(ctx, tx, p.catalog, row.InstanceUUID, pl.host)
	if err != nil {
		return err
	}
	if reported && v.GPU == "" && !w.LastAttempt() {
		return pipeline.Retry(fmt.Errorf("instance %s was resized to vGPU flavor %s on host %s: waiting for its agent to report the vGPU", row.InstanceUUID, pl.flavor, pl.host))
	}
	d, _ := json.Marshal(map[string]any{"event_id": row.ID, "event_type": row.EventType, "flavor": pl.flavor, "vgpus": pl.vgpus,
		"traits": pl.traits, "host": pl.host, "gpu": v.GPU, "profile": v.Profile, "nova_request_id": row.RequestID})
	return requests.Audit(ctx, tx, requests.Entry{Actor: p.actor(), Action: "vgpu_recorded", ObjectType: "instance",
		ObjectID: row.InstanceUUID, Detail: d})
}
