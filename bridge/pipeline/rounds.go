package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/internal/failpoint"
)

// errNeedRelease stops a transaction that needs a Placement release it has
// not made yet (rounds makes it, then runs the transaction again).
var errNeedRelease = errors.New("the transaction needs a Placement release made first")

// maxReleaseRounds bounds the rounds of one transaction that releases.
const maxReleaseRounds = 8

// txBeginner is a pool or a connection.
type txBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// rounds runs fn in a transaction of db until it no longer stops for a
// Placement release (errNeedRelease): between two rounds, with no
// transaction open, it makes the releases the last round asked for
// (ReleaseFor). Decisions do not run in rounds (decideLocked); an agent's
// result, a deadline and a Nova-path step that give units back do.
func (p *Processor) rounds(ctx context.Context, db txBeginner, fn func(ctx context.Context, tx pgx.Tx) error) error {
	pc, _ := ctx.Value(roundReleasesKey{}).(*roundReleases)
	if pc == nil {
		pc = &roundReleases{}
		ctx = context.WithValue(ctx, roundReleasesKey{}, pc)
	}
	for round := 1; ; round++ {
		pc.needRelease = nil
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return fn(ctx, tx) })
		if !errors.Is(err, errNeedRelease) || round >= maxReleaseRounds {
			return err
		}
		failpoint.Hit(FailBeforePlacement)
		for _, a := range pc.needRelease { // no transaction is open here
			if err := p.d.Placement.ReleaseUnits(ctx, a.InstanceUUID, a.Provider, a.Class, a.Amount, a.HeldAfter); err != nil {
				return errRetry{fmt.Errorf("release attachment %s (%d %s on %s): %w", a.ID, a.Amount, a.Class, a.Provider, err)}
			}
			if pc.released == nil {
				pc.released = map[uuid.UUID]bool{}
			}
			pc.released[a.ID] = true
		}
		failpoint.Hit(FailAfterPlacement)
	}
}

// ReleaseFor gives back attachment a's claim in Placement, in a
// transaction of rounds (InTx, HandleResult): a release made before this
// round counts as done; else it is recorded as needed and the round stops
// (its error is returned: pass it on), to run again once it is made.
func ReleaseFor(ctx context.Context, a flow.Attachment) error {
	pc := roundReleasesIn(ctx)
	if pc.released[a.ID] {
		return nil
	}
	pc.needRelease = append(pc.needRelease, a)
	return errNeedRelease
}

// roundReleases are the releases made for one transaction between its
// rounds.
type roundReleases struct {
	needRelease []flow.Attachment  // releases the last round stopped for
	released    map[uuid.UUID]bool // attachments whose claim was given back
}

type roundReleasesKey struct{}

// roundReleasesIn returns the releases of the rounds ctx runs in. A
// Placement release is only ever asked for inside rounds: anything else
// is a bug.
func roundReleasesIn(ctx context.Context) *roundReleases {
	pc, _ := ctx.Value(roundReleasesKey{}).(*roundReleases)
	if pc == nil {
		panic("pipeline: a Placement release asked for outside rounds")
	}
	return pc
}
