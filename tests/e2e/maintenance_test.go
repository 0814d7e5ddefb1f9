// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestMaintenanceMigrateAll: `vgpuctl host migrate-all` (POST
// /v1/hosts/{name}/migrate-all) against the real Nova, two FakeDriver
// compute hosts with their agents, and the bridge in process. Host A runs
// one Nova-path vGPU VM (its flavor's resources:VGPU) and two direct-path
// VMs (the bridge attached their T4-4Q). First run: the live migration of
// the last direct-path VM fails in the driver: the two others are on B,
// it stays on A with its vGPU attached again, its reservation on B is
// released and the operation reports it failed with the reason. Second
// run: it moves too. At the end every VM runs on B with its vGPU (Nova,
// Placement, the fake host's mdevs and domain hostdevs), A holds nothing,
// no reservation consumer is left and A is undrained.
func TestMaintenanceMigrateAll(t *testing.T) {
	n := sharedNova(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	a, b := n.AddHost(t, "mig-a"), n.AddHost(t, "mig-b")
	gpuA := n.AddVGPUChild(t, a, directGPU, directTrait, 4)
	gpuB := n.AddVGPUChild(t, b, directGPU, directTrait, 4)
	n.StartAgent(t, a)
	n.StartAgent(t, b)
	prefix := testsvc.Name("mig")
	vgpuFlavor := n.CreateFlavor(t, prefix+".t4-4q", 2, 2048, 10, map[string]string{"resources:VGPU": "1", "trait:" + directTrait: "required"})
	plain := n.CreateFlavor(t, prefix+".small", 2, 2048, 10, nil)

	d, api := startNovaBridge(t, n,
		"nova.poll_interval=100ms",
		"dispatch.results_queue="+testsvc.Name("mig-results"),
		"dispatch.reports_queue="+testsvc.Name("mig-reports"),
		"pipeline.poll_interval=50ms",
		"placement.sync_interval=2s",
		"maintenance.poll_interval=200ms",
		"maintenance.migration_timeout=4m",
	)
	w := &directWorld{t: t, ctx: ctx, n: n, host: a, gpu: gpuA, api: api, pool: d.Pool, flavor: plain}

	novaVM := n.CreateServer(t, prefix+"-a-nova", vgpuFlavor, a)
	direct1, direct2 := w.bootServer(prefix+"-b-direct"), w.bootServer(prefix+"-c-direct")
	n.WaitServer(t, novaVM, "ACTIVE")
	for _, vm := range []string{direct1, direct2} {
		if r := w.waitFinal(w.gpuRequest(vm, "T4-4Q")); r.State != "succeeded" {
			t.Fatalf("attach to %s: %s (%s): %s", vm, r.State, r.Code, r.Reason)
		}
	}
	all := []string{novaVM, direct1, direct2}
	waitFor(t, time.Minute, "the bridge's index to see B's T4", func() bool {
		h, err := api.Host(ctx, b)
		return err == nil && h.Free == 4
	})

	// The dry run plans and changes nothing.
	p, _, err := api.MigrateAllHost(ctx, a, apiclient.MigrateAll{DryRun: true, Target: b})
	testsvc.Must(t, err, "dry run")
	actions := map[string]string{}
	for _, vm := range p.Plan.VMs {
		actions[vm.Instance] = vm.Action
	}
	if actions[novaVM] != "cold_migrate" || actions[direct1] != "move_direct" || actions[direct2] != "move_direct" || !p.Plan.Drain {
		t.Fatalf("dry run plan %+v, want a cold migration and two direct moves, draining\n%s", p.Plan, p.Text)
	}
	if h, _ := api.Host(ctx, a); h.Drained {
		t.Fatalf("the dry run drained %s", a)
	}

	// First run: the last direct-path VM's live migration fails.
	n.FailLiveMigration(t, direct2, "injected by the test")
	op := runMigrateAll(t, ctx, api, a, b)
	if op.State != "failed" {
		t.Errorf("first operation %s, want failed", op.State)
	}
	for _, vm := range op.VMs {
		want := "done"
		if vm.Instance == direct2 {
			want = "failed"
			if !strings.Contains(vm.Reason, "live-migration") || !strings.Contains(vm.Reason, "stays on "+a) {
				t.Errorf("failed VM's reason %q, want Nova's failed live migration and that it stays on %s", vm.Reason, a)
			}
			if vm.Reservation == "" {
				t.Errorf("failed VM without its reservation consumer recorded")
			} else if al := n.Allocations(t, vm.Reservation); len(al) != 0 {
				t.Errorf("reservation %s of the failed VM holds %v, want it released", vm.Reservation, al)
			}
		}
		if vm.State != want {
			t.Errorf("VM %s (%s) %s: %s, want %s", vm.Name, vm.Instance, vm.State, vm.Reason, want)
		}
	}
	s := n.Server(t, direct2)
	if s.Host != a || s.Status != "ACTIVE" {
		t.Errorf("failed VM on %s %s, want ACTIVE on %s", s.Host, s.Status, a)
	}
	checkVGPU(t, w, direct2, a, gpuA, true)
	if h, _ := api.Host(ctx, a); h.Drained {
		t.Errorf("%s still drained after the first operation", a)
	}

	// Second run: the VM left moves.
	op2 := runMigrateAll(t, ctx, api, a, b)
	if op2.State != "succeeded" || len(op2.VMs) != 1 || op2.VMs[0].Instance != direct2 || op2.VMs[0].State != "done" {
		t.Errorf("second operation %s with %+v, want %s done", op2.State, op2.VMs, direct2)
	}

	// Everything runs on B with its vGPU; A holds nothing.
	servedOn(t, w, "at the end", map[string]bool{novaVM: false, direct1: true, direct2: true}, b, gpuB, gpuA)
	for _, o := range []apiclient.MaintenanceOperation{op, op2} {
		for _, vm := range o.VMs {
			if vm.Reservation != "" {
				if al := n.Allocations(t, vm.Reservation); len(al) != 0 {
					t.Errorf("reservation consumer %s left with %v", vm.Reservation, al)
				}
			}
		}
	}
	fa := n.FakeHost(a)
	if m := fa.Mdevs(t); len(m) != 0 {
		t.Errorf("mdevs left on %s: %v", a, m)
	}
	for _, vm := range all {
		if _, ok := fa.Domain(t, vm); ok {
			t.Errorf("domain of %s left on %s", vm, a)
		}
	}
	if h, err := api.Host(ctx, a); err != nil || h.Drained {
		t.Errorf("%s after the operations: drained %v (%v), want undrained", a, h.Drained, err)
	}
	last, err := api.HostMaintenance(ctx, a)
	if err != nil || last.ID != op2.ID {
		t.Errorf("GET /v1/hosts/%s/migrate-all: %s (%v), want %s", a, last.ID, err, op2.ID)
	}
	for _, vm := range all {
		n.DeleteServer(t, vm)
	}
}

// runMigrateAll starts migrate-all off host to target and waits for its end.
func runMigrateAll(t *testing.T, ctx context.Context, api *apiclient.Client, host, target string) apiclient.MaintenanceOperation {
	t.Helper()
	_, op, err := api.MigrateAllHost(ctx, host, apiclient.MigrateAll{Target: target})
	testsvc.Must(t, err, "migrate-all")
	var ae *apiclient.Error
	if _, _, err := api.MigrateAllHost(ctx, host, apiclient.MigrateAll{Target: target}); !errors.As(err, &ae) || ae.Status != 409 {
		t.Errorf("a second migrate-all while one runs: %v, want 409", err)
	}
	var cur apiclient.MaintenanceOperation
	waitFor(t, 8*time.Minute, "operation "+op.ID+" to end", func() bool {
		cur, err = api.Maintenance(ctx, op.ID)
		testsvc.Must(t, err, "get operation")
		return cur.State != "running"
	})
	b, _ := json.MarshalIndent(cur, "", "  ")
	t.Logf("operation:\n%s", b)
	return cur
}

// servedOn asserts each VM of vms (true: a direct-path one) ACTIVE with
// no task on host, its instance consumer holding VGPU 1 on gpu and
// nothing on other (the other host's GPU), and its vGPU on the host
// (checkVGPU).
func servedOn(t *testing.T, w *directWorld, step string, vms map[string]bool, host, gpu, other string) {
	t.Helper()
	for vm, direct := range vms {
		s := w.n.Server(t, vm)
		if s.Host != host || s.Status != "ACTIVE" || s.TaskState != "" {
			t.Errorf("%s: server %s %s (task %q) on %s, want ACTIVE on %s", step, vm, s.Status, s.TaskState, s.Host, host)
		}
		if al := w.n.Allocations(t, vm); al[gpu]["VGPU"] != 1 || len(al[other]) != 0 {
			t.Errorf("%s: allocations of %s %v, want VGPU 1 on %s and nothing on %s", step, vm, al, gpu, other)
		}
		checkVGPU(t, w, vm, host, gpu, direct)
	}
}

// checkVGPU asserts the VM's vGPU on host: one mdev of the type on the
// host, live in its running domain; a direct-path one also in the
// bridge's records on gpu.
func checkVGPU(t *testing.T, w *directWorld, vm, host, gpu string, direct bool) {
	t.Helper()
	fh := w.n.FakeHost(host)
	dom, ok := fh.Domain(t, vm)
	if !ok {
		t.Errorf("no domain of %s on %s", vm, host)
		return
	}
	mdevs := dom.Mdevs()
	if len(mdevs) != 1 || dom.State != "running" {
		t.Errorf("domain of %s on %s: %s with mdevs %v, want running with one", vm, host, dom.State, mdevs)
		return
	}
	if !slices.ContainsFunc(dom.Hostdevs, func(h libvirt.Hostdev) bool { return h.MdevUUID == mdevs[0] && h.Live }) {
		t.Errorf("mdev %s of %s is not live in its domain on %s: %+v", mdevs[0], vm, host, dom.Hostdevs)
	}
	if m, ok := fh.Mdevs(t)[mdevs[0]]; !ok || m.Type != directType {
		t.Errorf("mdev %s of %s on %s: %+v (found %v), want %s", mdevs[0], vm, host, m, ok, directType)
	}
	if !direct {
		return
	}
	al, err := w.api.Allocations(w.ctx, vm)
	testsvc.Must(t, err, "bridge allocations")
	if len(al.Allocations) != 1 || al.Allocations[0].ProviderUUID != gpu || al.Allocations[0].Host != host {
		t.Errorf("the bridge's allocations of %s: %+v, want one on %s (%s)", vm, al.Allocations, gpu, host)
	}
}
