package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/failpoint"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
)

// A transaction that gives vGPUs' claims back to Placement (an agent's
// result, a deadline, a Nova-path step, a failed event) records each
// release in it (ReleaseFor: planned_releases) and, where a request ends
// with them, the end it takes (Finish: planned_finishes), and commits; the
// request is not final yet. The releases are then made with no
// transaction open, and a second short transaction deletes the rows
// Placement gave back and ends the requests that waited on them
// (releaser.made): a request seen final has its units back. A crash
// between any two steps leaves the rows, which the sweep (releaser.sweep)
// makes once their lease ran out; a release made already counts as done
// (held_after), and the end is made once (its row locked and deleted with
// the request's final transition).

const (
	// releaseLease is how long the process that committed a planned
	// release has to make it before the sweep of any replica may.
	releaseLease = time.Minute
	// releaseSweep is how often the sweep looks for planned releases
	// whose lease ran out.
	releaseSweep = 15 * time.Second
)

// releaser makes the Placement releases the pipeline's transactions plan
// (ReleaseFor) once they committed, and sweeps up those a crash or
// Placement left.
type releaser struct {
	pl    Placement
	pool  *pgxpool.Pool
	store *requests.Store // the requests' final transitions
	log   *slog.Logger
}

// txBeginner is a pool or a connection.
type txBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// plannedTx is a transaction of the pipeline (InTx, HandleResult, a decision):
// the releases planned in it (ReleaseFor) are made once it committed.
type plannedTx struct {
	pgx.Tx
	releases []flow.Attachment
}

// ReleaseFor plans to give attachment a's claim back to Placement: it is
// recorded in tx, a transaction of the pipeline (InTx, HandleResult's,
// a decision's Work.Tx), and made once tx committed.
func ReleaseFor(ctx context.Context, tx pgx.Tx, a flow.Attachment) error {
	ptx, ok := tx.(*plannedTx)
	if !ok {
		return fmt.Errorf("release of attachment %s planned outside a pipeline transaction (InTx)", a.ID)
	}
	if err := requests.PlanRelease(ctx, ptx.Tx, a, releaseLease); err != nil {
		return err
	}
	ptx.releases = append(ptx.releases, a)
	return nil
}

// Finish ends request reqID in the final state to (succeeded, failed)
// with reason and code, in tx, a transaction of the pipeline. When tx
// planned releases (ReleaseFor), the end is only recorded
// (planned_finishes): the request ends in the transaction that records
// the releases made, so that a client who sees it final finds the units
// back in Placement. Otherwise it ends in tx.
func Finish(ctx context.Context, tx pgx.Tx, store *requests.Store, reqID uuid.UUID, to requests.State, reason, code string) error {
	ptx, ok := tx.(*plannedTx)
	if !ok || len(ptx.releases) == 0 {
		_, err := store.Transition(ctx, tx, reqID, to, "", reason, code)
		return err
	}
	ids := make([]uuid.UUID, len(ptx.releases))
	for i, a := range ptx.releases {
		ids[i] = a.ID
	}
	return requests.PlanFinish(ctx, ptx.Tx, requests.Finish{Request: reqID, State: to, Reason: reason, Code: code}, ids)
}

// FinishNoted ends request reqID succeeded with reason, as Finish does,
// after its attachments were marked attached (requests.MarkAttachedNoted,
// n) in tx. Where tx planned no release, the request ends in one
// statement with its notification (from n) and the event of change c
// (RecordChange) when c is set; otherwise c is recorded and the end
// planned as Finish does.
func FinishNoted(ctx context.Context, tx pgx.Tx, store *requests.Store, reqID uuid.UUID, reason string, n requests.Noted, c *Change) error {
	if ptx, ok := tx.(*plannedTx); ok && len(ptx.releases) > 0 {
		if c != nil {
			if err := RecordChange(ctx, tx, *c); err != nil {
				return err
			}
		}
		return Finish(ctx, tx, store, reqID, requests.Succeeded, reason, "")
	}
	var ev *requests.Event
	if c != nil {
		e, err := changeEvent(ctx, tx, *c)
		if err != nil {
			return err
		}
		ev = e
	}
	_, err := store.SucceedNoted(ctx, tx, reqID, reason, n, ev)
	return err
}

