// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Nova's moves of a server holding a vGPU, end to end against the real
// Nova (the harness playing Nova 26's libvirt driver on the fake hosts),
// for a flavor vGPU (resources:VGPU, Nova's own mdev) and a direct-path
// vGPU (the bridge's claim in the instance's consumer, the agent's mdev).
// After each move: one vGPU, on the server's host, in Nova, Placement,
// the bridge and on the host; nothing left on the other host.

// moveWorld is a directWorld (host a, its T4, agent, bridge) with a
// second host b with the same T4 and an agent.
type moveWorld struct {
	*directWorld
	b, rootB, gpuB string
	vgpuFlavor     string
}

func newMoveWorld(t *testing.T, prefix string) *moveWorld {
	t.Helper()
	return newMoveWorldWith(t, prefix, directPolicy)
}

// newMoveWorldWith is newMoveWorld with the bridge's policy and extra
// overrides.
func newMoveWorldWith(t *testing.T, prefix, policy string, extra ...string) *moveWorld {
	t.Helper()
	w := &moveWorld{directWorld: newDirectWorldWith(t, prefix+"-a", policy, extra...)}
	w.b = w.n.AddHost(t, prefix+"-b")
	w.rootB = w.n.ComputeNodeProvider(t, w.b)
	w.gpuB = w.n.AddVGPUChild(t, w.b, directGPU, directTrait, 4)
	w.n.StartAgent(t, w.b)
	w.vgpuFlavor = w.n.CreateFlavor(t, testsvc.Name(prefix)+".t4-4q", 2, 2048, 10,
		map[string]string{"resources:VGPU": "1", "trait:" + directTrait: "required"})
	return w
}

// other is the host that is not h, with its providers.
func (w *moveWorld) other(h string) (host, root, gpu string) {
	if h == w.host {
		return w.b, w.rootB, w.gpuB
	}
	return w.host, w.root, w.gpu
}

func (w *moveWorld) gpuOf(h string) string {
	if h == w.host {
		return w.gpu
	}
	return w.gpuB
}

// waitSettled waits until Nova has the server in status with no task,
// and returns it (a failed move leaves it where it was: the caller
// asserts the host).
func (w *moveWorld) waitSettled(vm, status string) novaharness.Server {
	w.t.Helper()
	var s novaharness.Server
	w.waitFor(3*time.Minute, "server "+vm+" "+status+" with no task", func() bool {
		s = w.n.Server(w.t, vm)
		if s.Status == "ERROR" && status != "ERROR" {
			w.t.Fatalf("server %s in ERROR on %s: %s", vm, s.Host, s.Fault)
		}
		return s.Status == status && s.TaskState == ""
	})
	return s
}

