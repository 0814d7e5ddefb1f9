package pipeline_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/fleetupgrade"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// noMoves stands in for the host maintenance operation (it needs Nova;
// tests/e2e moves VMs with it): it records that the host was drained
// when its VMs were to move.
type noMoves struct {
	w       *world
	drained bool
}

func (m *noMoves) Evacuate(ctx context.Context, _ controls.Actor, host string) (uuid.UUID, error) {
	err := m.w.pool.QueryRow(ctx, `SELECT drained FROM hosts WHERE name = $1`, host).Scan(&m.drained)
	return uuid.Nil, err
}

func (m *noMoves) Wait(context.Context, uuid.UUID) error { return nil }

// TestFleetUpgradeThroughAgent: a fleet upgrade of the fake host through
// the bridge's outbox, signed commands over RabbitMQ and the real agent:
// the agent runs its configured upgrade hook (the test's script, which
// installs branch 570 by writing the fake host's driver_version), its
// next report carries 570.133.10, the agent's real diagnose is the gate,
// and the host ends undrained.
func TestFleetUpgradeThroughAgent(t *testing.T) {
	w := newWorld(t)
	w.startBridge(replicaOpts{name: "r1"})
	hook := filepath.Join(t.TempDir(), "upgrade.sh")
	testsvc.Must(t, os.WriteFile(hook, []byte(`#!/bin/sh
echo "installing $VGPU_TARGET_BRANCH"
echo "$VGPU_TARGET_BRANCH.133.10" > "$1/`+fakehost.DriverVersionFile+`"
`), 0o755), "hook")
	w.startAgent("DEFAULT.driver_upgrade_command=" + hook + "," + w.fake)
	deadline := time.Now().Add(15 * time.Second)
	for {
		var v *string
		_ = w.pool.QueryRow(w.ctx, `SELECT driver_version FROM hosts WHERE name = $1`, w.host).Scan(&v)
		if v != nil && *v != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no report from the agent")
		}
		time.Sleep(100 * time.Millisecond)
	}
	store := fleetupgrade.NewStore(w.pool, logger())
	op, err := store.Create(w.ctx, controls.Actor{Name: "ops"}, fleetupgrade.Options{Branch: "570", Hosts: []string{w.host},
		MaxUnavailable: 1, StopOnFailure: true})
	testsvc.Must(t, err, "create")
	moves := &noMoves{w: w}
	r := &fleetupgrade.Runner{Store: store, Pool: w.pool, Drain: controls.NewStore(w.pool, nil, logger()), Evac: moves,
		Compat: func() fleetupgrade.Compat { return w.holder.Policy().Compat() }, Who: controls.Actor{Name: "vgpu-bridge/r1"},
		Log: logger(), Poll: 100 * time.Millisecond, DriverTimeout: 20 * time.Second}
	ctx, cancel := context.WithTimeout(w.ctx, 60*time.Second)
	defer cancel()
	testsvc.Must(t, r.Drive(ctx, op.ID), "drive")
	got, err := store.Get(w.ctx, op.ID)
	testsvc.Must(t, err, "get")
	h := got.Hosts[0]
	if got.State != fleetupgrade.OpDone || h.State != fleetupgrade.Done {
		t.Fatalf("run %s (%s), host %s: %s", got.State, got.Error, h.State, h.Error)
	}
	if h.FromDriver != "550.54.16" || h.ToDriver != "570.133.10" || !strings.Contains(h.Output, "installing 570") || !moves.drained {
		t.Errorf("host %+v, drained when its VMs were to move: %v", h, moves.drained)
	}
	var drained bool
	var status, kind string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT drained FROM hosts WHERE name = $1`, w.host).Scan(&drained), "host")
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT kind, result_status FROM commands WHERE id = $1`, *h.UpgradeCommand).Scan(&kind, &status), "command")
	if drained || kind != "upgrade_driver" || status != "succeeded" {
		t.Errorf("drained %v, command %s %s", drained, kind, status)
	}
}
