package requests

import (
	"context"
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
func notifyTransition(ctx context.Context, tx pgx.Tx, from State, r Request) error {
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
		return nil
	}
	p, op, err := actionPayload(ctx, tx, r)
	if err != nil {
		return fmt.Errorf("notification of request %s: %w", r.ID, err)
	}
	event := notify.RequestError
	if phase != "" {
		if op == "" {
			return nil
		}
		event = "vgpu." + op + "." + phase
	}
	return notify.Queue(ctx, tx, event, prio, notify.Action(p))
}

// actionPayload describes request r and the vGPUs it changes; op is
// attach, detach, resize or "" (none).
func actionPayload(ctx context.Context, tx pgx.Tx, r Request) (notify.ActionPayload, string, error) {
	p := notify.ActionPayload{RequestID: r.ID.String(), RequestKind: r.Kind, Source: r.Source, State: string(r.State),
		Code: r.Code, Reason: r.Reason}
	if r.InstanceUUID != nil {
		p.InstanceUUID = r.InstanceUUID.String()
	}
	// The instance's project and user, and the vGPUs the request makes
	// or takes back, in one statement (one row with NULL vGPU columns
	// when there are none).
	rows, err := tx.Query(ctx, `SELECT coalesce(i.project_id, ''), coalesce(i.user_id, ''), a.is_new, a.id, a.profile, a.type_id, a.class,
			a.amount, a.host, a.provider, a.pci, a.state
		FROM (SELECT 1) one LEFT JOIN instances i ON i.uuid = $2
		LEFT JOIN LATERAL (SELECT request_id = $1 AS is_new, id::text AS id, coalesce(profile,'') AS profile, coalesce(type_id,'') AS type_id,
				coalesce(resource_class,'VGPU') AS class, amount, host, coalesce(provider_uuid::text,'') AS provider,
				coalesce(pci_address,'') AS pci, state, created_at, id AS att
			FROM vgpu_attachments WHERE request_id = $1 OR release_request_id = $1) a ON true
		ORDER BY a.created_at, a.att`, r.ID, r.InstanceUUID)
	if err != nil {
		return p, "", err
	}
	var isNew *bool
	var aID, aProfile, aType, aClass, aHost, aProvider, aPCI, aState *string
	var aAmount *int
	_, err = pgx.ForEachRow(rows, []any{&p.ProjectID, &p.UserID, &isNew, &aID, &aProfile, &aType, &aClass, &aAmount, &aHost, &aProvider, &aPCI, &aState},
		func() error {
			if isNew == nil {
				return nil // no vGPU
			}
			v := notify.VGPU{AttachmentID: *aID, Profile: *aProfile, VGPUType: *aType, ResourceClass: *aClass, Amount: *aAmount, Host: *aHost,
				ProviderUUID: *aProvider, PCIAddress: *aPCI, State: *aState}
			if *isNew {
				p.VGPUs = append(p.VGPUs, v)
			} else {
				p.OldVGPUs = append(p.OldVGPUs, v)
			}
			return nil
		})
	if err != nil {
		return p, "", err
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
	err = tx.QueryRow(ctx, `SELECT kind, coalesce(profile,''), coalesce(type_id,''), count, coalesce(target_host, source_host, ''),
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
