// SPDX-License-Identifier: Apache-2.0

package maintenance

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

// Nova is what the executor needs of Nova's compute API
// (computeapi.Client).
type Nova interface {
	Server(ctx context.Context, id, requestID string) (computeapi.Server, error)
	Migrate(ctx context.Context, id, host, requestID string) error
	LiveMigrate(ctx context.Context, id, host, requestID string) error
	ConfirmResize(ctx context.Context, id, requestID string) error
	Migrations(ctx context.Context, instance, requestID string) ([]computeapi.Migration, error)
}

// Placement is what the executor needs of Placement for the direct path.
type Placement interface {
	// Reserve claims the vGPUs on host under the reservation consumer
	// (nothing when it holds them already).
	Reserve(ctx context.Context, reservation, instance, host string, need []DirectVGPU) error
	// Transfer moves the reservation into the instance's consumer
	// (placement.Service.TransferReservation: safe to repeat).
	Transfer(ctx context.Context, reservation, instance string) error
	// Release gives the reservation's units back (safe to repeat).
	Release(ctx context.Context, reservation string) error
	// Restore puts the detached vGPUs' units back into the instance's
	// consumer on their source GPUs (a move that failed; the source is
	// drained, so no claim through the engine would place there).
	Restore(ctx context.Context, instance string, held []DirectVGPU) error
}

// Agents makes the direct-path halves through the pipeline (detach
// before the move, attach after it) and reports how they ended.
type Agents interface {
	// Detach detaches and removes the instance's direct-path vGPUs
	// through its host's agent, their claims given back.
	Detach(ctx context.Context, request uuid.UUID, instance string) error
	// Attach attaches vgpus on host (node), where Nova says the instance
	// is (a claim in the instance's consumer is adopted).
	Attach(ctx context.Context, request uuid.UUID, instance, host, node string, vgpus []DirectVGPU) error
	// Wait waits until the request is final: nil when it succeeded.
	Wait(ctx context.Context, request uuid.UUID) error
	// Settled waits (a while at most) until the bridge has processed
	// Nova's notification of the move's end (event type kind, since
	// then), so that it cannot be taken later for a move of the vGPU
	// attached after it.
	Settled(ctx context.Context, instance, kind string, since time.Time) error
}

// Drainer drains and undrains hosts (controls.Store).
type Drainer interface {
	DrainHost(ctx context.Context, who controls.Actor, name, reason string, drain bool, known func(string) bool) (controls.HostState, error)
}

// RunConfig are the executor's timings.
type RunConfig struct {
	// Zero fields take DefaultRunConfig's values (the options' defaults).
	Poll             time.Duration // Nova and request polls
	MigrationTimeout time.Duration // a Nova move, from the call to its end
	StepTimeout      time.Duration // a detach, an attach, a confirm
	Scan             time.Duration // how often running operations are looked for
}

// Runner drives the running operations: each VM through its plan's
// states, recorded in the Store; a restarted bridge resumes them.
type Runner struct {
	Store     *Store
	Nova      Nova
	Placement Placement
	Agents    Agents
	Drain     Drainer
	Cfg       RunConfig
	Log       *slog.Logger
	// DirectOf reads a VM's direct-path vGPUs: the attached ones, else
	// those the detach request released.
	DirectOf func(ctx context.Context, instance string, detach uuid.UUID) ([]DirectVGPU, error)

	mu      sync.Mutex
	running map[uuid.UUID]bool
	kick    wake.Waker
}

var runnerActor = controls.Actor{Name: "vgpu-bridge/maintenance"}

func (r *Runner) poll() time.Duration { return cmp.Or(r.Cfg.Poll, DefaultRunConfig().Poll) }

// Kick makes Run look for running operations now.
func (r *Runner) Kick() { r.kick.Wake() }

func (r *Runner) init() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		r.running = map[uuid.UUID]bool{}
	}
	if r.Log == nil {
		r.Log = slog.Default()
	}
}

// Run drives running operations until ctx ends.
func (r *Runner) Run(ctx context.Context) error {
	r.init()
	var wg sync.WaitGroup
	defer wg.Wait()
	scan := cmp.Or(r.Cfg.Scan, DefaultRunConfig().Scan)
	wake.Loop(ctx, r.kick.C(), func(ctx context.Context) (time.Duration, error) { //nolint:errcheck // the round never fails
		ids, err := r.Store.Running(ctx)
		if err != nil && ctx.Err() == nil {
			r.Log.Warn("maintenance: cannot list running operations", logkey.Err, err)
		}
		for _, id := range ids {
			r.mu.Lock()
			busy := r.running[id]
			r.running[id] = true
			r.mu.Unlock()
			if busy {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { r.mu.Lock(); delete(r.running, id); r.mu.Unlock() }()
				if err := r.Drive(ctx, id); err != nil && ctx.Err() == nil {
					r.Log.Error("maintenance: operation", "operation", id, logkey.Err, err)
				}
			}()
		}
		return scan, nil
	})
	return ctx.Err()
}

