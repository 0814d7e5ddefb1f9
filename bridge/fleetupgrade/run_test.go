// SPDX-License-Identifier: Apache-2.0

package fleetupgrade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/agent/executor"
	"github.com/vgpu-bridge/vgpu-bridge/agent/journal"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// hook is the operator's upgrade command the simulated hosts run: it
// "installs" the target by writing the new driver version where the
// simulated host's NVML reads it (as agent/fakehost does).
const hook = `#!/bin/sh
echo "installing branch $VGPU_TARGET_BRANCH"
if [ -e "$1/broken" ]; then echo "dkms: build failed" >&2; exit 2; fi
echo "$VGPU_TARGET_BRANCH.133.10" > "$1/driver_version"
echo ok
`

// simHost is a simulated host's agent: the real executor (journal,
// upgrade_driver running the hook above) answering the commands the bridge
// queued for the host, and its reports written as the bridge's report
// ingestion writes them.
type simHost struct {
	name string
	dir  string
	ex   *executor.Executor
	// gate is the worst severity the host's diagnose finds.
	gate   string
	mu     sync.Mutex
	ran    []protocol.Kind
	vms    int // vGPU VMs still on the host (moved off by the evacuator)
	guests string
}

type noHost struct{}

func (noHost) CreateMdev(context.Context, pci.Addr, string, string) error { return errors.New("no") }
func (noHost) RemoveMdev(context.Context, string) error                   { return errors.New("no") }
func (noHost) Mdevs(context.Context) ([]sysfs.Mdev, error)                { return nil, nil }
func (noHost) Types(context.Context, pci.Addr) ([]sysfs.MdevType, error)  { return nil, nil }
func (noHost) VFs(context.Context) ([]sysfs.VF, error)                    { return nil, nil }
func (noHost) SetVFType(context.Context, pci.Addr, string) error          { return errors.New("no") }
func (noHost) SetVGPUParams(context.Context, string, pci.Addr, string) error {
	return errors.New("no")
}
func (noHost) Domain(context.Context, string) (executor.Domain, error) {
	return executor.Domain{}, errors.New("no")
}
func (noHost) List(context.Context) ([]executor.Domain, error) { return nil, nil }
func (noHost) DefineHostdev(context.Context, string, executor.Hostdev) error {
	return errors.New("no")
}
func (noHost) RemoveHostdevConfig(context.Context, string, executor.Hostdev) error {
	return errors.New("no")
}
func (noHost) AttachLive(context.Context, string, executor.Hostdev) error { return errors.New("no") }
func (noHost) DetachLive(context.Context, string, executor.Hostdev) error { return errors.New("no") }
func (noHost) Shutdown(context.Context, string, time.Duration) error      { return errors.New("no") }
func (noHost) Start(context.Context, string) error                        { return errors.New("no") }
func (s *simHost) Diagnose(context.Context, []string) (json.RawMessage, error) {
	f := []map[string]any{{"check": "nvml_available", "severity": "ok", "title": "NVML answers"}}
	if s.gate != "ok" {
		f = append(f, map[string]any{"check": "driver_branch_match", "severity": s.gate, "subject": "0000:3b:00.0",
			"title": "the vGPU manager did not load"})
	}
	return json.Marshal(map[string]any{"host": s.name, "worst": s.gate, "findings": f})
}

func newSimHost(t *testing.T, pool *pgxpool.Pool, name string) *simHost {
	t.Helper()
	s := &simHost{name: name, dir: t.TempDir(), gate: "ok", vms: 2, guests: "550.54.15"}
	script := filepath.Join(s.dir, "upgrade.sh")
	testsvc.Must(t, os.WriteFile(script, []byte(hook), 0o755), "hook")
	j, err := journal.Open(filepath.Join(s.dir, "journal"), journal.Options{})
	testsvc.Must(t, err, "journal")
	t.Cleanup(func() { j.Close() })
	s.ex, err = executor.New(executor.Config{Host: name, Journal: j, Sysfs: noHost{}, Domains: noHost{}, Diagnoser: s,
		UpgradeCommand: []string{script, s.dir}})
	testsvc.Must(t, err, "executor")
	s.report(t, pool)
	return s
}

