// SPDX-License-Identifier: Apache-2.0

package maintenance

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// fakeWorld plays Nova, Placement, the agents and the drains for the
// executor; calls records what it was asked, in order.
type fakeWorld struct {
	mu       sync.Mutex
	servers  map[string]*computeapi.Server
	migs     map[string][]computeapi.Migration
	failLive map[string]string // instance → fault of its next live migration
	calls    []string
	reserved map[string]bool // reservation consumers holding units
	detached map[string]bool
	drained  map[string]bool
	attached map[string]string // instance → host of its direct vGPU
	n        int
	// lag hides the newest record from the next Migrations call after a
	// move is asked for, as Nova answers before it writes the record.
	lag    bool
	hidden bool
}

func newFakeWorld() *fakeWorld {
	return &fakeWorld{servers: map[string]*computeapi.Server{}, migs: map[string][]computeapi.Migration{}, failLive: map[string]string{},
		reserved: map[string]bool{}, detached: map[string]bool{}, drained: map[string]bool{}, attached: map[string]string{}}
}

func (w *fakeWorld) call(f string, a ...any) {
	w.calls = append(w.calls, fmt.Sprintf(f, a...))
}

func (w *fakeWorld) Server(_ context.Context, id, _ string) (computeapi.Server, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return *w.servers[id], nil
}

func (w *fakeWorld) record(id, kind, status, dest string) {
	w.n++
	m := computeapi.Migration{ID: w.n, UUID: uuid.NewString(), Instance: id, Type: kind, Status: status, SourceHost: w.servers[id].Host, DestHost: dest}
	w.migs[id] = append([]computeapi.Migration{m}, w.migs[id]...)
}

func (w *fakeWorld) Migrate(_ context.Context, id, host, _ string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.call("migrate %s", id)
	host = cmpStr(host, "hb")
	w.record(id, "migration", "finished", host)
	w.servers[id].Host, w.servers[id].Status = host, "VERIFY_RESIZE"
	return nil
}

func (w *fakeWorld) LiveMigrate(_ context.Context, id, host, _ string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.call("live-migrate %s", id)
	if fault, ok := w.failLive[id]; ok {
		w.record(id, "live-migration", "error", host)
		w.servers[id].Fault = fault
		return nil
	}
	host = cmpStr(host, "hb")
	w.record(id, "live-migration", "completed", host)
	w.servers[id].Host = host
	w.hidden = w.lag
	return nil
}

func (w *fakeWorld) ConfirmResize(_ context.Context, id, _ string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.call("confirm %s", id)
	w.servers[id].Status = "ACTIVE"
	w.migs[id][0].Status = "confirmed"
	return nil
}

func (w *fakeWorld) Migrations(_ context.Context, id, _ string) ([]computeapi.Migration, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hidden && len(w.migs[id]) > 0 {
		w.hidden = false
		return slices.Clone(w.migs[id][1:]), nil
	}
	return slices.Clone(w.migs[id]), nil
}

func (w *fakeWorld) Reserve(_ context.Context, resv, inst, host string, _ []DirectVGPU) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.call("reserve %s on %s", inst, host)
	w.reserved[resv] = true
	return nil
}

func (w *fakeWorld) Transfer(_ context.Context, resv, inst string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.call("transfer %s", inst)
	delete(w.reserved, resv)
	return nil
}

func (w *fakeWorld) Release(_ context.Context, resv string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.call("release reservation")
	delete(w.reserved, resv)
	return nil
}

func (w *fakeWorld) Restore(_ context.Context, inst string, _ []DirectVGPU) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.call("restore %s", inst)
	return nil
}

func (w *fakeWorld) Detach(_ context.Context, _ uuid.UUID, inst string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.call("detach %s", inst)
	delete(w.attached, inst)
	return nil
}

func (w *fakeWorld) Attach(_ context.Context, _ uuid.UUID, inst, host, _ string, _ []DirectVGPU) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.call("attach %s on %s", inst, host)
	w.attached[inst] = w.servers[inst].Host
	return nil
}

func (w *fakeWorld) Settled(context.Context, string, string, time.Time) error { return nil }
func (w *fakeWorld) Wait(context.Context, uuid.UUID) error                    { return nil }
func (w *fakeWorld) OnHost(context.Context, string, string) error             { return nil }
func (w *fakeWorld) direct(context.Context, string, uuid.UUID) ([]DirectVGPU, error) {
	return []DirectVGPU{t4}, nil
}

func (w *fakeWorld) DrainHost(_ context.Context, _ controls.Actor, name, _ string, drain bool, _ func(string) bool) (controls.HostState, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.call("drain %s %t", name, drain)
	w.drained[name] = drain
	return controls.HostState{Name: name, Drained: drain}, nil
}

