package requests

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
)

// notifyTransition queues the bridge's notification of a request's move
// (package notify), in the transaction of the move: vgpu.OP.start when it
// is decided, vgpu.OP.end when it succeeds, vgpu.request.error when it
// fails or is rejected. OP is attach (it gives the instance vGPUs),
// detach (it takes them back) or resize (both, or a Nova resize between
// two vGPU flavors); a request that changes no vGPU sends only its error.
//
// pre is what move read for it with the move itself.
func notifyTransition(ctx context.Context, tx pgx.Tx, from State, r Request, pre *notePrefetch) error {
	it, err := transitionNote(ctx, tx, from, r, pre)
	if err != nil || it == nil {
		return err
	}
	return notify.Queue(ctx, tx, it.EventType, it.Priority, it.Payload)
}

// transitionNote is the notification notifyTransition queues, or nil.
func transitionNote(ctx context.Context, tx pgx.Tx, from State, r Request, pre *notePrefetch) (*notify.Item, error) {
	var phase string
	prio := notify.Info
	switch {
	case from == Accepted && r.State == Decided:
		phase = "start"
	case r.State == Succeeded:
		phase = "end"
	case r.State == Failed || r.State == Rejected:
		prio = notify.Error
	default:
		return nil, nil
	}
	p, op, err := actionPayload(ctx, tx, r, pre)
	if err != nil {
		return nil, fmt.Errorf("notification of request %s: %w", r.ID, err)
	}
	event := notify.RequestError
	if phase != "" {
		if op == "" {
			return nil, nil
		}
		event = "vgpu." + op + "." + phase
	}
	return &notify.Item{EventType: event, Priority: prio, Payload: notify.Action(p)}, nil
}

// notePrefetch is what a transition's notification says of the
// instance (its project and user) and of the vGPUs the request makes or
// takes back, read by the statement that moves the request (move): a
// JSON array of objects, NULL when the move notifies nothing.
type notePrefetch struct {
	project, user string
	vgpus         []byte
}

// noteVGPU is one element of notePrefetch.vgpus.
type noteVGPU struct {
	New      *bool  `json:"new"` // null: the attachment names no request (not listed)
	ID       string `json:"id"`
	Profile  string `json:"profile"`
	TypeID   string `json:"type_id"`
	Class    string `json:"class"`
	Amount   int    `json:"amount"`
	Host     string `json:"host"`
	Provider string `json:"provider"`
	PCI      string `json:"pci"`
	State    string `json:"state"`
}

// actionPayload describes request r and the vGPUs it changes, from pre;
// op is attach, detach, resize or "" (none).
func actionPayload(ctx context.Context, tx pgx.Tx, r Request, pre *notePrefetch) (notify.ActionPayload, string, error) {
	p := notify.ActionPayload{RequestID: r.ID.String(), RequestKind: r.Kind, Source: r.Source, State: string(r.State),
		Code: r.Code, Reason: r.Reason, ProjectID: pre.project, UserID: pre.user}
	if r.InstanceUUID != nil {
		p.InstanceUUID = r.InstanceUUID.String()
	}
	var vs []noteVGPU
	if len(pre.vgpus) > 0 {
		if err := json.Unmarshal(pre.vgpus, &vs); err != nil {
			return p, "", fmt.Errorf("the vGPUs of request %s: %w", r.ID, err)
		}
	}
	for _, a := range vs {
		if a.New == nil {
			continue
		}
		v := notify.VGPU{AttachmentID: a.ID, Profile: a.Profile, VGPUType: a.TypeID, ResourceClass: a.Class, Amount: a.Amount, Host: a.Host,
			ProviderUUID: a.Provider, PCIAddress: a.PCI, State: a.State}
		if *a.New {
			p.VGPUs = append(p.VGPUs, v)
		} else {
			p.OldVGPUs = append(p.OldVGPUs, v)
		}
	}
	if len(p.VGPUs)+len(p.OldVGPUs) > 0 {
		p.Path = "direct"
		switch {
		case len(p.VGPUs) > 0 && len(p.OldVGPUs) > 0:
			return p, "resize", nil
		case len(p.VGPUs) > 0:
			return p, "attach", nil
		}
		return p, "detach", nil
	}
	// The Nova path: a resize to (or from) a vGPU flavor.
	var kind, profile, typeID, host, flavor, oldFlavor string
	var count int
	err := tx.QueryRow(ctx, `SELECT kind, coalesce(profile,''), coalesce(type_id,''), count, coalesce(target_host, source_host, ''),
			coalesce(flavor_name,''), coalesce(old_flavor,'') FROM nova_resizes WHERE request_id = $1`, r.ID).
		Scan(&kind, &profile, &typeID, &count, &host, &flavor, &oldFlavor)
	if err == pgx.ErrNoRows {
		return p, "", nil
	}
	if err != nil {
		return p, "", err
	}
	p.Path, p.Flavor, p.OldFlavor = "nova", flavor, oldFlavor
	if kind == "release" {
		return p, "detach", nil
	}
	p.VGPUs = []notify.VGPU{{Profile: profile, VGPUType: typeID, ResourceClass: "VGPU", Amount: count, Host: host}}
	if kind == "resize" {
		return p, "resize", nil
	}
	return p, "attach", nil
}