func (s *simHost) driver() string {
	if b, err := os.ReadFile(filepath.Join(s.dir, "driver_version")); err == nil {
		return strings.TrimSpace(string(b))
	}
	return "550.54.16"
}

// report writes the host's report: its driver and its guests' drivers.
func (s *simHost) report(t testing.TB, pool *pgxpool.Pool) {
	s.mu.Lock()
	var active []protocol.VGPU
	for i := range s.vms {
		active = append(active, protocol.VGPU{MdevUUID: uuid.NewString(), TypeID: "nvidia-232",
			InstanceUUID: fmt.Sprintf("00000000-0000-4000-8000-%012d", i), GuestDriver: s.guests, Owner: protocol.OwnerNova})
	}
	s.mu.Unlock()
	rep := protocol.Report{V: 1, Host: s.name, Node: s.name, DriverVersion: s.driver(), Hypervisor: "KVM (QEMU 8.2.2)",
		GPUs: []protocol.GPU{{PCI: "0000:3b:00.0", DriverVersion: s.driver(), Active: active, Health: protocol.HealthOK}}}
	body, _ := json.Marshal(rep)
	if _, err := pool.Exec(context.Background(), `INSERT INTO hosts (name, node, driver_version, last_report_at, report)
		VALUES ($1, $1, $2, now(), $3) ON CONFLICT (name) DO UPDATE SET driver_version = $2, last_report_at = now(), report = $3`,
		s.name, rep.DriverVersion, body); err != nil {
		t.Errorf("report of %s: %v", s.name, err)
	}
}

// serve answers the host's queued commands until ctx ends.
func (s *simHost) serve(ctx context.Context, t *testing.T, pool *pgxpool.Pool) {
	for ctx.Err() == nil {
		rows, _ := pool.Query(ctx, `SELECT body FROM commands WHERE host = $1 AND finished_at IS NULL ORDER BY created_at`, s.name)
		bodies, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		if err != nil && ctx.Err() == nil {
			t.Errorf("%s: read commands: %v", s.name, err)
			return
		}
		for _, b := range bodies {
			c, err := protocol.DecodeCommand(b)
			if err != nil {
				t.Errorf("%s: %v", s.name, err)
				continue
			}
			res := s.ex.Execute(ctx, c)
			s.mu.Lock()
			s.ran = append(s.ran, c.Kind)
			s.mu.Unlock()
			body, _ := json.Marshal(res)
			if _, _, err := requests.FinishCommandOnce(ctx, pool, res.CommandID, res.Host, string(res.Status), body); err != nil && ctx.Err() == nil {
				t.Errorf("%s: record result: %v", s.name, err)
			}
			s.report(t, pool) // the executor's change signal: a fresh report
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *simHost) kinds() []protocol.Kind {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]protocol.Kind(nil), s.ran...)
}

// evacuator plays the maintenance operation: it moves the host's VMs to
// the hosts not being upgraded (its own tests are bridge/maintenance's
// and tests/e2e's).
type evacuator struct {
	mu    sync.Mutex
	hosts map[string]*simHost
	moved map[string]int // host → VMs moved off it
	// drained records, at each evacuation, whether the host was drained.
	drainedAt map[string]bool
	pool      *pgxpool.Pool
}

