package direct

import (
	"context"
	"fmt"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
)

// FollowMove is the pipeline stage that makes the direct path's vGPUs
// follow their instance: a compute service forced down and up again
// (handleService, handleHostDown: the evacuation), the halves of host
// maintenance (handleMaintenance) and Nova's moves (handleMove). Any
// other event goes on to the next stage.
func (p *Path) FollowMove() pipeline.Stage { return followMove{p} }

type followMove struct{ p *Path }

// Exec implements pipeline.Stage.
func (s followMove) Exec(ctx context.Context, w *pipeline.Work) (bool, error) {
	if handled, err := s.p.handleService(ctx, w); err != nil || handled {
		return handled, err
	}
	outbox, handled, err := s.p.handleHostDown(ctx, w, w.Event)
	if err != nil || handled {
		w.Outbox = w.Outbox || outbox
		return handled, err
	}
	outbox, handled, err = s.p.handleMaintenance(ctx, w, w.Event)
	if err != nil || handled {
		w.Outbox = w.Outbox || outbox
		return handled, err
	}
	outbox, handled, err = s.p.handleMove(ctx, w, w.Event)
	if err != nil {
		return false, fmt.Errorf("follow the move of %s: %w", w.Row.InstanceUUID, err)
	}
	w.Outbox = w.Outbox || outbox
	return handled, nil
}
