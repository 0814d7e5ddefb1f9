package pipeline_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/placementapi"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestBridgeOwnedVFMixedOps: the operator routes over the mixed GPU of
// the fake host (HOST/PF=mixed, 72091 MiB offered). GET /v1/hosts counts
// it beside the two T4s (gpu_count 3, mixed_gpu_count 1) with its
// framebuffer; GET /v1/hosts/{name} lists its row. A dry run for a 35C
// lists it as a candidate (35840 MiB, 36251 left after); one for three
// 35Cs does not fit and lists it rejected with why. POST
// /v1/gpus/{id}/drain drains it (it answered 404 before): GET /v1/gpus
// marks it drained, a dry run rejects it as drained and a 17C attach is
// refused no_capacity with no framebuffer claimed; DELETE undrains it and
// the 17C then succeeds.
func TestBridgeOwnedVFMixedOps(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testPolicy, withVFHetero())
	r, rp := w.ownVFGPU(replicaOpts{name: "r1"}, placement.MixedType)
	const total = 143771 - 71680
	ctl := controls.NewStore(w.pool, nil, logger())
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Auth: api.NoAuth{}})
	ph := placementapi.New(r.svc)
	ph.Marks = ctl
	ph.Register(srv)
	(&controls.API{Store: ctl, Changed: r.svc.RefreshHosts,
		KnownGPU: func(ctx context.Context, id string) (controls.KnownGPU, bool, error) { // as bridge/conf_controls.go
			m, ok, err := r.svc.MixedGPUByProvider(ctx, id)
			return controls.KnownGPU{Node: m.Node, PCIAddress: m.PCI}, ok, err
		}}).Register(srv)
	call := func(method, path string, body any, want int, out any) {
		t.Helper()
		var b []byte
		if body != nil {
			b, _ = json.Marshal(body)
		}
		req := httptest.NewRequest(method, path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		srv.Echo().ServeHTTP(rec, req)
		if rec.Code != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, rec.Code, rec.Body.String(), want)
		}
		if out != nil {
			testsvc.Must(t, json.Unmarshal(rec.Body.Bytes(), out), method+" "+path)
		}
	}

	// 1. GET /v1/hosts and /v1/hosts/{name}.
	var hl struct {
		Hosts []placementapi.Host `json:"hosts"`
	}
	call(http.MethodGet, "/v1/hosts", nil, http.StatusOK, &hl)
	i := slices.IndexFunc(hl.Hosts, func(h placementapi.Host) bool { return h.Node == w.node })
	if i < 0 {
		t.Fatalf("GET /v1/hosts lacks %s: %+v", w.node, hl.Hosts)
	}
	if h := hl.Hosts[i]; h.GPUs != 3 || h.MixedGPUs != 1 || h.Capacity != 8 || h.Framebuffer == nil ||
		*h.Framebuffer != (placementapi.Framebuffer{TotalMiB: total, FreeMiB: total}) || h.Detail != nil {
		t.Errorf("host %s = %+v (framebuffer %+v), want 3 GPUs, 1 mixed, 8 vGPUs of the T4s, %d MiB free", w.node, h, h.Framebuffer, total)
	}
	var one placementapi.Host
	call(http.MethodGet, "/v1/hosts/"+w.host, nil, http.StatusOK, &one)
	if !slices.ContainsFunc(one.Detail, func(g placementapi.GPU) bool { return g.Mode == placementapi.ModeMixed && g.ProviderUUID == rp }) {
		t.Errorf("GET /v1/hosts/%s lacks the mixed GPU's row: %+v", w.host, one.Detail)
	}

	// 2. Dry runs.
	dry := func(count int) placement.DryRunResponse {
		t.Helper()
		var out placement.DryRunResponse
		call(http.MethodPost, "/v1/placements/dry-run", map[string]any{"profile": "H200X-35C", "count": count, "host": w.host}, http.StatusOK, &out)
		return out
	}
	out := dry(1)
	if i := slices.IndexFunc(out.Candidates, func(c placement.DryRunCandidate) bool { return c.ProviderUUID == rp }); i < 0 {
		t.Errorf("dry run for a 35C: no candidate %s in %+v", rp, out)
	} else if c := out.Candidates[i]; c.Mode != placement.ModeMixed || c.FramebufferMiB != 35840 || c.FreeAfter != total-35840 ||
		c.Amount != 1 || c.Trait != "CUSTOM_1430" || c.Profile != "H200X-35C" || c.PCIAddress != vfPF || c.Host != w.host {
		t.Errorf("dry-run candidate = %+v, want mixed, 35840 MiB, %d MiB left", c, total-35840)
	}
	out = dry(3)
	if slices.ContainsFunc(out.Candidates, func(c placement.DryRunCandidate) bool { return c.ProviderUUID == rp }) ||
		len(out.Rejected) != 1 || out.Rejected[0].ProviderUUID != rp || !strings.Contains(out.Rejected[0].Reason, "do not fit") {
		t.Errorf("dry run for three 35Cs = %+v, want the mixed GPU rejected: they do not fit", out)
	}

	// 3. Drain and undrain.
	var st controls.GPUState
	call(http.MethodPost, "/v1/gpus/"+rp+"/drain", map[string]string{"reason": "fan failure"}, http.StatusOK, &st)
	if !st.Drained || !st.Changed || st.PCIAddress != vfPF || st.Node != w.node {
		t.Errorf("drain = %+v, want drained, changed, %s of %s", st, vfPF, w.node)
	}
	// Its gpus row has no resource class: the drift reconciler, which
	// compares the allocations of the GPUs with one, must not judge its
	// framebuffer claims as stale vGPU claims.
	var classless bool
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT resource_class IS NULL FROM gpus WHERE provider_uuid = $1`, rp).Scan(&classless), "gpus row")
	if !classless {
		t.Errorf("gpus row of the drained mixed GPU has a resource class")
	}
	if g := w.mixedAPIRow(srv, rp); !g.Drained || g.DrainReason != "fan failure" {
		t.Errorf("GET /v1/gpus row after the drain = %+v, want drained", g)
	}
	out = dry(1)
	if len(out.Rejected) != 1 || out.Rejected[0].Reason != "GPU drained" {
		t.Errorf("dry run on the drained GPU = %+v, want it rejected as drained", out)
	}
	inst := w.domains[3].UUID
	if res := w.wait(w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "H200X-17C"}), 60*time.Second); res.State != requests.Failed || res.Code != flow.CodeNoCapacity {
		t.Errorf("17C on the drained GPU: %s (%s: %s), want failed %s", res.State, res.Code, res.Reason, flow.CodeNoCapacity)
	}
	if al := w.allocations(inst); al[rp][placement.BridgeFBClass] != 0 {
		t.Errorf("allocations of the refused request = %v", al)
	}
	call(http.MethodDelete, "/v1/gpus/"+rp+"/drain", nil, http.StatusOK, &st)
	if st.Drained || !st.Changed {
		t.Errorf("undrain = %+v, want undrained, changed", st)
	}
	if g := w.mixedAPIRow(srv, rp); g.Drained {
		t.Errorf("GET /v1/gpus row after the undrain = %+v, want not drained", g)
	}
	if res := w.wait(w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "H200X-17C"}), 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("17C after the undrain: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	if al := w.allocations(inst); al[rp][placement.BridgeFBClass] != 17408 {
		t.Errorf("allocations after the undrain = %v, want 17408 %s", al, placement.BridgeFBClass)
	}
	// An unknown id is still 404.
	call(http.MethodPost, "/v1/gpus/00000000-0000-4000-8000-000000000001/drain", map[string]string{"reason": "x"}, http.StatusNotFound, nil)
}

// mixedAPIRow is the mixed GPU rp's row of GET /v1/gpus over srv.
func (w *world) mixedAPIRow(srv *api.Server, rp string) placementapi.GPU {
	w.t.Helper()
	rec := httptest.NewRecorder()
	srv.Echo().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/gpus?host="+w.node, nil))
	var out struct {
		GPUs []placementapi.GPU `json:"gpus"`
	}
	testsvc.Must(w.t, json.Unmarshal(rec.Body.Bytes(), &out), "GET /v1/gpus")
	for _, g := range out.GPUs {
		if g.ProviderUUID == rp {
			return g
		}
	}
	w.t.Fatalf("GET /v1/gpus lacks %s: %s", rp, rec.Body.String())
	return placementapi.GPU{}
}
