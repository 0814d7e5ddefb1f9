package direct

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
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