func (e *evacuator) Evacuate(ctx context.Context, _ controls.Actor, host string) (uuid.UUID, error) {
	var drained bool
	if err := e.pool.QueryRow(ctx, `SELECT drained FROM hosts WHERE name = $1`, host).Scan(&drained); err != nil {
		return uuid.Nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.drainedAt[host] = drained
	h := e.hosts[host]
	h.mu.Lock()
	e.moved[host] += h.vms
	h.vms = 0
	h.mu.Unlock()
	return uuid.New(), nil
}

func (e *evacuator) Wait(context.Context, uuid.UUID) error { return nil }

type fixture struct {
	pool   *pgxpool.Pool
	store  *Store
	hosts  map[string]*simHost
	evac   *evacuator
	compat *policy.Compat
}

func newFixture(t *testing.T, pool *pgxpool.Pool, names ...string) *fixture {
	// The scenarios share one database (migrating one takes seconds):
	// each starts from empty tables.
	_, err := pool.Exec(context.Background(), `DELETE FROM fleet_upgrade_hosts; DELETE FROM fleet_upgrades; DELETE FROM commands; DELETE FROM hosts`)
	testsvc.Must(t, err, "reset")
	f := &fixture{pool: pool, store: NewStore(pool, nil), hosts: map[string]*simHost{}}
	for _, n := range names {
		f.hosts[n] = newSimHost(t, pool, n)
	}
	f.evac = &evacuator{hosts: f.hosts, moved: map[string]int{}, drainedAt: map[string]bool{}, pool: pool}
	c, err := policy.LoadCompat(strings.NewReader("branches: [535, 550, 570]\nrule: {same_branch: true, previous_branch: true, previous_branch_since: 550}\n"))
	testsvc.Must(t, err, "compat")
	f.compat = c
	return f
}

func (f *fixture) runner(after func(uuid.UUID, string, State)) *Runner {
	return &Runner{Store: f.store, Pool: f.pool, Drain: controls.NewStore(f.pool, nil, nil), Evac: f.evac,
		Compat: func() Compat { return f.compat }, Who: controls.Actor{Name: "vgpu-bridge/test"},
		Poll: 50 * time.Millisecond, DriverTimeout: 5 * time.Second, AfterStep: after}
}

func (f *fixture) serve(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, h := range f.hosts {
		wg.Add(1)
		go func() { defer wg.Done(); h.serve(ctx, t, f.pool) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func (f *fixture) drained(t *testing.T, host string) bool {
	var d bool
	testsvc.Must(t, f.pool.QueryRow(context.Background(), `SELECT drained FROM hosts WHERE name = $1`, host).Scan(&d), "drained")
	return d
}

func (f *fixture) audits(t *testing.T, op uuid.UUID) int {
	var n int
	testsvc.Must(t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_log WHERE object_type = 'fleet_upgrade'
		AND (object_id = $1 OR object_id LIKE $1 || '/%')`, op.String()).Scan(&n), "audit")
	return n
}

func drive(t *testing.T, r *Runner, id uuid.UUID) Operation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testsvc.Must(t, r.Drive(ctx, id), "drive")
	op, err := r.Store.Get(ctx, id)
	testsvc.Must(t, err, "get")
	return op
}

var who = controls.Actor{Name: "ops", RequestID: "req-upgrade"}

// TestFleetUpgrade runs the scenarios against Postgres, with simulated
// hosts whose agents run the real executor and the test's upgrade hook.
func TestFleetUpgrade(t *testing.T) {
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *pgxpool.Pool)
	}{
		{"two hosts upgraded", testFleetUpgrade},
		{"gate fails: stops there", testFleetUpgradeGateFails},
		{"hook fails", testFleetUpgradeHookFails},
		{"resumes after a restart", testFleetUpgradeResumes},
		{"incompatible guests refused", testCompatRefusal},
		{"max unavailable 2 of 3", testMaxUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, pool) })
	}
}

// testFleetUpgrade: two hosts upgraded one after the other: each drained,
// its VMs moved off while drained, the agent's hook run once, the new
// branch awaited in its report, diagnose run as the gate, undrained;
// every step audited.
func testFleetUpgrade(t *testing.T, pool *pgxpool.Pool) {
	f := newFixture(t, pool, "up-a", "up-b")
	f.serve(t)
	op, err := f.store.Create(context.Background(), who, Options{Branch: "570", Hosts: []string{"up-a", "up-b"}, MaxUnavailable: 1, StopOnFailure: true})
	testsvc.Must(t, err, "create")
	// One host at a time: when a host starts, every host before it is done.
	var order []string
	r := f.runner(func(id uuid.UUID, host string, to State) {
		if to == Draining {
			order = append(order, host)
			cur, _ := f.store.Get(context.Background(), id)
			for _, h := range cur.Hosts {
				if h.Host != host && !h.State.Final() && h.State != Pending {
					t.Errorf("%s started while %s is %s (max unavailable 1)", host, h.Host, h.State)
				}
			}
		}
	})
	op = drive(t, r, op.ID)
	if op.State != OpDone || op.Error != "" {
		t.Fatalf("operation %s: %s", op.State, op.Error)
	}
	if strings.Join(order, ",") != "up-a,up-b" {
		t.Errorf("order %v", order)
	}
	for _, h := range op.Hosts {
		if h.State != Done || h.FromDriver != "550.54.16" || h.ToDriver != "570.133.10" || !strings.Contains(h.Output, "installing branch 570") {
			t.Errorf("%s: %+v", h.Host, h)
		}
		if f.drained(t, h.Host) {
			t.Errorf("%s still drained", h.Host)
		}
		if !f.evac.drainedAt[h.Host] || f.evac.moved[h.Host] != 2 {
			t.Errorf("%s: drained at evacuation %v, moved %d", h.Host, f.evac.drainedAt[h.Host], f.evac.moved[h.Host])
		}
		if k := f.hosts[h.Host].kinds(); len(k) != 2 || k[0] != protocol.UpgradeDriver || k[1] != protocol.CollectDiagnostics {
			t.Errorf("%s ran %v", h.Host, k)
		}
	}
	// start + 7 steps per host + finish
	if n := f.audits(t, op.ID); n != 1+2*7+1 {
		t.Errorf("%d audit records", n)
	}
}

// testFleetUpgradeGateFails: the gate fails on the first host: the run
// stops there with the host drained and its VMs elsewhere; the second
// host is never touched.
func testFleetUpgradeGateFails(t *testing.T, pool *pgxpool.Pool) {
	f := newFixture(t, pool, "up-a", "up-b")
	f.hosts["up-a"].gate = "critical"
	f.serve(t)
	op, err := f.store.Create(context.Background(), who, Options{Branch: "570", Hosts: []string{"up-a", "up-b"}, MaxUnavailable: 1, StopOnFailure: true})
	testsvc.Must(t, err, "create")
	op = drive(t, f.runner(nil), op.ID)
	if op.State != OpFailed || !strings.Contains(op.Error, "stopped with 1 host(s) not upgraded") {
		t.Fatalf("operation %s: %q", op.State, op.Error)
	}
	a, b := op.Hosts[0], op.Hosts[1]
	if a.State != Failed || !strings.Contains(a.Error, "diagnose gate: critical driver_branch_match") || a.ToDriver != "570.133.10" {
		t.Errorf("up-a: %+v", a)
	}
	if !f.drained(t, "up-a") || f.evac.moved["up-a"] != 2 {
		t.Errorf("up-a: drained %v, VMs moved %d; want drained with its VMs elsewhere", f.drained(t, "up-a"), f.evac.moved["up-a"])
	}
	if b.State != Pending || f.drained(t, "up-b") || f.evac.moved["up-b"] != 0 || len(f.hosts["up-b"].kinds()) != 0 {
		t.Errorf("up-b was touched: %+v", b)
	}
}

// testFleetUpgradeHookFails: a hook that exits non-zero fails the host
// with its output kept.
func testFleetUpgradeHookFails(t *testing.T, pool *pgxpool.Pool) {
	f := newFixture(t, pool, "up-a")
	testsvc.Must(t, os.WriteFile(filepath.Join(f.hosts["up-a"].dir, "broken"), nil, 0o644), "break")
	f.serve(t)
	op, err := f.store.Create(context.Background(), who, Options{Branch: "570", Hosts: []string{"up-a"}, MaxUnavailable: 1, StopOnFailure: true})
	testsvc.Must(t, err, "create")
	op = drive(t, f.runner(nil), op.ID)
	h := op.Hosts[0]
	if op.State != OpFailed || h.State != Failed || !strings.Contains(h.Error, "upgrade_failed") || !strings.Contains(h.Output, "dkms: build failed") {
		t.Errorf("operation %s, host %+v", op.State, h)
	}
}

// testFleetUpgradeResumes: the bridge stops while the first host's
// upgrade command runs; a new runner resumes it on the same command (the
// hook runs once) and finishes both hosts.
func testFleetUpgradeResumes(t *testing.T, pool *pgxpool.Pool) {
	f := newFixture(t, pool, "up-a", "up-b")
	op, err := f.store.Create(context.Background(), who, Options{Branch: "570", Hosts: []string{"up-a", "up-b"}, MaxUnavailable: 1, StopOnFailure: true})
	testsvc.Must(t, err, "create")
	ctx, cancel := context.WithCancel(context.Background())
	r1 := f.runner(func(_ uuid.UUID, host string, to State) {
		if host == "up-a" && to == Upgrading {
			cancel() // the bridge stops; the agents are not serving yet
		}
	})
	if err := r1.Drive(ctx, op.ID); !errors.Is(err, context.Canceled) {
		t.Fatalf("first drive: %v", err)
	}
	mid, _ := f.store.Get(context.Background(), op.ID)
	if mid.State != OpRunning || mid.Hosts[0].State != Upgrading || mid.Hosts[0].UpgradeCommand == nil {
		t.Fatalf("after the stop: %+v", mid)
	}
	f.serve(t)
	ids, err := f.store.Running(context.Background())
	if err != nil || len(ids) != 1 || ids[0] != op.ID {
		t.Fatalf("running = %v, %v", ids, err)
	}
	done := drive(t, f.runner(nil), op.ID)
	if done.State != OpDone {
		t.Fatalf("resumed: %s %q", done.State, done.Error)
	}
	if *done.Hosts[0].UpgradeCommand != *mid.Hosts[0].UpgradeCommand {
		t.Error("the resumed host got a new upgrade command")
	}
	var n int
	testsvc.Must(t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM commands WHERE host = 'up-a' AND kind = 'upgrade_driver'`).Scan(&n), "count")
	if n != 1 || f.evac.moved["up-a"] != 2 {
		t.Errorf("up-a: %d upgrade commands, %d VMs moved", n, f.evac.moved["up-a"])
	}
}

// testCompatRefusal: a target branch that cannot serve the guests'
// drivers is refused before anything is done.
func testCompatRefusal(t *testing.T, pool *pgxpool.Pool) {
	f := newFixture(t, pool, "up-a")
	f.hosts["up-a"].guests = "535.54.03"
	f.hosts["up-a"].report(t, f.pool)
	for _, tc := range []struct {
		branch string
		refuse bool
	}{{"570", true}, {"550", false}} {
		ref, err := CheckCompat(context.Background(), f.pool, f.compat, []string{"up-a"}, tc.branch, "")
		testsvc.Must(t, err, "check")
		if (len(ref) > 0) != tc.refuse {
			t.Errorf("branch %s: refusals %+v, want refused=%v", tc.branch, ref, tc.refuse)
		}
	}
	// The runner checks again when the host starts (the guests may have changed since).
	op, err := f.store.Create(context.Background(), who, Options{Branch: "570", Hosts: []string{"up-a"}, MaxUnavailable: 1, StopOnFailure: true})
	testsvc.Must(t, err, "create")
	op = drive(t, f.runner(nil), op.ID)
	if h := op.Hosts[0]; h.State != Failed || !strings.Contains(h.Error, "cannot serve guest driver 535.54.03") || f.drained(t, "up-a") {
		t.Errorf("host %+v drained %v", h, f.drained(t, "up-a"))
	}
}

// testMaxUnavailable: with max_unavailable 2, two of three hosts are out
// of service together, never three.
func testMaxUnavailable(t *testing.T, pool *pgxpool.Pool) {
	f := newFixture(t, pool, "up-a", "up-b", "up-c")
	f.serve(t)
	op, err := f.store.Create(context.Background(), who, Options{Branch: "570", Hosts: []string{"up-a", "up-b", "up-c"}, MaxUnavailable: 2, StopOnFailure: true})
	testsvc.Must(t, err, "create")
	var mu sync.Mutex
	most := 0
	r := f.runner(func(id uuid.UUID, _ string, _ State) {
		cur, _ := f.store.Get(context.Background(), id)
		out := 0
		for _, h := range cur.Hosts {
			if h.State != Pending && !h.State.Final() {
				out++
			}
		}
		mu.Lock()
		most = max(most, out)
		mu.Unlock()
	})
	op = drive(t, r, op.ID)
	if op.State != OpDone || most != 2 {
		t.Errorf("operation %s, at most %d hosts out at once; want done with 2", op.State, most)
	}
}