// TestRunner drives operations through the executor with fakes of Nova,
// Placement and the agents over the real store: each path's calls in
// order, a failed live migration rolled back, stop on failure, and the
// resume of a VM whose migration Nova already recorded.
func TestRunner(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := NewStore(pool, log)
	nova := VM{Instance: i1, Name: "a-nova", Status: "ACTIVE", FlavorVGPUs: 1}
	direct := VM{Instance: i2, Name: "b-direct", Status: "ACTIVE", Direct: []DirectVGPU{t4}}
	direct2 := VM{Instance: i3, Name: "c-direct", Status: "ACTIVE", Direct: []DirectVGPU{t4}}
	tests := []struct {
		name     string
		host     string
		vms      []VM
		o        Options
		failLive map[string]string
		// resume: the VM is Migrating with Nova's record made already.
		resume string
		// earlier: Nova keeps a failed live migration of the VM from
		// before, and shows the new record late.
		earlier   string
		want      map[string]State
		wantOp    string
		wantCalls []string
		reason    map[string]string
	}{
		{name: "nova path: cold migrate, confirm; undrain", host: "h1", vms: []VM{nova}, o: DefaultOptions(),
			want: map[string]State{i1: Done}, wantOp: OpSucceeded,
			wantCalls: []string{"migrate " + i1, "confirm " + i1, "drain h1 false"}},
		{name: "direct path: reserve, detach, live-migrate, transfer, attach", host: "h2", vms: []VM{direct}, o: DefaultOptions(),
			want: map[string]State{i2: Done}, wantOp: OpSucceeded,
			wantCalls: []string{"reserve " + i2 + " on hb", "detach " + i2, "live-migrate " + i2, "transfer " + i2, "attach " + i2 + " on hb", "drain h2 false"}},
		{name: "direct path: failed live migration stays with its vGPU", host: "h3", vms: []VM{direct}, o: DefaultOptions(),
			failLive: map[string]string{i2: "injected"}, want: map[string]State{i2: Failed}, wantOp: OpFailed,
			wantCalls: []string{"reserve " + i2 + " on hb", "detach " + i2, "live-migrate " + i2, "release reservation", "restore " + i2,
				"attach " + i2 + " on h3", "drain h3 false"},
			reason: map[string]string{i2: "ended error: injected"}},
		{name: "stop on failure: the next VM does not start", host: "h4", vms: []VM{direct, direct2}, o: DefaultOptions(),
			failLive: map[string]string{i2: "injected"}, want: map[string]State{i2: Failed, i3: Failed}, wantOp: OpFailed,
			reason: map[string]string{i3: "not started"}},
		{name: "keep going: the next VM moves", host: "h5", vms: []VM{direct, direct2}, o: Options{Concurrency: 1},
			failLive: map[string]string{i2: "injected"}, want: map[string]State{i2: Failed, i3: Done}, wantOp: OpFailed},
		{name: "an earlier failed migration is not taken for the new one", host: "h7", vms: []VM{direct}, o: DefaultOptions(),
			earlier: i2, want: map[string]State{i2: Done}, wantOp: OpSucceeded},
		{name: "nova path with live_migrate_vgpu: live-migrate, nothing to confirm", host: "h8", vms: []VM{nova},
			o:    Options{Concurrency: 1, StopOnFailure: true, LiveMigrateVGPU: true},
			want: map[string]State{i1: Done}, wantOp: OpSucceeded,
			wantCalls: []string{"live-migrate " + i1, "drain h8 false"}},
		{name: "nova path with live_migrate_vgpu: a failed live migration leaves the VM", host: "h9", vms: []VM{nova},
			o: Options{Concurrency: 1, StopOnFailure: true, LiveMigrateVGPU: true}, failLive: map[string]string{i1: "injected"},
			want: map[string]State{i1: Failed}, wantOp: OpFailed,
			wantCalls: []string{"live-migrate " + i1, "drain h9 false"}, reason: map[string]string{i1: "injected"}},
		{name: "resume: Nova's recorded migration is waited for, not asked again", host: "h6", vms: []VM{nova}, o: DefaultOptions(),
			resume: i1, want: map[string]State{i1: Done}, wantOp: OpSucceeded,
			wantCalls: []string{"confirm " + i1, "drain h6 false"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newFakeWorld()
			for _, vm := range tt.vms {
				w.servers[vm.Instance] = &computeapi.Server{ID: vm.Instance, Status: "ACTIVE", Host: tt.host}
			}
			for k, v := range tt.failLive {
				w.failLive[k] = v
			}
			p, err := Build(tt.host, false, tt.vms, tt.o, &roomChooser{hosts: []string{"hb"}, free: map[string]int{"hb": 8}})
			testsvc.Must(t, err, "plan")
			op, err := store.Create(ctx, controls.Actor{Name: "test"}, p, true)
			testsvc.Must(t, err, "create")
			if tt.earlier != "" {
				w.record(tt.earlier, "live-migration", "failed", "hb")
				w.lag = true
			}
			if tt.resume != "" {
				testsvc.Must(t, w.Migrate(ctx, tt.resume, "", ""), "migrate before the restart")
				m, _ := uuid.Parse(w.migs[tt.resume][0].UUID)
				_, _, err := store.Advance(ctx, controls.Actor{Name: "test"}, op.ID, tt.resume, Migrating, Update{Migration: &m})
				testsvc.Must(t, err, "migrating")
				w.calls = nil
			}
			r := &Runner{Store: store, Nova: w, Placement: w, Agents: w, Drain: w, Log: log, DirectOf: w.direct,
				Cfg: RunConfig{Poll: 5 * time.Millisecond}}
			testsvc.Must(t, r.Drive(ctx, op.ID), "drive")
			got, err := store.Get(ctx, op.ID)
			testsvc.Must(t, err, "get")
			if got.State != tt.wantOp {
				t.Errorf("operation %s, want %s", got.State, tt.wantOp)
			}
			for _, v := range got.VMs {
				if v.State != tt.want[v.Instance] {
					t.Errorf("VM %s %s (%s), want %s", v.Instance, v.State, v.Reason, tt.want[v.Instance])
				}
				if want := tt.reason[v.Instance]; want != "" && !strings.Contains(v.Reason, want) {
					t.Errorf("VM %s reason %q, want it to say %q", v.Instance, v.Reason, want)
				}
			}
			if tt.wantCalls != nil && !slices.Equal(w.calls, tt.wantCalls) {
				t.Errorf("calls\n%s\nwant\n%s", strings.Join(w.calls, "\n"), strings.Join(tt.wantCalls, "\n"))
			}
			if len(w.reserved) != 0 {
				t.Errorf("reservations left: %v", w.reserved)
			}
		})
	}
}
