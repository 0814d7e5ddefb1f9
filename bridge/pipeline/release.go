package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/failpoint"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// A transaction that gives vGPUs' claims back to Placement (an agent's
// result, a deadline, a Nova-path step, a failed event) records each
// release in it (ReleaseFor: planned_releases) and commits; the releases
// are then made with no transaction open, and one short statement deletes
// the rows Placement gave back (releasePlanned). A crash between any two
// steps leaves the rows, which the sweep (sweepReleases) makes once their
// lease ran out; a release made already counts as done (held_after).

const (
	// releaseLease is how long the process that committed a planned
	// release has to make it before the sweep of any replica may.
	releaseLease = time.Minute
	// releaseSweep is how often the sweep looks for planned releases
	// whose lease ran out.
	releaseSweep = 15 * time.Second
)

// txBeginner is a pool or a connection.
type txBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Tx is a transaction of the pipeline (InTx, HandleResult, a decision):
// the releases planned in it (ReleaseFor) are made once it committed.
type Tx struct {
	pgx.Tx
	releases []flow.Attachment
}

// ReleaseFor plans to give attachment a's claim back to Placement: it is
// recorded in tx, a transaction of the pipeline (InTx, HandleResult's,
// a decision's Work.Tx), and made once tx committed.
func ReleaseFor(ctx context.Context, tx pgx.Tx, a flow.Attachment) error {
	ptx, ok := tx.(*Tx)
	if !ok {
		return fmt.Errorf("release of attachment %s planned outside a pipeline transaction (InTx)", a.ID)
	}
	if err := requests.PlanRelease(ctx, ptx.Tx, a, releaseLease); err != nil {
		return err
	}
	ptx.releases = append(ptx.releases, a)
	return nil
}

// inTx runs fn in a transaction of db, then makes the Placement releases
// fn planned (ReleaseFor), with no transaction open.
func (p *Processor) inTx(ctx context.Context, db txBeginner, fn func(ctx context.Context, tx pgx.Tx) error) error {
	var planned []flow.Attachment
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		ptx := &Tx{Tx: tx}
		err := fn(ctx, ptx)
		planned = ptx.releases
		return err
	})
	if err != nil {
		return err
	}
	p.releasePlanned(ctx, planned)
	return nil
}

// releasePlanned makes the committed planned releases rel in Placement
// and deletes those it made. A release that fails stays planned, with
// its error, for the sweep: the transaction that planned it committed,
// so its caller is not failed for it.
func (p *Processor) releasePlanned(ctx context.Context, rel []flow.Attachment) {
	if len(rel) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx) // committed: see it through
	failpoint.Hit(FailBeforePlacement)
	done := make([]uuid.UUID, 0, len(rel))
	for _, a := range rel {
		if err := p.d.Placement.ReleaseUnits(ctx, a.InstanceUUID, a.Provider, a.Class, max(a.Amount, 1), a.HeldAfter); err != nil {
			p.log.Warn("pipeline: a planned release failed; the sweep tries again", "attachment", a.ID, logkey.Instance, a.InstanceUUID,
				logkey.Provider, a.Provider, logkey.Err, err)
			if err := requests.ReleaseFailed(ctx, p.d.Pool, a.ID, err.Error(), releaseLease); err != nil {
				p.log.Warn("pipeline: cannot record a failed release", "attachment", a.ID, logkey.Err, err)
			}
			continue
		}
		done = append(done, a.ID)
	}
	failpoint.Hit(FailAfterPlacement)
	if err := requests.ReleasesDone(ctx, p.d.Pool, done); err != nil {
		// Made again by the sweep, where it counts as done.
		p.log.Warn("pipeline: cannot record releases made; the sweep finds them done", logkey.Err, err)
	}
}

// SweepReleases makes the planned releases whose lease ran out (their
// process crashed before making them, or Placement failed them), a
// batch at a time; replicas take different ones. It returns how many it
// took.
func (p *Processor) SweepReleases(ctx context.Context) (int, error) {
	n := 0
	for {
		rel, err := requests.LeaseReleases(ctx, p.d.Pool, 32, releaseLease)
		if err != nil {
			return n, err
		}
		if len(rel) == 0 {
			return n, nil
		}
		p.log.Info("pipeline: making planned releases a process left", "count", len(rel))
		p.releasePlanned(ctx, rel)
		n += len(rel)
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
	}
}

// runReleaseSweep runs SweepReleases at start and every releaseSweep
// until ctx ends.
func (p *Processor) runReleaseSweep(ctx context.Context) {
	t := time.NewTicker(releaseSweep)
	defer t.Stop()
	for {
		if _, err := p.SweepReleases(ctx); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
			p.log.Warn("pipeline: release sweep failed", logkey.Err, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
