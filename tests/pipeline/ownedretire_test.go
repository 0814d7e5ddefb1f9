package pipeline_test

import (
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestBridgeOwnedVFUndeclared: a GPU taken out of [placement]
// bridge_owned_gpus (a bridge restarted without it) while a vGPU of
// the bridge is allocated on its provider keeps the provider, its
// inventory reserved whole (nothing new lands), shown as undeclared;
// once the vGPU is released the provider is deleted (audited) and the
// re-type recorded for the GPU is forgotten; declared again, the GPU gets
// a new provider.
func TestBridgeOwnedVFUndeclared(t *testing.T) {
	t.Parallel()
	w, r1, rp := vfWorldWith(t, replicaOpts{name: "r1", audit: true})
	inst := w.domains[3].UUID
	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": vfProfile})
	if res := w.wait(id, 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("attach: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	vf := w.attachmentRows(inst)[0].PCIAddress
	w.reportedVF(vf, inst, true, 30*time.Second)
	_, err := w.pool.Exec(w.ctx, `INSERT INTO owned_gpu_types (host, pci, type_id, from_type, step) VALUES ($1, $2, $3, $3, 'done')`, w.host, vfPF, vfType)
	testsvc.Must(t, err, "a re-type record")

	// The bridge restarted without the GPU: in use, the provider stays.
	r2 := w.startBridge(replicaOpts{name: "r2", audit: true})
	r2.svc.RefreshHosts(w.ctx)
	n, kept, err := r2.svc.RetireOwned(w.ctx)
	testsvc.Must(t, err, "retire (in use)")
	if n != 0 || len(kept) != 1 || kept[0].Provider != rp || kept[0].Used != 1 || kept[0].PCI != vfPF || kept[0].Host != w.host {
		t.Fatalf("RetireOwned = %d, %+v; want none deleted, %s kept with 1 unit used", n, kept, rp)
	}
	w.wantOwnedInventory(rp, 0, 1) // reserved whole, the vGPU's unit still there
	if w.audits("placement.provider_reserve", rp) != 1 || w.audits("placement.provider_delete", rp) != 0 {
		t.Errorf("audit: %d reserve, %d delete of %s; want 1, 0", w.audits("placement.provider_reserve", rp), w.audits("placement.provider_delete", rp), rp)
	}
	_, err = r2.svc.SyncNow(w.ctx, false, nil)
	testsvc.Must(t, err, "sync r2")
	if g, ok := r2.svc.Index().Lookup(rp); !ok || !r2.svc.IsUndeclaredOwned(&g) {
		t.Errorf("r2's index: %s found %v, want it shown undeclared", rp, ok)
	}
	r1.svc.RefreshHosts(w.ctx) // (its Run would: the test runs none)
	if g, ok := r1.svc.Index().Lookup(rp); !ok || r1.svc.IsUndeclaredOwned(&g) {
		t.Errorf("r1 (which declares the GPU) shows %s undeclared (found %v)", rp, ok)
	}
	// Seen again: still kept, nothing written again.
	if n, kept, err := r2.svc.RetireOwned(w.ctx); err != nil || n != 0 || len(kept) != 1 {
		t.Errorf("RetireOwned again = %d, %+v, %v; want it kept", n, kept, err)
	}
	if got := w.audits("placement.provider_reserve", rp); got != 1 {
		t.Errorf("%d reserve audits after a second round, want 1", got)
	}

	// Released: the provider goes.
	if res := w.wait(w.submit("GPU_RELEASE", inst, nil), 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("release: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	n, kept, err = r2.svc.RetireOwned(w.ctx)
	testsvc.Must(t, err, "retire (free)")
	if n != 1 || len(kept) != 0 {
		t.Fatalf("RetireOwned after the release = %d, %+v; want 1 deleted", n, kept)
	}
	if _, err := resourceproviders.Get(w.ctx, w.sc, rp).Extract(); !gophercloud.ResponseCodeIs(err, 404) {
		t.Errorf("GET provider %s after the retire: %v, want 404", rp, err)
	}
	if _, ok := r2.svc.Index().Lookup(rp); ok {
		t.Errorf("r2's index still has %s", rp)
	}
	if got := w.audits("placement.provider_delete", rp); got != 1 {
		t.Errorf("%d delete audits of %s, want 1", got, rp)
	}
	var rows int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM owned_gpu_types WHERE host = $1 AND pci = $2`, w.host, vfPF).Scan(&rows), "re-type record")
	if rows != 0 {
		t.Errorf("the GPU's re-type record is kept after its provider was deleted")
	}
	// Nova's GPU providers of the host are not the bridge's: untouched.
	for _, pci := range []string{gpuA, gpuB} {
		if _, err := resourceproviders.Get(w.ctx, w.sc, w.gpus[pci]).Extract(); err != nil {
			t.Errorf("Nova's GPU provider %s: %v", w.gpus[pci], err)
		}
	}
	if n, kept, err := r2.svc.RetireOwned(w.ctx); err != nil || n != 0 || len(kept) != 0 {
		t.Errorf("RetireOwned with nothing left = %d, %+v, %v", n, kept, err)
	}

	// Declared again (r1 declares it: a bridge restarted with it): a new
	// provider.
	w.reportedVF(vf, inst, false, 30*time.Second)
	n, err = r1.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish again")
	if n != 1 {
		t.Fatalf("PublishOwned changed %d providers, want 1 (created again)", n)
	}
	rp2 := w.ownedProvider()
	w.gpus[vfPF] = rp2
	if rp2 == rp {
		t.Fatalf("the provider %s was not recreated", rp)
	}
	w.wantOwnedInventory(rp2, 1, 0)
	if n, kept, err := r1.svc.RetireOwned(w.ctx); err != nil || n != 0 || len(kept) != 0 {
		t.Errorf("RetireOwned of the declaring bridge = %d, %+v, %v; want nothing", n, kept, err)
	}
}

// audits counts the audit rows of action on Placement provider rp.
func (w *world) audits(action, rp string) int {
	w.t.Helper()
	var n int
	testsvc.Must(w.t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE action = $1 AND object_type = 'resource_provider' AND object_id = $2`,
		action, rp).Scan(&n), "audit rows")
	return n
}