// inTx runs fn in a transaction of db, then makes the Placement releases
// fn planned (ReleaseFor), with no transaction open.
func (r releaser) inTx(ctx context.Context, db txBeginner, fn func(ctx context.Context, tx pgx.Tx) error) error {
	var planned []flow.Attachment
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		ptx := &plannedTx{Tx: tx}
		err := fn(ctx, ptx)
		planned = ptx.releases
		return err
	})
	if err != nil {
		return err
	}
	r.made(ctx, planned)
	return nil
}

// made makes the committed planned releases rel in Placement, then, in
// one short transaction, deletes those it made and ends the requests
// that waited on them (finish). A release that fails stays planned, with
// its error, for the sweep, and so does the end of its request: the
// transaction that planned it committed, so its caller is not failed for
// it.
func (r releaser) made(ctx context.Context, rel []flow.Attachment) {
	if len(rel) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx) // committed: see it through
	failpoint.Hit(FailBeforePlacement)
	done := make([]uuid.UUID, 0, len(rel))
	for _, a := range rel {
		if err := r.pl.ReleaseUnits(ctx, a.InstanceUUID, a.Provider, a.Class, a.PlacementUnits(), a.HeldAfter); err != nil {
			r.log.Warn("pipeline: a planned release failed; the sweep tries again", "attachment", a.ID, logkey.Instance, a.InstanceUUID,
				logkey.Provider, a.Provider, logkey.Err, err)
			if err := requests.ReleaseFailed(ctx, r.pool, a.ID, err.Error(), releaseLease); err != nil {
				r.log.Warn("pipeline: cannot record a failed release", "attachment", a.ID, logkey.Err, err)
			}
			continue
		}
		done = append(done, a.ID)
	}
	failpoint.Hit(FailAfterPlacement)
	if len(done) == 0 {
		return
	}
	if err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if err := requests.ReleasesDone(ctx, tx, done); err != nil {
			return err
		}
		_, err := r.finish(ctx, tx, done)
		return err
	}); err != nil {
		// Made again by the sweep, where it counts as done.
		r.log.Warn("pipeline: cannot record releases made; the sweep finds them done", logkey.Err, err)
	}
}

// finish ends, in tx, the requests whose planned end (Finish) no planned
// release holds up any more; with made set, only those that waited on
// one of these releases. A request ended already another way (its
// transition refused) keeps its end. It returns how many it ended.
func (r releaser) finish(ctx context.Context, tx pgx.Tx, made []uuid.UUID) (int, error) {
	ready, err := requests.ReadyFinishes(ctx, tx, made, 64)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, f := range ready {
		_, err := r.store.Transition(ctx, tx, f.Request, f.State, "", f.Reason, f.Code)
		switch {
		case errors.Is(err, requests.ErrIllegal):
			r.log.Warn("pipeline: a request ended another way before its releases were made", logkey.RequestID, f.Request, "want", f.State, logkey.Err, err)
		case err != nil:
			return n, err
		default:
			n++
		}
		if err := requests.DropFinish(ctx, tx, f.Request); err != nil {
			return n, err
		}
	}
	return n, nil
}

// sweep makes the planned releases whose lease ran out (their
// process crashed before making them, or Placement failed them), a
// batch at a time; replicas take different ones. Then it ends the
// requests no planned release holds up (a crash, or two replicas that
// each recorded one of a request's releases at once). It returns how
// many releases it took.
func (r releaser) sweep(ctx context.Context) (int, error) {
	n := 0
	for {
		rel, err := requests.LeaseReleases(ctx, r.pool, 32, releaseLease)
		if err != nil {
			return n, err
		}
		if len(rel) == 0 {
			break
		}
		r.log.Info("pipeline: making planned releases a process left", "count", len(rel))
		r.made(ctx, rel)
		n += len(rel)
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
	}
	for {
		var ended int
		if err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) (err error) {
			ended, err = r.finish(ctx, tx, nil)
			return err
		}); err != nil {
			return n, fmt.Errorf("end requests whose releases were made: %w", err)
		}
		if ended == 0 || ctx.Err() != nil {
			return n, ctx.Err()
		}
	}
}

// run sweeps at start and every releaseSweep
// until ctx ends.
func (r releaser) run(ctx context.Context) {
	wake.Loop(ctx, nil, func(ctx context.Context) (time.Duration, error) { //nolint:errcheck // the round never fails
		if _, err := r.sweep(ctx); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
			r.log.Warn("pipeline: release sweep failed", logkey.Err, err)
		}
		return releaseSweep, nil
	})
}