// assertOneVGPU asserts the server holds exactly one T4-4Q vGPU, on
// host: in Nova (the server there, ACTIVE), Placement (the instance's
// consumer: VGPU 1 on host's T4, nothing on the other host's providers,
// which no consumer uses), the host (the domain running with one
// nvidia-232 mdev on the T4; the other host without the domain and
// without mdevs) and the bridge (the instance on host; its Placement
// mirror: one VGPU on host's T4; direct: one attachment, attached, on
// host). It returns the mdev.
func (w *moveWorld) assertOneVGPU(step, vm, host string, direct bool) string {
	t := w.t
	t.Helper()
	gpu := w.gpuOf(host)
	oh, oroot, ogpu := w.other(host)
	// What the bridge, Placement and the hosts hold, when a check below
	// fails (a wait's Fatalf included).
	defer func() {
		if t.Failed() {
			w.dump(vm)
		}
	}()
	s := w.n.Server(t, vm)
	if s.Host != host || s.Status != "ACTIVE" || s.TaskState != "" {
		t.Errorf("%s: server on %s, %s (task %q), want ACTIVE on %s", step, s.Host, s.Status, s.TaskState, host)
	}
	// Placement.
	var al map[string]map[string]int
	w.waitFor(time.Minute, step+": the instance's consumer to hold one VGPU on "+host, func() bool {
		al = w.n.Allocations(t, vm)
		total := 0
		for _, res := range al {
			total += res["VGPU"]
		}
		return total == 1 && al[gpu]["VGPU"] == 1 && len(al[oroot]) == 0 && len(al[ogpu]) == 0
	})
	if u := w.n.Usages(t, ogpu); u["VGPU"] != 0 {
		t.Errorf("%s: VGPU used on %s's T4: %d", step, oh, u["VGPU"])
	}
	if u := w.n.Usages(t, gpu); u["VGPU"] != 1 {
		t.Errorf("%s: VGPU used on %s's T4: %d, want 1", step, host, u["VGPU"])
	}
	// The hosts.
	fh, fo := w.n.FakeHost(host), w.n.FakeHost(oh)
	var mdev string
	w.waitFor(time.Minute, step+": one mdev in the running domain on "+host, func() bool {
		d, ok := fh.Domain(t, vm)
		if !ok || d.State != "running" || len(d.Mdevs()) != 1 {
			return false
		}
		mdev = d.Mdevs()[0]
		return len(fh.Mdevs(t)) == 1
	})
	if m := fh.Mdevs(t)[mdev]; m.Type != directType || m.Parent != directGPU {
		t.Errorf("%s: mdev %s is %+v, want %s on %s", step, mdev, m, directType, directGPU)
	}
	var left string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		_, ok := fo.Domain(t, vm)
		ms := fo.Mdevs(t)
		if !ok && len(ms) == 0 {
			break
		}
		left = fmt.Sprintf("domain defined %v, mdevs %v", ok, ms)
		if time.Now().After(deadline) {
			t.Errorf("%s: left on %s after 1m: %s", step, oh, left)
			break
		}
	}
	// The bridge.
	var seen string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		in, err := w.api.Instance(w.ctx, vm)
		testsvc.Must(t, err, "bridge instance")
		l, err := w.api.Allocations(w.ctx, vm)
		testsvc.Must(t, err, "bridge allocations")
		n, elsewhere := 0, 0
		for _, a := range l.Allocations {
			if a.ResourceClass == "VGPU" {
				n += a.Amount
				if a.ProviderUUID != gpu {
					elsewhere += a.Amount
				}
			}
		}
		if in.Host != nil && *in.Host == host && n == 1 && elsewhere == 0 {
			break
		}
		seen = fmt.Sprintf("instance host %v, allocations %+v", ptrString(in.Host), l.Allocations)
		if time.Now().After(deadline) {
			t.Fatalf("%s: the bridge's view of %s after 1m: %s; want on %s with VGPU 1 on %s", step, vm, seen, host, gpu)
		}
	}
	if direct {
		w.waitFor(time.Minute, step+": the bridge's one attachment of "+vm+" attached on "+host, func() bool {
			rows, err := w.pool.Query(w.ctx, `SELECT coalesce(host,'') FROM vgpu_attachments WHERE instance_uuid = $1 AND state = 'attached'`, vm)
			testsvc.Must(t, err, "attachments")
			hosts, err := pgx.CollectRows(rows, pgx.RowTo[string])
			testsvc.Must(t, err, "attachment")
			return len(hosts) == 1 && hosts[0] == host
		})
	}
	return mdev
}

// bridgeIdle waits until the bridge has no request of vm open.
func (w *moveWorld) bridgeIdle(step, vm string) {
	w.t.Helper()
	w.waitFor(3*time.Minute, step+": the bridge's requests of "+vm+" to end", func() bool {
		l, err := w.api.Requests(w.ctx, apiclient.RequestFilter{InstanceUUID: vm})
		testsvc.Must(w.t, err, "requests")
		for _, r := range l.Requests {
			if r.State != "succeeded" && r.State != "failed" && r.State != "rejected" {
				return false
			}
		}
		return true
	})
}

