package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestNoValidHost is scenario 3: not enough vGPU capacity. The bridge's
// Placement mirror was synced while the GPU was free; another Placement
// client (an operator's reservation, another service: a consumer no Nova
// notification names) then took all of it. The bridge's dry run (on its
// stale mirror) passes, Nova's scheduler (on Placement itself) finds no
// host: compute_task.migrate_server.error ends the request as failed with
// Nova's reason, and the server stays as it was. Once the mirror is
// synced, the next request fails fast without calling Nova.
//
// A tenant's server would not do: the bridge reads the allocations of
// every instance a notification names, so it learns at once what a new
// server holds.
func TestNoValidHost(t *testing.T) {
	w := newWorld(t, worldOpts{typ: typeNoHost, extra: []string{
		// The mirror keeps what the first sync saw.
		"placement.sync_interval=24h", "placement.full_sync_interval=168h"}})
	plain := w.flavor("small", 2, 2048, 10, 0)
	w.flavor("small.vgpu", 2, 2048, 10, 1)
	w.startBridge()
	vm := w.n.CreateServer(t, "e2e-vm", plain, w.host)
	w.n.WaitServer(t, vm, "ACTIVE")
	w.waitInstance(vm, w.host, 0)
	// After the bridge's first sync: the whole GPU to a consumer outside Nova.
	reservation := uuid.NewString()
	err := w.n.PlacementCall(t.Context(), http.MethodPut, "/allocations/"+reservation, map[string]any{
		"allocations":         map[string]any{w.gpu: map[string]any{"resources": map[string]int{"VGPU": w.typ.max}}},
		"project_id":          uuid.NewString(),
		"user_id":             uuid.NewString(),
		"consumer_generation": nil,
		"consumer_type":       "RESERVATION",
	}, nil)
	testsvc.Must(t, err, "reserve the GPU in Placement")
	t.Cleanup(func() {
		_ = w.n.PlacementCall(context.Background(), http.MethodDelete, "/allocations/"+reservation, nil, nil)
	})
	w.waitAgent()

	id := w.gpuRequest(vm, w.typ.profile)
	r := w.waitFinal(id)
	if r.State != "failed" || r.Code != "nova_failed" {
		t.Fatalf("request %s: %s (%s): %s; want failed with nova_failed", id, r.State, r.Code, r.Reason)
	}
	for _, s := range []string{"compute_task.migrate_server.error", "NoValidHost", "No valid host was found"} {
		if !strings.Contains(r.Reason, s) {
			t.Errorf("reason %q lacks %q", r.Reason, s)
		}
	}
	s := w.n.WaitServer(t, vm, "ACTIVE")
	if s.Flavor.OriginalName != w.flavorName("small") {
		t.Errorf("server flavor %s, want %s", s.Flavor.OriginalName, w.flavorName("small"))
	}
	if al := w.n.Allocations(t, vm); al[w.gpu]["VGPU"] != 0 || al[w.root]["VCPU"] != 2 || len(al) != 1 {
		t.Errorf("server allocations %v, want VCPU/MEMORY_MB/DISK_GB on the node only", al)
	}
	if got := w.novaCalls(id); got["resize"] != 1 || got["confirm_resize"] != 0 || got["revert_resize"] != 0 {
		t.Errorf("the bridge's Nova calls %v, want the resize only", got)
	}

	// Synced, the mirror knows the GPU is full: the next request fails
	// fast, with no Nova call.
	if st := w.call(http.MethodPost, "/v1/placements/sync?full=true", nil, nil); st != http.StatusOK {
		t.Fatalf("sync: %d", st)
	}
	id2 := w.gpuRequest(vm, w.typ.profile)
	r2 := w.waitFinal(id2)
	if r2.State != "failed" || r2.Code != "no_capacity" || !strings.Contains(r2.Reason, "Nova was not called") {
		t.Errorf("request after the sync: %s (%s): %s; want failed with no_capacity", r2.State, r2.Code, r2.Reason)
	}
	if got := w.novaCalls(id2); len(got) != 0 {
		t.Errorf("Nova calls for a request the dry run refused: %v", got)
	}
	if got := w.novaActions(vm); got["resize"] != 1 {
		t.Errorf("Nova's instance actions %v, want the one failed resize", got)
	}
}
