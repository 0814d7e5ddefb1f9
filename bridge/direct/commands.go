package direct

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// outCmd is a command of a request on its way into the outbox: its place
// among the request's commands and the attachment it is about.
type outCmd struct {
	c          protocol.Command
	seq        int
	attachment *uuid.UUID
}

func insertCommands(ctx context.Context, tx pgx.Tx, reqID uuid.UUID, purpose string, cmds []outCmd) error {
	rows, err := commandRows(reqID, cmds)
	if err != nil {
		return err
	}
	return requests.QueueCommands(ctx, tx, reqID, purpose, rows)
}

// commandRows are cmds as the outbox keeps them.
func commandRows(reqID uuid.UUID, cmds []outCmd) ([]requests.Command, error) {
	rows := make([]requests.Command, len(cmds))
	for i, oc := range cmds {
		body, err := json.Marshal(oc.c)
		if err != nil {
			return nil, fmt.Errorf("request %s: encode command %s: %w", reqID, oc.c.Kind, err)
		}
		rows[i] = requests.Command{ID: oc.c.ID, Host: oc.c.Host, Kind: string(oc.c.Kind), Body: body, ExpiresAt: oc.c.ExpiresAt,
			Seq: oc.seq, AttachmentID: oc.attachment, InstanceUUID: oc.c.InstanceUUID}
	}
	return rows, nil
}

// AttachCommands are the commands of a new attachment: one attach_vgpu
// naming the parent GPU and the type, so the agent creates the mdev, then
// attaches it, and removes it again should the attach fail (create_mdev
// remains for pre-creating devices). One command is one broker and one
// Postgres round trip fewer than create_mdev followed by attach_vgpu.
//
// On a bridge-owned mdev GPU it is the same. On a bridge-owned VF GPU
// (IsVF) it names the VF and the numeric type instead: the agent sets the VF's type (its journal records the
// attachment as the VF's owner) and hot-plugs the VF as a PCI hostdev.
func AttachCommands(a flow.Attachment, requestID string, issued, expires time.Time) ([]protocol.Command, error) {
	c, err := pipeline.NewCommand(protocol.AttachVGPU, a.Host, requestID, a.InstanceUUID, attachParams(a, a.Mode), issued, expires)
	if err != nil {
		return nil, fmt.Errorf("attach command for %s: %w", a.ID, err)
	}
	return []protocol.Command{c}, nil
}

// IsVF reports whether the attachment is a VF of a bridge-owned
// vendor-VFIO GPU: its provider's class is placement.BridgeClass or
// placement.BridgeFBClass (a bridge-owned GPU; [placement]
// bridge_owned_gpus), its type is a numeric vendor-VFIO type and its
// PCIAddress is the VF. A bridge-owned mdev GPU's attachment (an mdev type,
// nvidia-231) is an mdev like one on a GPU Nova manages: attach_vgpu names
// the GPU and the type, and the agent creates the mdev there.
func IsVF(a flow.Attachment) bool {
	return (a.Class == placement.BridgeClass || a.Class == placement.BridgeFBClass) && !placement.IsMdevType(a.TypeID)
}

// attachParams are the attach_vgpu params of a in mode.
func attachParams(a flow.Attachment, mode string) protocol.AttachParams {
	return protocol.AttachParams{MdevUUID: a.ID.String(), ParentPCI: a.PCIAddress, TypeID: a.TypeID, VendorVFIO: IsVF(a), Mode: mode,
		FrameRateLimit: a.FrameRateLimit}
}

// ReleaseCommands take an attachment back: detach_vgpu (unless the domain
// is gone), then remove_mdev. For a VF both name the VF and the
// attachment (MdevUUID): the agent clears the VF's type only while its
// journal holds the VF for this attachment, so a late or repeated release
// never clears a later owner's vGPU.
func ReleaseCommands(a flow.Attachment, removeOnly bool, requestID string, issued, expires time.Time) ([]protocol.Command, error) {
	var out []protocol.Command
	mdev := a.ID.String()
	if !removeOnly {
		mode := a.Mode
		if mode == "" {
			mode = protocol.ModeLive
		}
		c, err := pipeline.NewCommand(protocol.DetachVGPU, a.Host, requestID, a.InstanceUUID,
			release(protocol.AttachParams{MdevUUID: mdev, Mode: mode}, a), issued, expires)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	c, err := pipeline.NewCommand(protocol.RemoveMdev, a.Host, requestID, a.InstanceUUID,
		removeParams(a), issued, expires)
	if err != nil {
		return nil, err
	}
	return append(out, c), nil
}

// release adds to p, for a VF, the VF and vendor_vfio.
func release(p protocol.AttachParams, a flow.Attachment) protocol.AttachParams {
	if IsVF(a) {
		p.ParentPCI, p.VendorVFIO = a.PCIAddress, true
	}
	return p
}

// removeParams are the remove_mdev params of a: the mdev, or the VF.
func removeParams(a flow.Attachment) protocol.MdevParams {
	p := protocol.MdevParams{MdevUUID: a.ID.String()}
	if IsVF(a) {
		p.ParentPCI, p.TypeID, p.VendorVFIO = a.PCIAddress, a.TypeID, true
	}
	return p
}