// movesOnBothPaths runs on a server holding a vGPU, on host a: a hard
// reboot, a rebuild, a cold migration to b confirmed, a live migration
// back that Nova 26 refuses, and (withRevert) a cold migration to a
// reverted.
func (w *moveWorld) movesOnBothPaths(vm string, direct, withRevert bool) {
	t := w.t
	a, b := w.host, w.b
	mdev := w.assertOneVGPU("boot", vm, a, direct)

	// Hard reboot: libvirt's _hard_reboot defines the guest again with
	// its assigned mdevs: the same mdev.
	w.n.ServerAction(t, vm, map[string]any{"reboot": map[string]any{"type": "HARD"}})
	w.waitSettled(vm, "ACTIVE")
	w.bridgeIdle("hard reboot", vm)
	if got := w.assertOneVGPU("hard reboot", vm, a, direct); got != mdev {
		t.Errorf("hard reboot: mdev %s, want the same %s", got, mdev)
	}

	// Rebuild on the same host: destroy and spawn with the instance's
	// allocations (ComputeManager._rebuild_default_impl).
	w.n.ServerAction(t, vm, map[string]any{"rebuild": map[string]any{"imageRef": novaharness.ImageID}})
	w.waitSettled(vm, "ACTIVE")
	w.bridgeIdle("rebuild", vm)
	w.assertOneVGPU("rebuild", vm, a, direct)

	// Cold migration to b, confirmed.
	w.n.ServerAction(t, vm, map[string]any{"migrate": map[string]any{"host": b}})
	if s := w.waitSettled(vm, "VERIFY_RESIZE"); s.Host != b {
		t.Fatalf("cold migration awaiting the confirm on %s, want %s", s.Host, b)
	}
	w.n.ServerAction(t, vm, map[string]any{"confirmResize": nil})
	w.waitSettled(vm, "ACTIVE")
	w.waitFor(time.Minute, "the migration consumer to be dropped after the confirm", func() bool {
		ms := w.n.Migrations(t, vm)
		return len(ms) > 0 && ms[0].Status == "confirmed" && len(w.n.Allocations(t, ms[0].UUID)) == 0
	})
	w.bridgeIdle("cold migration confirmed", vm)
	mdev = w.assertOneVGPU("cold migration confirmed", vm, b, direct)

	// Live migration back to a: libvirt refuses a guest with an mdev,
	// Nova rolls back; the vGPU is intact on b.
	w.n.LiveMigrate(t, vm, a)
	w.waitFor(2*time.Minute, "the live migration to fail", func() bool {
		ms := w.n.Migrations(t, vm)
		return len(ms) > 0 && ms[0].Type == "live-migration" && (ms[0].Status == "error" || ms[0].Status == "failed")
	})
	w.waitSettled(vm, "ACTIVE")
	if !slices.Contains(w.n.FakeHost(b).Events(), "live_migration_failed "+vm) {
		t.Errorf("live migration: the driver on %s never refused it: %v", b, w.n.FakeHost(b).Events())
	}
	w.bridgeIdle("live migration refused", vm)
	if got := w.assertOneVGPU("live migration refused", vm, b, direct); got != mdev {
		t.Errorf("live migration refused: mdev %s, want the same %s", got, mdev)
	}

	if !withRevert {
		return
	}
	// Cold migration to a, reverted: back on b, where the source's guest
	// kept its mdev through the migration (finish_revert_migration).
	w.n.ServerAction(t, vm, map[string]any{"migrate": map[string]any{"host": a}})
	if s := w.waitSettled(vm, "VERIFY_RESIZE"); s.Host != a {
		t.Fatalf("cold migration awaiting the confirm on %s, want %s", s.Host, a)
	}
	if direct {
		// The bridge keeps the source's vGPU until the confirm: its mdev
		// stays in the shut-off domain on b. The revert waits for the
		// destination's vGPU to be attached, as a user would: the agent's
		// fake hot-plug (define, then restart) is not atomic against the
		// harness's destroy of the guest, and may define it again. A
		// revert during the re-apply is TestMoveColdMigrationConfirmOrRevert
		// in tests/pipeline.
		w.bridgeIdle("cold migration awaiting the confirm", vm)
		w.waitFor(time.Minute, "the bridge to keep the vGPU on "+b+" for the revert", func() bool {
			var n int
			err := w.pool.QueryRow(w.ctx, `SELECT count(*) FROM vgpu_attachments WHERE instance_uuid = $1 AND state = 'kept' AND host = $2 AND id = $3`,
				vm, b, mdev).Scan(&n)
			testsvc.Must(t, err, "kept attachments")
			return n == 1
		})
		if _, ok := w.n.FakeHost(b).Mdevs(t)[mdev]; !ok {
			t.Errorf("awaiting the confirm: mdev %s gone from %s", mdev, b)
		}
	}
	w.n.ServerAction(t, vm, map[string]any{"revertResize": nil})
	w.waitSettled(vm, "ACTIVE")
	w.bridgeIdle("cold migration reverted", vm)
	if got := w.assertOneVGPU("cold migration reverted", vm, b, direct); got != mdev {
		t.Errorf("cold migration reverted: mdev %s, want the source's %s", got, mdev)
	}
	if ms := w.n.Migrations(t, vm); len(ms) == 0 || ms[0].Status != "reverted" || len(w.n.Allocations(t, ms[0].UUID)) != 0 {
		t.Errorf("after the revert: migrations %+v, want the newest reverted, its consumer empty", ms)
	}

}