// Drive runs one operation to its end: its VMs (Concurrency at once; with
// StopOnFailure, no VM starts after a failure), the undrain, the finish.
func (r *Runner) Drive(ctx context.Context, id uuid.UUID) error {
	r.init()
	unlock, ok, err := r.lock(ctx, id)
	if err != nil || !ok {
		return err // another replica drives it
	}
	defer unlock()
	op, err := r.Store.Get(ctx, id)
	if err != nil {
		return err
	}
	if op.State != OpRunning {
		return nil
	}
	sem := make(chan struct{}, max(op.Options.Concurrency, 1))
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := slices.ContainsFunc(op.VMs, func(v VMStatus) bool { return v.State == Failed && v.Action != Skip })
	for _, v := range op.VMs {
		if v.State.Final() {
			continue
		}
		mu.Lock()
		stop := failed && op.Options.StopOnFailure && v.State == Pending
		mu.Unlock()
		if stop {
			if _, _, err := r.Store.Advance(ctx, runnerActor, id, v.Instance, Failed, Update{Reason: "not started: an earlier VM failed (stop on failure)"}); err != nil {
				return err
			}
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		// A slot is free: a failure of the VMs before may have come meanwhile.
		mu.Lock()
		stop = failed && op.Options.StopOnFailure && v.State == Pending
		mu.Unlock()
		if stop {
			<-sem
			if _, _, err := r.Store.Advance(ctx, runnerActor, id, v.Instance, Failed, Update{Reason: "not started: an earlier VM failed (stop on failure)"}); err != nil {
				return err
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := r.moveVM(ctx, op, v)
			if err != nil && ctx.Err() == nil {
				r.Log.Warn("maintenance: VM failed", "operation", id, logkey.Instance, v.Instance, logkey.Err, err)
				if _, _, aerr := r.Store.Advance(context.WithoutCancel(ctx), runnerActor, id, v.Instance, Failed, Update{Reason: err.Error()}); aerr != nil {
					r.Log.Error("maintenance: record the failure", "operation", id, logkey.Instance, v.Instance, logkey.Err, aerr)
				}
			}
			if err != nil {
				mu.Lock()
				failed = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if op.DrainedByOp {
		if _, err := r.Drain.DrainHost(ctx, runnerActor, op.Host, "", false, nil); err != nil && !errors.Is(err, controls.ErrNotFound) {
			return fmt.Errorf("undrain %s: %w", op.Host, err)
		}
	}
	end, err := r.Store.Finish(ctx, runnerActor, id)
	if err != nil {
		return err
	}
	r.Log.Info("maintenance: operation ended", "operation", id, logkey.Host, op.Host, "state", end.State)
	return nil
}

// lock takes the operation's session advisory lock on a connection of
// its own (no transaction stays open): one replica drives an operation.
func (r *Runner) lock(ctx context.Context, id uuid.UUID) (func(), bool, error) {
	conn, err := r.Store.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("lock operation %s: %w", id, err)
	}
	key := int64(binary.BigEndian.Uint64(id[:8]))
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, lockClass, int32(key)).Scan(&ok); err != nil || !ok {
		conn.Release()
		if err != nil {
			return nil, false, fmt.Errorf("lock operation %s: %w", id, err)
		}
		return nil, false, nil
	}
	return func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, $2)`, lockClass, int32(key)); err != nil {
			conn.Conn().Close(context.Background()) //nolint:errcheck // closing the session drops the lock
		}
		conn.Release()
	}, true, nil
}

// lockClass is the first key of the operations' advisory locks.
const lockClass int32 = 0x6d6e7432 // "mnt2"

// advance records the VM's next state.
func (r *Runner) advance(ctx context.Context, op Operation, v *VMStatus, to State, u Update) error {
	nv, _, err := r.Store.Advance(ctx, runnerActor, op.ID, v.Instance, to, u)
	if err != nil {
		return err
	}
	*v = nv
	return nil
}

// requestID is the id of a pipeline request of the VM's half: the same
// after a restart, so the half is made once.
func requestID(op uuid.UUID, instance, half string) uuid.UUID {
	return uuid.NewSHA1(op, []byte(instance+"/"+half))
}

func (r *Runner) moveVM(ctx context.Context, op Operation, v VMStatus) error {
	switch v.Action {
	case ColdMigrate, LiveMigrate:
		return r.moveNova(ctx, op, &v)
	case MoveDirect:
		return r.moveDirect(ctx, op, &v)
	}
	return r.advance(ctx, op, &v, Failed, Update{Reason: cmpStr(v.Reason, "skipped")})
}

func cmpStr(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// moveNova: the Nova path. Nova moves the vGPU of the flavor.
func (r *Runner) moveNova(ctx context.Context, op Operation, v *VMStatus) error {
	live := v.Action == LiveMigrate
	if v.State == Pending || v.State == Migrating {
		m, err := r.migrate(ctx, op, v, live)
		if err != nil {
			return err
		}
		if live {
			return r.finishLive(ctx, op, v, m)
		}
	}
	if err := r.confirm(ctx, op, v); err != nil {
		return err
	}
	return r.advance(ctx, op, v, Done, Update{})
}

// migrate starts the move (once: a VM already Migrating is looked up in
// Nova's migration records) and waits for Nova to end it: finished (a
// cold migration awaiting its confirm) or completed (a live one).
func (r *Runner) migrate(ctx context.Context, op Operation, v *VMStatus, live bool) (computeapi.Migration, error) {
	kind := "migration"
	if live {
		kind = "live-migration"
	}
	var m computeapi.Migration
	if v.State != Migrating || v.Migration == nil {
		// A restart after the call and before the record: Nova's record
		// of a move off the host since the VM's last change is taken.
		if v.State == Migrating {
			if ms, err := r.Nova.Migrations(ctx, v.Instance, ""); err == nil {
				for _, x := range ms {
					if x.Type == kind && x.SourceHost == op.Host && !createdBefore(x, v.UpdatedAt) {
						m = x
						break
					}
				}
			}
		}
		if m.UUID == "" {
			if err := r.advance(ctx, op, v, Migrating, Update{}); err != nil {
				return m, err
			}
			// Nova's records of earlier moves are not this one's.
			before, err := r.Nova.Migrations(ctx, v.Instance, "")
			if err != nil {
				return m, fmt.Errorf("read Nova's migrations: %w", err)
			}
			newest := 0
			for _, x := range before {
				newest = max(newest, x.ID)
			}
			if live {
				err = r.Nova.LiveMigrate(ctx, v.Instance, v.Target, "")
			} else {
				err = r.Nova.Migrate(ctx, v.Instance, v.Target, "")
			}
			if err != nil {
				return m, fmt.Errorf("%s: %w", kind, err)
			}
			m, err = r.waitRecord(ctx, v.Instance, kind, op.Host, newest)
			if err != nil {
				return m, err
			}
		}
		mu, err := uuid.Parse(m.UUID)
		if err != nil {
			return m, fmt.Errorf("Nova's %s record without a uuid", kind)
		}
		if err := r.advance(ctx, op, v, Migrating, Update{Migration: &mu}); err != nil {
			return m, err
		}
	}
	return r.waitMigration(ctx, v.Instance, v.Migration.String(), live)
}

func createdBefore(m computeapi.Migration, t time.Time) bool {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.000000", "2006-01-02T15:04:05"} {
		if c, err := time.Parse(layout, m.CreatedAt); err == nil {
			return c.Before(t.Add(-time.Minute)) // clocks of two machines
		}
	}
	return false
}

// waitRecord waits for Nova's record of the move just asked for.
func (r *Runner) waitRecord(ctx context.Context, instance, kind, source string, after int) (computeapi.Migration, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(r.Cfg.StepTimeout, DefaultRunConfig().StepTimeout))
	defer cancel()
	for {
		ms, err := r.Nova.Migrations(ctx, instance, "")
		if err == nil && len(ms) > 0 && ms[0].ID > after && ms[0].Type == kind && ms[0].SourceHost == source && ms[0].UUID != "" {
			return ms[0], nil
		}
		if err := backoff.Sleep(ctx, r.poll()); err != nil {
			return computeapi.Migration{}, fmt.Errorf("no %s record of Nova's for %s: %w", kind, instance, err)
		}
	}
}

// waitMigration waits until Nova's migration mig has run its course:
// finished (cold) or completed (live) is success; error, failed,
// cancelled, reverted is the move's failure.
func (r *Runner) waitMigration(ctx context.Context, instance, mig string, live bool) (computeapi.Migration, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(r.Cfg.MigrationTimeout, DefaultRunConfig().MigrationTimeout))
	defer cancel()
	for {
		ms, err := r.Nova.Migrations(ctx, instance, "")
		if err == nil {
			for _, m := range ms {
				if m.UUID != mig {
					continue
				}
				switch {
				case m.Status == "finished" && !live, m.Status == "confirmed" && !live, m.Status == "completed" && live, m.Status == "done":
					return m, nil
				case m.Finished():
					reason := ""
					if s, err := r.Nova.Server(ctx, instance, ""); err == nil && s.Fault != "" {
						reason = ": " + s.Fault
					}
					return m, fmt.Errorf("Nova's %s %s ended %s%s", m.Type, mig, m.Status, reason)
				}
			}
		}
		if err := backoff.Sleep(ctx, r.poll()); err != nil {
			return computeapi.Migration{}, fmt.Errorf("waiting for Nova's migration %s: %w", mig, err)
		}
	}
}

// finishLive checks a completed live migration: the server idle on
// another host.
func (r *Runner) finishLive(ctx context.Context, op Operation, v *VMStatus, m computeapi.Migration) error {
	s, err := r.waitIdle(ctx, v.Instance)
	if err != nil {
		return err
	}
	if s.Host == op.Host {
		return fmt.Errorf("live migration %s completed but the server is still on %s", m.UUID, op.Host)
	}
	if v.Target == "" {
		v.Target = s.Host
	}
	return r.advance(ctx, op, v, Done, Update{Target: s.Host})
}

// confirm confirms a cold migration once the server is VERIFY_RESIZE and
// waits until it is idle on its new host.
func (r *Runner) confirm(ctx context.Context, op Operation, v *VMStatus) error {
	if err := r.advance(ctx, op, v, Confirming, Update{}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(r.Cfg.StepTimeout, DefaultRunConfig().StepTimeout))
	defer cancel()
	asked := false
	for {
		s, err := r.Nova.Server(ctx, v.Instance, "")
		if err == nil {
			switch {
			case s.Status == "VERIFY_RESIZE" && s.TaskState == "" && !asked:
				if err := r.Nova.ConfirmResize(ctx, v.Instance, ""); err != nil {
					return fmt.Errorf("confirm the migration: %w", err)
				}
				asked = true
			case (s.Status == "ACTIVE" || s.Status == "SHUTOFF") && s.TaskState == "":
				if s.Host == op.Host {
					return fmt.Errorf("the server is %s on %s, the host being emptied: the migration was reverted", s.Status, op.Host)
				}
				return r.advance(ctx, op, v, Confirming, Update{Target: s.Host})
			case s.Status == "ERROR":
				return fmt.Errorf("the server is in ERROR: %s", s.Fault)
			}
		}
		if err := backoff.Sleep(ctx, r.poll()); err != nil {
			return fmt.Errorf("confirm the migration: %w", err)
		}
	}
}

// waitIdle waits until Nova has no task running on the server.
func (r *Runner) waitIdle(ctx context.Context, instance string) (computeapi.Server, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(r.Cfg.StepTimeout, DefaultRunConfig().StepTimeout))
	defer cancel()
	for {
		s, err := r.Nova.Server(ctx, instance, "")
		if err == nil && s.TaskState == "" && s.Status != "MIGRATING" {
			return s, nil
		}
		if err := backoff.Sleep(ctx, r.poll()); err != nil {
			return s, fmt.Errorf("waiting for the server to be idle: %w", err)
		}
	}
}

// moveDirect: reserve on the target, detach, move, transfer, attach.
// A move that fails leaves the VM on its source: the reservation is
// released and the vGPUs are attached there again.
func (r *Runner) moveDirect(ctx context.Context, op Operation, v *VMStatus) error {
	need, err := r.directNeed(ctx, op, v)
	if err != nil {
		return err
	}
	if v.State == Pending {
		resv := uuid.New()
		if err := r.advance(ctx, op, v, Detaching, Update{Reservation: &resv}); err != nil { // recorded before Placement is written
			return err
		}
	}
	resv := v.Reservation.String()
	if v.State == Detaching {
		if err := r.Placement.Reserve(ctx, resv, v.Instance, v.Target, need); err != nil {
			return r.failDirect(ctx, op, v, need, false, fmt.Errorf("reserve on %s: %w", v.Target, err))
		}
		detach := requestID(op.ID, v.Instance, "detach")
		if err := r.Agents.Detach(ctx, detach, v.Instance); err != nil {
			return r.failDirect(ctx, op, v, need, false, err)
		}
		if err := r.Agents.Wait(ctx, detach); err != nil {
			return r.failDirect(ctx, op, v, need, false, fmt.Errorf("detach (request %s): %w", detach, err))
		}
	}
	if v.State == Detaching || v.State == Migrating || v.State == Confirming {
		s, err := r.Nova.Server(ctx, v.Instance, "")
		if err != nil && v.State == Detaching {
			return r.failDirect(ctx, op, v, need, true, fmt.Errorf("read the server: %w", err))
		}
		live := v.State != Confirming && s.Status != "SHUTOFF" && !(v.State == Migrating && v.Migration != nil && s.Status == "VERIFY_RESIZE")
		if v.State != Confirming {
			if _, err := r.migrate(ctx, op, v, live); err != nil {
				return r.failDirect(ctx, op, v, need, true, err)
			}
		}
		if !live {
			if err := r.confirm(ctx, op, v); err != nil {
				return r.failDirect(ctx, op, v, need, true, err)
			}
		} else if s, err := r.waitIdle(ctx, v.Instance); err != nil || s.Host == op.Host {
			return r.failDirect(ctx, op, v, need, true, fmt.Errorf("the server is still on %s after its live migration", op.Host))
		}
		if err := r.advance(ctx, op, v, Attaching, Update{}); err != nil {
			return err
		}
	}
	if err := r.Placement.Transfer(ctx, resv, v.Instance); err != nil {
		return fmt.Errorf("move the reservation into the instance's consumer: %w", err)
	}
	kind := "instance.live_migration_post.end"
	if slices.ContainsFunc(v.Steps, func(st Step) bool { return st.State == Confirming }) {
		kind = "instance.resize_confirm.end"
	}
	if err := r.Agents.Settled(ctx, v.Instance, kind, v.UpdatedAt.Add(-5*time.Minute)); err != nil {
		return err
	}
	s, err := r.waitIdle(ctx, v.Instance)
	if err != nil {
		return err
	}
	attach := requestID(op.ID, v.Instance, "attach")
	if err := r.Agents.Attach(ctx, attach, v.Instance, s.Host, s.Node, need); err != nil {
		return err
	}
	if err := r.Agents.Wait(ctx, attach); err != nil {
		return fmt.Errorf("attach on %s (request %s): %w", v.Target, attach, err)
	}
	return r.advance(ctx, op, v, Done, Update{})
}

// directNeed is what the VM held on the source, as the plan recorded it
// when it started (read again from the bridge's records before the
// detach; after it, from the detached vGPUs).
func (r *Runner) directNeed(ctx context.Context, op Operation, v *VMStatus) ([]DirectVGPU, error) {
	need, err := r.DirectOf(ctx, v.Instance, requestID(op.ID, v.Instance, "detach"))
	if err != nil {
		return nil, err
	}
	if len(need) == 0 {
		return nil, fmt.Errorf("the bridge knows no direct-path vGPU of %s", v.Instance)
	}
	return need, nil
}

// failDirect ends a direct-path VM that did not move: the reservation is
// released and, once detached, its vGPUs are attached again on the
// source.
func (r *Runner) failDirect(ctx context.Context, op Operation, v *VMStatus, need []DirectVGPU, detached bool, cause error) error {
	ctx = context.WithoutCancel(ctx)
	if v.Reservation != nil {
		if err := r.Placement.Release(ctx, v.Reservation.String()); err != nil {
			r.Log.Error("maintenance: release the reservation", logkey.Instance, v.Instance, "reservation", v.Reservation, logkey.Err, err)
			return fmt.Errorf("%w (and the reservation %s could not be released: %v)", cause, v.Reservation, err)
		}
	}
	if detached {
		s, err := r.waitIdle(ctx, v.Instance)
		if err == nil && s.Host == op.Host {
			back := requestID(op.ID, v.Instance, "reattach")
			if err := r.Placement.Restore(ctx, v.Instance, need); err != nil {
				return fmt.Errorf("%w (and its vGPUs' units could not be claimed again on %s: %v)", cause, op.Host, err)
			}
			if err := r.Agents.Attach(ctx, back, v.Instance, s.Host, s.Node, need); err != nil {
				return fmt.Errorf("%w (and attaching its vGPUs again on %s failed: %v)", cause, op.Host, err)
			}
			if err := r.Agents.Wait(ctx, back); err != nil {
				return fmt.Errorf("%w (and attaching its vGPUs again on %s failed: %v)", cause, op.Host, err)
			}
			return fmt.Errorf("%w; the VM stays on %s with its vGPUs attached again", cause, op.Host)
		}
	}
	return cause
}
