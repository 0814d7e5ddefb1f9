package policystate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const rules = `defaults: {load_cooldown: 15m}
rules:
  - name: up
    on: [webhook.GPU_LOAD]
    when: metrics.gpu_util > 90.0
    for: 5m
    then: ['notify("up")', 'release()']
`

// TestHysteresisAcrossReplicas runs the load rule through Postgres as two
// replicas would: each event snapshots, evaluates and applies.
func TestHysteresisAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	hysteresis(t, "vm1", func() (*policy.Tracker, error) { return Snapshot(ctx, pool, "vm1") },
		func(ups []policy.LoadUpdate) error { return Apply(ctx, pool, ups) })
	if err := Forget(ctx, pool, "vm1"); err != nil {
		t.Fatal(err)
	}
	ls, err := Snapshot(ctx, pool, "vm1")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ls.LastChange("vm1"); ok {
		t.Error("Forget kept the last change")
	}
}

// TestHysteresisInOneStatement is TestHysteresisAcrossReplicas with the
// state read as a part of a statement that reads more (SnapshotJSON,
// FromJSON) and written as parts of one statement (ApplyParts), as a
// decision of the pipeline does.
func TestHysteresisInOneStatement(t *testing.T) {
	ctx := context.Background()
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	hysteresis(t, "vm2", func() (*policy.Tracker, error) {
		var one int
		var raw []byte
		if err := pool.QueryRow(ctx, `SELECT 1, `+SnapshotJSON("$1::text"), "vm2").Scan(&one, &raw); err != nil {
			return nil, err
		}
		return FromJSON("vm2", raw)
	}, func(ups []policy.LoadUpdate) error {
		if !Distinct(ups) {
			return Apply(ctx, pool, ups)
		}
		parts, err := ApplyParts(ups)
		if err != nil || len(parts) == 0 {
			return err
		}
		sql, args := store.With(store.Part{SQL: `SELECT 1`}, parts...)
		_, err = pool.Exec(ctx, sql, args...)
		return err
	})
}

func hysteresis(t *testing.T, vm string, snapshot func() (*policy.Tracker, error), apply func([]policy.LoadUpdate) error) {
	t.Helper()
	p, err := policy.Load(strings.NewReader(rules), policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := &policy.MemState{Instances: []policy.Instance{{UUID: vm, ProjectID: "p", VGPUs: []policy.VGPU{{Profile: "T4-4Q", Count: 1}}}}}
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	step := func(at time.Duration, util float64) *policy.Decision {
		t.Helper()
		ls, err := snapshot()
		if err != nil {
			t.Fatal(err)
		}
		d := p.Evaluate(policy.Event{Kind: policy.KindGPULoad, InstanceUUID: vm, Time: t0.Add(at), Metrics: map[string]float64{"gpu_util": util}}, st, ls)
		if err := apply(d.LoadUpdates); err != nil {
			t.Fatal(err)
		}
		return d
	}
	want := []struct {
		at      time.Duration
		util    float64
		outcome policy.Outcome
	}{
		{0, 95, policy.OutcomeHolding},
		{3 * time.Minute, 96, policy.OutcomeHolding},
		{5 * time.Minute, 97, policy.OutcomeFired},
		{6 * time.Minute, 97, policy.OutcomeHolding},
		{11 * time.Minute, 97, policy.OutcomeCooldown},
		{12 * time.Minute, 10, policy.OutcomeFalse},
		{13 * time.Minute, 97, policy.OutcomeHolding},
		{20 * time.Minute, 97, policy.OutcomeFired},
	}
	for i, w := range want {
		d := step(w.at, w.util)
		if got := d.Rules[0].Outcome; got != w.outcome {
			t.Errorf("step %d (t+%s): %s, want %s\n%s", i, w.at, got, w.outcome, d.Explain())
		}
	}
}