// TestMovesFlavorVGPU: a server of a resources:VGPU flavor through a hard
// reboot, a rebuild, a cold migration confirmed, a live migration Nova 26
// refuses and a cold migration reverted.
func TestMovesFlavorVGPU(t *testing.T) {
	w := newMoveWorld(t, "mvf")
	vm := w.n.CreateServer(t, "e2e-move-flavor", w.vgpuFlavor, w.host)
	w.n.WaitServer(t, vm, "ACTIVE")
	w.movesOnBothPaths(vm, false, true)
	w.n.DeleteServer(t, vm)
}

// TestMovesDirectVGPU: the same moves with a direct-path vGPU the bridge
// attached to a server of a plain flavor. Until a cold migration is
// confirmed the bridge keeps the vGPU on the source (its mdev in the
// source's shut-off domain, its claim in Nova's migration consumer), so
// the revert starts the guest there again with the same mdev (the harness
// refuses a guest whose mdev is gone, as libvirt does); the destination's
// vGPU is removed again.
func TestMovesDirectVGPU(t *testing.T) {
	w := newMoveWorld(t, "mvd")
	vm := w.bootServer("e2e-move-direct")
	w.attachDirect(vm)
	w.movesOnBothPaths(vm, true, true)
	w.n.DeleteServer(t, vm)
}

