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
func AttachCommands(a flow.Attachment, requestID string, issued, expires time.Time) ([]protocol.Command, error) {
	c, err := pipeline.NewCommand(protocol.AttachVGPU, a.Host, requestID, a.InstanceUUID,
		protocol.AttachParams{MdevUUID: a.ID.String(), ParentPCI: a.PCIAddress, TypeID: a.TypeID, Mode: a.Mode, FrameRateLimit: a.FrameRateLimit},
		issued, expires)
	if err != nil {
		return nil, fmt.Errorf("attach command for %s: %w", a.ID, err)
	}
	return []protocol.Command{c}, nil
}

// ReleaseCommands take an attachment back: detach_vgpu (unless the domain
// is gone), then remove_mdev.
func ReleaseCommands(a flow.Attachment, removeOnly bool, requestID string, issued, expires time.Time) ([]protocol.Command, error) {
	var out []protocol.Command
	mdev := a.ID.String()
	if !removeOnly {
		mode := a.Mode
		if mode == "" {
			mode = protocol.ModeLive
		}
		c, err := pipeline.NewCommand(protocol.DetachVGPU, a.Host, requestID, a.InstanceUUID,
			protocol.AttachParams{MdevUUID: mdev, Mode: mode}, issued, expires)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	c, err := pipeline.NewCommand(protocol.RemoveMdev, a.Host, requestID, a.InstanceUUID,
		protocol.MdevParams{MdevUUID: mdev}, issued, expires)
	if err != nil {
		return nil, err
	}
	return append(out, c), nil
}
