package e2e

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// The Nova-native path both ways: a vGPU Nova gave through a flavor is
// changed to another profile and given back by resizes the bridge makes;
// a resize that outlives its deadline and one cancelled midway end with
// the server back on a flavor, never in VERIFY_RESIZE.

// More T4 types, each only on the host of the test that uses it.
var (
	typeElasticFrom = vgpuType{"T4-1B", "nvidia-222", 16}
	typeElasticTo   = vgpuType{"T4-2B", "nvidia-223", 8}
	typeOverdue     = vgpuType{"T4-1A", "nvidia-225", 16}
	typeOverdueOK   = vgpuType{"T4-8A", "nvidia-228", 2}
	typeCancel      = vgpuType{"T4-2B4", "nvidia-224", 8}
)

const gpu2PCI = "0000:d8:00.0" // the fake host's other T4

// waitPhase waits until the request shows phase (failing if it ends).
func (w *world) waitPhase(id uuid.UUID, phase string) request {
	w.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		r := w.request(id)
		if r.Phase == phase {
			return r
		}
		if r.State == "succeeded" || r.State == "failed" || r.State == "rejected" || time.Now().After(deadline) {
			w.t.Fatalf("request %s is %s/%s (%s: %s); want phase %s", id, r.State, r.Phase, r.Code, r.Reason, phase)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// phases are the request's phases in the order it went through them
// (its audited transitions).
func (w *world) phases(id uuid.UUID) []string {
	w.t.Helper()
	rows, err := w.pool.Query(w.ctx, `SELECT coalesce(detail->>'phase', '') FROM audit_log
		WHERE request_id = $1 AND action = 'transition' ORDER BY id`, id.String())
	testsvc.Must(w.t, err, "audit")
	defer rows.Close()
	var out []string
	for rows.Next() {
		var p string
		testsvc.Must(w.t, rows.Scan(&p), "audit")
		if p != "" && (len(out) == 0 || out[len(out)-1] != p) {
			out = append(out, p)
		}
	}
	return out
}

// hasInOrder reports whether want appear in got in this order.
func hasInOrder(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// assertVGPU checks Nova's server, Placement and the fake host: the
// server ACTIVE on the world's host on flavor (by its name), holding one
// vGPU of typ on the GPU provider gpu (PCI address pciAddr), or none when
// typ is zero.
func (w *world) assertVGPU(server, flavor string, typ vgpuType, gpu, pciAddr string) {
	t := w.t
	t.Helper()
	s := w.n.Server(t, server)
	if s.Status != "ACTIVE" || s.TaskState != "" || s.Host != w.host || s.Flavor.OriginalName != flavor {
		t.Errorf("server %s is %s (task %q) on %q, flavor %s; want ACTIVE on %s, flavor %s", server, s.Status, s.TaskState, s.Host,
			s.Flavor.OriginalName, w.host, flavor)
	}
	al := w.n.Allocations(t, server)
	if al[w.root]["VCPU"] != 2 || al[w.root]["VGPU"] != 0 {
		t.Errorf("compute node allocations %v, want VCPU 2 and no VGPU", al[w.root])
	}
	vgpus := 0
	for rp, res := range al {
		vgpus += res["VGPU"]
		if res["VGPU"] > 0 && rp != gpu {
			t.Errorf("VGPU allocated on provider %s, want only on %s: %v", rp, gpu, al)
		}
	}
	fh := w.n.FakeHost(w.host)
	dom, ok := fh.Domain(t, server)
	if !ok {
		t.Fatalf("no domain for %s on %s", server, w.host)
	}
	if typ.id == "" {
		if vgpus != 0 || len(dom.Mdevs()) != 0 {
			t.Errorf("after the release: VGPU allocations %v, domain mdevs %v; want none", al, dom.Mdevs())
		}
		return
	}
	if vgpus != 1 || len(dom.Mdevs()) != 1 {
		t.Fatalf("VGPU allocations %v and domain mdevs %v, want one of each", al, dom.Mdevs())
	}
	if m := fh.Mdevs(t)[dom.Mdevs()[0]]; m.Type != typ.id || m.Parent != pciAddr {
		t.Errorf("mdev %+v, want %s on %s", m, typ.id, pciAddr)
	}
}

// assertReleased checks Nova's server, Placement and the fake host after
// a release through Nova: the server ACTIVE on flavor, on whichever host
// Nova's scheduler chose, holding no VGPU anywhere and no mdev in its
// domain there.
func (w *world) assertReleased(server, flavor string) {
	t := w.t
	t.Helper()
	s := w.n.Server(t, server)
	if s.Status != "ACTIVE" || s.TaskState != "" || s.Flavor.OriginalName != flavor {
		t.Errorf("server %s is %s (task %q), flavor %s; want ACTIVE on flavor %s", server, s.Status, s.TaskState, s.Flavor.OriginalName, flavor)
	}
	root := w.n.ComputeNodeProvider(t, s.Host)
	al := w.n.Allocations(t, server)
	if len(al) != 1 || al[root]["VCPU"] != 2 || al[root]["VGPU"] != 0 {
		t.Errorf("allocations after the release %v, want VCPU 2 on the compute node of %s only", al, s.Host)
	}
	dom, ok := w.n.FakeHost(s.Host).Domain(t, server)
	if !ok || len(dom.Mdevs()) != 0 {
		t.Errorf("domain of %s on %s after the release: found %v, mdevs %v; want it without vGPU", server, s.Host, ok, dom.Mdevs())
	}
}

// TestNovaProfileChangeAndRelease: a VM gets a T4-1B through Nova (a
// resize to the flavor with it), then a GPU_RESIZE to T4-2B (a flavor
// whose vGPU is in a granular request group, on the host's other GPU),
// then a GPU_RELEASE back to the flavor without vGPU that the vGPU
// flavor names in vgpu_bridge:release_flavor. Each is a resize Nova does
// and the bridge confirms; the flavor's vGPU was never the bridge's.
func TestNovaProfileChangeAndRelease(t *testing.T) {
	w := newWorld(t, worldOpts{typ: typeElasticFrom})
	gpu2 := w.n.AddVGPUChild(t, w.host, gpu2PCI, typeElasticTo.trait(), typeElasticTo.max)
	plain := w.flavor("small", 2, 2048, 10, 0)
	w.flavor("small.released", 2, 2048, 10, 0) // the release goes here: the vGPU flavor names it
	w.flavor("small.vgpu", 2, 2048, 10, 1)
	w.n.CreateFlavor(t, w.flavorName("small.vgpu-2b"), 2, 2048, 10, map[string]string{
		"resources1:VGPU": "1", "trait1:" + typeElasticTo.trait(): "required", "group_policy": "none",
		"vgpu_bridge:release_flavor": w.flavorName("small.released")})
	w.startBridge()
	vm := w.n.CreateServer(t, "e2e-elastic", plain, w.host)
	w.n.WaitServer(t, vm, "ACTIVE")
	w.waitInstance(vm, w.host, 0)
	w.waitAgent()

	// Grow: the flavor with the T4-1B.
	id := w.gpuRequest(vm, typeElasticFrom.profile)
	if r := w.waitFinal(id); r.State != "succeeded" {
		t.Fatalf("request %s: %s (%s): %s", id, r.State, r.Code, r.Reason)
	}
	w.assertVGPU(vm, w.flavorName("small.vgpu"), typeElasticFrom, w.gpu, gpuPCI)
	w.waitInstance(vm, w.host, 1)

	// Change the profile: the flavor with the T4-2B, on the other GPU.
	change := w.webhook(map[string]any{"type": "GPU_RESIZE", "vm_id": vm, "workload": "training", "vgpu_profile": typeElasticTo.profile})
	r := w.waitFinal(change)
	if r.State != "succeeded" || !strings.Contains(r.Reason, w.flavorName("small.vgpu-2b")) {
		t.Fatalf("GPU_RESIZE %s: %s (%s): %s; want succeeded on %s", change, r.State, r.Code, r.Reason, w.flavorName("small.vgpu-2b"))
	}
	if got := w.phases(change); !hasInOrder(got, []string{"resizing", "verifying", "confirming"}) {
		t.Errorf("phases of the profile change %v, want resizing, verifying, confirming", got)
	}
	w.assertVGPU(vm, w.flavorName("small.vgpu-2b"), typeElasticTo, gpu2, gpu2PCI)
	// Nova frees the old flavor's claim (held by the migration) as it confirms.
	w.waitFor(time.Minute, "the T4-1B GPU free after the change", func() bool { return w.n.Usages(t, w.gpu)["VGPU"] == 0 })
	if got := w.novaCalls(change); got["resize"] != 1 || got["confirm_resize"] != 1 || got["revert_resize"] != 0 {
		t.Errorf("the bridge's Nova calls for the change %v, want one resize and one confirm", got)
	}
	w.waitInstance(vm, w.host, 1)

	// Give it back: the flavor vgpu_bridge:release_flavor names (not
	// "small", which the sizes alone would choose).
	release := w.webhook(map[string]any{"type": "GPU_RELEASE", "vm_id": vm})
	r = w.waitFinal(release)
	if r.State != "succeeded" || !strings.Contains(r.Reason, w.flavorName("small.released")) {
		t.Fatalf("GPU_RELEASE %s: %s (%s): %s; want succeeded on %s", release, r.State, r.Code, r.Reason, w.flavorName("small.released"))
	}
	if got := w.phases(release); !hasInOrder(got, []string{"resizing", "confirming"}) || slices.Contains(got, "verifying") {
		t.Errorf("phases of the release %v, want resizing then confirming (nothing to verify)", got)
	}
	// A flavor without vGPU fits any host: Nova's scheduler may move the
	// server (a cold migration) to another host of the shared Nova.
	w.assertReleased(vm, w.flavorName("small.released"))
	w.waitFor(time.Minute, "the T4-2B GPU free after the release", func() bool { return w.n.Usages(t, gpu2)["VGPU"] == 0 })
	if got := w.novaActions(vm); got["resize"] != 3 || got["confirmResize"] != 3 || got["revertResize"] != 0 {
		t.Errorf("Nova's instance actions %v, want three resizes, each confirmed", got)
	}
	w.waitInstance(vm, w.n.Server(t, vm).Host, 0)
	// Each change wrote its bridge.vgpu_changed event (rules on it tune
	// and limit the VM after the change).
	var changes string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT coalesce(string_agg((payload->>'change') || '/' || (payload->>'path') || '/' || coalesce(payload->>'profile', ''), ',' ORDER BY id), '')
		FROM events WHERE source = 'bridge' AND event_type = 'vgpu_changed' AND instance_uuid = $1`, vm).Scan(&changes), "bridge events")
	if want := "attach/nova/T4-1B,resize/nova/T4-2B,release/nova/"; changes != want {
		t.Errorf("bridge events %q, want %q", changes, want)
	}

	// Nothing left to give back: refused, and Nova is not called.
	again := w.webhook(map[string]any{"type": "GPU_RELEASE", "vm_id": vm})
	if r := w.waitFinal(again); r.State != "rejected" || !strings.Contains(r.Reason, "no vGPU") {
		t.Errorf("a second GPU_RELEASE: %s (%s): %s; want rejected, no vGPU", r.State, r.Code, r.Reason)
	}
	if got := w.novaActions(vm); got["resize"] != 3 {
		t.Errorf("Nova's instance actions after a refused release %v", got)
	}
}

// TestNovaResizeOverdue: Nova is still finishing the resize (its driver
// held) when the bridge's resize_timeout passes: the request shows phase
// overdue, and once Nova finishes, the resize is reverted ([nova]
// on_deadline = revert) and the request fails with nova_timeout; with
// on_deadline = confirm the same late resize is verified and confirmed.
func TestNovaResizeOverdue(t *testing.T) {
	for _, tc := range []struct {
		mode  string
		typ   vgpuType
		state string
	}{
		{"revert", typeOverdue, "failed"},
		{"confirm", typeOverdueOK, "succeeded"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			w := newWorld(t, worldOpts{typ: tc.typ, extra: []string{"nova.resize_timeout=1s", "nova.overdue_check_interval=200ms",
				"nova.on_deadline=" + tc.mode}})
			vm := w.bootPlain("e2e-overdue")

			release := w.n.HoldSpawn(t, vm) // Nova's finish_migration waits
			id := w.gpuRequest(vm, tc.typ.profile)
			r := w.waitPhase(id, "overdue")
			if !strings.Contains(r.Reason, "follows it to its end") {
				t.Errorf("overdue reason %q", r.Reason)
			}
			if s := w.n.Server(t, vm); s.Status != "RESIZE" {
				t.Errorf("server %s is %s (task %q) while its resize is held, want RESIZE", vm, s.Status, s.TaskState)
			}
			release()
			r = w.waitFinal(id)
			if r.State != tc.state || !strings.Contains(r.Reason, "deadline") {
				t.Fatalf("request %s: %s (%s): %s; want %s, saying the deadline passed", id, r.State, r.Code, r.Reason, tc.state)
			}
			calls, actions := w.novaCalls(id), w.novaActions(vm)
			if tc.mode == "revert" {
				if r.Code != "nova_timeout" || !strings.Contains(r.Reason, "Nova reverted the resize") {
					t.Errorf("request %s: code %s, reason %q; want nova_timeout and the revert", id, r.Code, r.Reason)
				}
				s := w.n.WaitServer(t, vm, "ACTIVE")
				if s.Flavor.OriginalName != w.flavorName("small") {
					t.Errorf("server flavor %s after the revert, want %s", s.Flavor.OriginalName, w.flavorName("small"))
				}
				if al := w.n.Allocations(t, vm); al[w.gpu]["VGPU"] != 0 || len(al) != 1 {
					t.Errorf("allocations after the revert %v, want the node's only", al)
				}
				if calls["revert_resize"] != 1 || calls["confirm_resize"] != 0 || actions["revertResize"] != 1 || actions["confirmResize"] != 0 {
					t.Errorf("Nova calls %v, instance actions %v; want one revert, no confirm", calls, actions)
				}
				return
			}
			w.assertResized(vm, "small.vgpu")
			if calls["confirm_resize"] != 1 || calls["revert_resize"] != 0 || actions["confirmResize"] != 1 {
				t.Errorf("Nova calls %v, instance actions %v; want one confirm, no revert", calls, actions)
			}
			if got := w.phases(id); !hasInOrder(got, []string{"resizing", "overdue", "verifying", "confirming"}) {
				t.Errorf("phases %v, want resizing, overdue, verifying, confirming", got)
			}
		})
	}
}

// TestCancelMidResize: an operator cancels a request while Nova resizes;
// the request ends cancelled at once, and when Nova has finished the
// resize the bridge reverts it: the server is back on its flavor, the
// VGPU returned.
func TestCancelMidResize(t *testing.T) {
	w := newWorld(t, worldOpts{typ: typeCancel})
	vm := w.bootPlain("e2e-cancel")

	start := time.Now()
	release := w.n.HoldSpawn(t, vm)
	id := w.gpuRequest(vm, typeCancel.profile)
	w.waitPhase(id, "resizing")
	var cancelled request
	if s := w.call(http.MethodPost, "/v1/requests/"+id.String()+"/cancel", nil, &cancelled); s != http.StatusOK {
		t.Fatalf("cancel answered %d", s)
	}
	if cancelled.State != "failed" || cancelled.Code != "cancelled" {
		t.Errorf("cancelled request: %+v", cancelled)
	}
	t.Logf("cancelled %s after %s", id, time.Since(start))
	release()

	deadline := time.Now().Add(3 * time.Minute)
	for w.novaActions(vm)["revertResize"] == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the bridge did not revert the cancelled resize within 3m (Nova's actions %v)", w.novaActions(vm))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("reverted after %s", time.Since(start))
	s := w.n.WaitServer(t, vm, "ACTIVE")
	if s.Flavor.OriginalName != w.flavorName("small") {
		t.Errorf("server flavor %s after the revert, want %s", s.Flavor.OriginalName, w.flavorName("small"))
	}
	w.waitFor(time.Minute, "the VGPU back in Placement", func() bool {
		al := w.n.Allocations(t, vm)
		return al[w.gpu]["VGPU"] == 0 && len(al) == 1
	})
	if got := w.novaActions(vm); got["confirmResize"] != 0 || got["resize"] != 1 {
		t.Errorf("Nova's instance actions %v, want one resize, reverted, never confirmed", got)
	}
	if r := w.request(id); r.State != "failed" || r.Code != "cancelled" {
		t.Errorf("request after the revert: %+v", r)
	}
	var step string
	w.waitFor(time.Minute, "the resize row done", func() bool {
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT step FROM nova_resizes WHERE request_id = $1`, id).Scan(&step), "nova_resizes")
		return step == "done"
	})
}

// bootPlain creates the world's flavors "small" (2 vCPU, 2 GiB, 10 GB)
// and "small.vgpu" (the same with one vGPU of the world's type), starts
// the bridge, and boots a server on "small" that the bridge and the
// host's agent know.
func (w *world) bootPlain(name string) string {
	w.t.Helper()
	plain := w.flavor("small", 2, 2048, 10, 0)
	w.flavor("small.vgpu", 2, 2048, 10, 1)
	w.startBridge()
	vm := w.n.CreateServer(w.t, name, plain, w.host)
	w.n.WaitServer(w.t, vm, "ACTIVE")
	w.waitInstance(vm, w.host, 0)
	w.waitAgent()
	return vm
}

// waitFor polls ok until it holds, failing after within.
func (w *world) waitFor(within time.Duration, what string, ok func() bool) {
	w.t.Helper()
	waitFor(w.t, within, what, ok)
}

// waitFor polls ok every 100 ms until it holds, failing t after within.
func waitFor(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	testsvc.WaitFor(t, within, what, ok)
}
