// SPDX-License-Identifier: Apache-2.0

package maintenance

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestStoreLifecycle runs the durable record of an operation against
// Postgres: one running operation per host, skipped VMs failed at once,
// state changes forward only, repeated changes idempotent, every change
// audited, and the operation's end from its VMs'.
func TestStoreLifecycle(t *testing.T) {
	ctx := context.Background()
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	s := NewStore(pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
	who := controls.Actor{Name: "ops", RequestID: "req-1"}
	vms := []VM{
		{Instance: i1, Name: "vm-nova", Status: "ACTIVE", FlavorVGPUs: 1},
		{Instance: i2, Name: "vm-direct", Status: "ACTIVE", Direct: []DirectVGPU{t4}},
		{Instance: i3, Name: "vm-paused", Status: "PAUSED", FlavorVGPUs: 1},
	}
	p, err := Build("ha", false, vms, DefaultOptions(), &roomChooser{hosts: []string{"hb"}, free: map[string]int{"hb": 4}})
	testsvc.Must(t, err, "plan")
	op, err := s.Create(ctx, who, p, true)
	testsvc.Must(t, err, "create")
	if op.State != OpRunning || op.Host != "ha" || !op.DrainedByOp || len(op.VMs) != 3 || op.Options.Concurrency != 1 {
		t.Fatalf("created %+v", op)
	}
	states := map[string]State{}
	for _, v := range op.VMs {
		states[v.Instance] = v.State
	}
	if states[i1] != Pending || states[i2] != Pending || states[i3] != Failed {
		t.Errorf("initial states %v", states)
	}
	if _, err := s.Create(ctx, who, p, false); !errors.Is(err, ErrBusy) {
		t.Errorf("second operation on the host: %v, want ErrBusy", err)
	}
	if ids, err := s.Running(ctx); err != nil || len(ids) != 1 || ids[0] != op.ID {
		t.Errorf("Running = %v, %v", ids, err)
	}

	resv, mig := uuid.New(), uuid.New()
	// The reservation consumer is recorded before Placement is written.
	v, changed, err := s.Advance(ctx, who, op.ID, i2, Detaching, Update{Reservation: &resv})
	testsvc.Must(t, err, "detaching")
	if !changed || v.State != Detaching || v.Reservation == nil || *v.Reservation != resv || v.Target != "hb" {
		t.Errorf("after detaching: %+v changed %v", v, changed)
	}
	if _, changed, err := s.Advance(ctx, who, op.ID, i2, Detaching, Update{}); err != nil || changed {
		t.Errorf("repeated detaching: changed %v, %v", changed, err)
	}
	if _, _, err := s.Advance(ctx, who, op.ID, i2, Migrating, Update{Migration: &mig}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Advance(ctx, who, op.ID, i2, Detaching, Update{}); !errors.Is(err, ErrIllegal) {
		t.Errorf("backwards: %v, want ErrIllegal", err)
	}
	if _, err := s.Finish(ctx, who, op.ID); !errors.Is(err, ErrIllegal) {
		t.Errorf("finish while VMs move: %v, want ErrIllegal", err)
	}
	for _, st := range []State{Attaching, Done} {
		if _, _, err := s.Advance(ctx, who, op.ID, i2, st, Update{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []State{Migrating, Confirming, Done} {
		if _, _, err := s.Advance(ctx, who, op.ID, i1, st, Update{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.Advance(ctx, who, op.ID, i1, Failed, Update{Reason: "late"}); !errors.Is(err, ErrIllegal) {
		t.Errorf("done → failed: %v, want ErrIllegal", err)
	}
	if _, _, err := s.Advance(ctx, who, op.ID, uuid.NewString(), Done, Update{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown VM: %v, want ErrNotFound", err)
	}
	end, err := s.Finish(ctx, who, op.ID)
	testsvc.Must(t, err, "finish")
	if end.State != OpFailed || end.FinishedAt == nil { // the paused VM stayed
		t.Errorf("finished %+v", end)
	}
	got := end.VMs[0] // plan order: vm-direct, vm-nova, vm-paused
	if got.Instance != i2 || got.State != Done || got.Migration == nil || *got.Migration != mig || got.Reservation == nil {
		t.Errorf("direct VM at the end %+v", got)
	}
	if ids, _ := s.Running(ctx); len(ids) != 0 {
		t.Errorf("running after finish: %v", ids)
	}
	if _, err := s.Create(ctx, who, p, false); err != nil {
		t.Errorf("a new operation after the first finished: %v", err)
	}

	// Every change is in the audit log: start, the skipped VM, 4 + 3
	// changes, finish.
	var n int
	testsvc.Must(t, pool.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE (object_type = 'maintenance' AND object_id = $1)
		OR (object_type = 'maintenance_vm' AND object_id LIKE $1 || '/%')`, op.ID.String()).Scan(&n), "audit")
	if n != 1+1+4+3+1 {
		t.Errorf("audit rows %d, want 10", n)
	}
}
