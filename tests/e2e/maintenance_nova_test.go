// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestMaintenanceNovaMoves drives, against the real Nova, the moves that
// host maintenance (bridge/maintenance) makes through the bridge's compute
// client: the host listing; a cold migration of a Nova-path vGPU server
// to a given host, during which Nova's migration consumer holds the
// source's vGPU in Placement (what the drift reconciler must not report),
// confirmed; and a live migration of a server without a vGPU (a
// direct-path VM once its vGPU is detached).
func TestMaintenanceNovaMoves(t *testing.T) {
	n := sharedNova(t)
	a, b := n.AddHost(t, "mnt-a"), n.AddHost(t, "mnt-b")
	gpuA := n.AddVGPUChild(t, a, "0000:3b:00.0", "CUSTOM_NVIDIA_232", 4)
	gpuB := n.AddVGPUChild(t, b, "0000:3b:00.0", "CUSTOM_NVIDIA_232", 4)
	prefix := testsvc.Name("mnt")
	vgpuFlavor := n.CreateFlavor(t, prefix+".t4-4q", 2, 2048, 10, map[string]string{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "required"})
	plainFlavor := n.CreateFlavor(t, prefix+".small", 1, 512, 1, nil)
	novaVM := n.CreateServer(t, prefix+"-nova", vgpuFlavor, a)
	plainVM := n.CreateServer(t, prefix+"-plain", plainFlavor, a)
	n.WaitServer(t, novaVM, "ACTIVE")
	n.WaitServer(t, plainVM, "ACTIVE")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := computeapi.New(ctx, computeapi.Config{Endpoint: n.ComputeEndpoint(), Token: n.Token()})
	testsvc.Must(t, err, "compute client")
	on, err := c.ServersOnHost(ctx, a, "")
	testsvc.Must(t, err, "servers on host")
	ids := map[string]bool{}
	for _, s := range on {
		ids[s.ID] = true
	}
	if len(on) != 2 || !ids[novaVM] || !ids[plainVM] {
		t.Fatalf("servers on %s: %+v, want the two of the test", a, on)
	}

	// Cold migration of the Nova-path vGPU server to b.
	testsvc.Must(t, c.Migrate(ctx, novaVM, b, ""), "migrate")
	s := n.WaitServer(t, novaVM, "VERIFY_RESIZE")
	if s.Host != b {
		t.Errorf("server awaiting the confirm on %s, want %s", s.Host, b)
	}
	ms, err := c.Migrations(ctx, novaVM, "")
	testsvc.Must(t, err, "migrations")
	if len(ms) == 0 || ms[0].UUID == "" || ms[0].Type != "migration" || ms[0].Status != "finished" || ms[0].SourceHost != a || ms[0].DestHost != b {
		t.Fatalf("migrations of the server %+v, want a finished cold migration %s → %s with its uuid", ms, a, b)
	}
	mig := ms[0].UUID
	if al := n.Allocations(t, mig); al[gpuA]["VGPU"] != 1 {
		t.Errorf("Nova's migration consumer %s holds %v, want the source's VGPU on %s", mig, al, gpuA)
	}
	if al := n.Allocations(t, novaVM); al[gpuB]["VGPU"] != 1 || len(al[gpuA]) != 0 {
		t.Errorf("instance consumer during the move %v, want VGPU on %s only", al, gpuB)
	}
	testsvc.Must(t, c.ConfirmResize(ctx, novaVM, ""), "confirm")
	s = n.WaitServer(t, novaVM, "ACTIVE")
	if s.Host != b {
		t.Errorf("server on %s after the confirm, want %s", s.Host, b)
	}
	// The source compute drops the migration's allocations as it
	// finishes the confirm, which may be just after the server is ACTIVE.
	var left map[string]map[string]int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if left = n.Allocations(t, mig); len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) != 0 {
		t.Errorf("migration consumer 30s after the confirm: %v", left)
	}
	if al := n.Allocations(t, novaVM); al[gpuB]["VGPU"] != 1 || len(al[gpuA]) != 0 {
		t.Errorf("instance consumer after the confirm %v, want VGPU on %s only", al, gpuB)
	}
	fa, fb := n.FakeHost(a), n.FakeHost(b)
	if _, ok := fa.Domain(t, novaVM); ok || len(fa.Mdevs(t)) != 0 {
		t.Errorf("left on %s: domain %v, mdevs %v", a, ok, fa.Mdevs(t))
	}
	d, ok := fb.Domain(t, novaVM)
	if !ok || len(d.Mdevs()) != 1 || fb.Mdevs(t)[d.Mdevs()[0]].Type != "nvidia-232" {
		t.Errorf("on %s: domain %+v (found %v), mdevs %v; want one nvidia-232 mdev in the domain", b, d, ok, fb.Mdevs(t))
	}

	// Live migration of the server without a vGPU. (A Nova-path vGPU
	// server is not live-migrated here: FakeDriver checks no libvirt or
	// QEMU version, so it would say nothing of a real host.)
	testsvc.Must(t, c.LiveMigrate(ctx, plainVM, b, ""), "live-migrate")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		s = n.Server(t, plainVM)
		if s.Host == b && s.Status == "ACTIVE" && s.TaskState == "" {
			break
		}
		if s.Status == "ERROR" || time.Now().After(deadline) {
			t.Fatalf("live migration: server %s on %s (task %q, fault %q)", s.Status, s.Host, s.TaskState, s.Fault)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, ok := fa.Domain(t, plainVM); ok {
		t.Errorf("domain of the live-migrated server still on %s", a)
	}
	if d, ok := fb.Domain(t, plainVM); !ok || d.State != "running" {
		t.Errorf("domain of the live-migrated server on %s: %+v (found %v)", b, d, ok)
	}
	// The server shows its new host before the source marks the
	// migration completed: a mover waits for the record.
	for {
		ms, err := c.Migrations(ctx, plainVM, "")
		testsvc.Must(t, err, "migrations")
		if len(ms) > 0 && ms[0].Type == "live-migration" && ms[0].Finished() {
			if ms[0].Status != "completed" {
				t.Errorf("live migration ended %s, want completed", ms[0].Status)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("live migration record %+v, want a finished live-migration", ms)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if on, err := c.ServersOnHost(ctx, a, ""); err != nil || len(on) != 0 {
		t.Errorf("servers left on %s: %+v (%v)", a, on, err)
	}
	n.DeleteServer(t, novaVM)
	n.DeleteServer(t, plainVM)
}