// shelveAndUnshelve shelves the server holding a vGPU on host a (Nova 26
// offloads it at once: shelved_offload_time 0, which deletes its
// allocations and its guest) and unshelves it on host b (a's compute
// disabled; the scheduler claims anew there): nothing is left anywhere
// while it is offloaded, and one vGPU on b afterwards, none on a.
func (w *moveWorld) shelveAndUnshelve(vm string, direct bool) {
	t := w.t
	w.assertOneVGPU("boot", vm, w.host, direct)

	w.n.ServerAction(t, vm, map[string]any{"shelve": nil})
	w.waitSettled(vm, "SHELVED_OFFLOADED")
	w.bridgeIdle("shelve offload", vm)
	w.waitFor(time.Minute, "nothing left of "+vm+" on the hosts and in Placement once offloaded", func() bool {
		for _, h := range []string{w.host, w.b} {
			fh := w.n.FakeHost(h)
			if _, ok := fh.Domain(t, vm); ok || len(fh.Mdevs(t)) != 0 {
				return false
			}
		}
		return len(w.n.Allocations(t, vm)) == 0 && w.n.Usages(t, w.gpu)["VGPU"] == 0 && w.n.Usages(t, w.gpuB)["VGPU"] == 0
	})
	if direct {
		var live, shelved int
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FILTER (WHERE state IN ('pending','attached','releasing','held','kept')),
			count(*) FILTER (WHERE shelved AND state = 'released') FROM vgpu_attachments WHERE instance_uuid = $1`, vm).Scan(&live, &shelved), "attachments")
		if live != 0 || shelved != 1 {
			t.Errorf("offloaded: %d live vGPU(s) and %d shelved, want none and one", live, shelved)
		}
	}
	// The bridge's mirror follows shelve_offload.end (the flavor path has
	// no request to wait for).
	w.waitFor(time.Minute, "the bridge's mirror to drop the VGPU of "+vm+" once offloaded", func() bool {
		l, err := w.api.Allocations(w.ctx, vm)
		testsvc.Must(t, err, "bridge allocations")
		for _, a := range l.Allocations {
			if a.ResourceClass == "VGPU" {
				return false
			}
		}
		return true
	})

	// Unshelved elsewhere: host a's compute is disabled, the scheduler
	// chooses b.
	w.n.DisableCompute(t, w.host, true)
	w.n.ServerAction(t, vm, map[string]any{"unshelve": nil})
	s := w.waitSettled(vm, "ACTIVE")
	w.n.DisableCompute(t, w.host, false)
	if s.Host != w.b {
		t.Fatalf("unshelved on %s, want %s (%s disabled)", s.Host, w.b, w.host)
	}
	w.bridgeIdle("unshelve", vm)
	w.assertOneVGPU("unshelve", vm, w.b, direct)
}

// TestMovesShelveFlavorVGPU: a server of a resources:VGPU flavor shelved
// (offloaded) and unshelved against the real Nova.
func TestMovesShelveFlavorVGPU(t *testing.T) {
	w := newMoveWorld(t, "msf")
	vm := w.n.CreateServer(t, "e2e-shelve-flavor", w.vgpuFlavor, w.host)
	w.n.WaitServer(t, vm, "ACTIVE")
	w.shelveAndUnshelve(vm, false)
	w.n.DeleteServer(t, vm)
}

// TestMovesShelveDirectVGPU: a direct-path vGPU through a shelve offload
// (its mdev removed, the vGPU marked shelved) and an unshelve (applied
// again where Nova put the server).
func TestMovesShelveDirectVGPU(t *testing.T) {
	w := newMoveWorld(t, "msd")
	vm := w.bootServer("e2e-shelve-direct")
	w.attachDirect(vm)
	w.shelveAndUnshelve(vm, true)
	w.n.DeleteServer(t, vm)
}

func ptrString(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// dump logs what the bridge, Placement and the hosts hold for vm.
func (w *moveWorld) dump(vm string) {
	t := w.t
	l, _ := w.api.Requests(w.ctx, apiclient.RequestFilter{InstanceUUID: vm})
	for _, r := range l.Requests {
		t.Logf("request %s %s: %s/%s (%s) %s", r.ID, r.Kind, r.State, r.Phase, r.Code, r.Reason)
	}
	t.Logf("allocations %v", w.n.Allocations(t, vm))
	for _, h := range []string{w.host, w.b} {
		d, ok := w.n.FakeHost(h).Domain(t, vm)
		t.Logf("%s: domain %+v (%v), mdevs %v, events %v", h, d, ok, w.n.FakeHost(h).Mdevs(t), w.n.FakeHost(h).Events())
	}
	rows, err := w.pool.Query(w.ctx, `SELECT state, coalesce(host,''), coalesce(provider_uuid::text,''), coalesce(reason,'') FROM vgpu_attachments WHERE instance_uuid = $1 ORDER BY created_at`, vm)
	if err == nil {
		for rows.Next() {
			var a, b, c, d string
			_ = rows.Scan(&a, &b, &c, &d)
			t.Logf("attachment %s on %s provider %s: %s", a, b, c, d)
		}
		rows.Close()
	}
}
