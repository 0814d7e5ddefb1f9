package pipeline_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocationcandidates"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/placementapi"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// The type the tests re-type the bridge-owned GPU to: H200X-35C, four per
// GPU, creatable once no VF of the GPU holds another type.
const (
	retypeTo      = "1430"
	retypeTrait   = "CUSTOM_1430"
	retypeProfile = "H200X-35C"
)

// errCrash stops a re-type at a step, as a bridge that stops there.
var errCrash = errors.New("bridge stopped")

// retypeService is a placement service of a bridge (another replica of
// the world's) that owns the VF GPU; hook, when set, sees each step.
func (w *world) retypeService(name string, hook func(step string) error) *placement.Service {
	w.t.Helper()
	svc, err := placement.New(w.ctx, placement.Config{Client: placement.ClientConfig{Endpoint: testsvc.PlacementURL(w.t), Token: "admin"},
		SyncConcurrency: 4, Replica: name, OwnedGPUs: []placement.OwnedDecl{{Host: w.host, PCI: vfPF, TypeID: vfType}},
		RetypeStepHook: hook}, w.pool, w.holder.Catalog(), logger())
	testsvc.Must(w.t, err, "placement service "+name)
	return svc
}

// emptyVFGPU clears the type of the VF Nova typed (as an operator who
// took the GPU from Nova would), so the whole GPU is the bridge's and
// every type is creatable, and waits for a report that says so.
func (w *world) emptyVFGPU() {
	w.t.Helper()
	h, err := fakehost.Load(w.fake)
	testsvc.Must(w.t, err, "load the fake host")
	testsvc.Must(w.t, h.Kernel.WriteFile(filepath.Join(h.SysRoot, "bus", "pci", "devices", novaVF, "nvidia", "current_vgpu_type"), []byte("0\n")),
		"clear the type of "+novaVF)
	w.waitFor(30*time.Second, "a report with type "+retypeTo+" creatable on "+vfPF, func() bool {
		r, ok := w.report()
		if !ok {
			return false
		}
		for _, g := range r.GPUs {
			if g.PCI == vfPF && slices.ContainsFunc(g.Types, func(t protocol.VGPUType) bool { return t.ID == retypeTo && t.AvailableInstances == 4 }) {
				return true
			}
		}
		return false
	})
}

// retypeAPI posts a re-type to the operator API route over svc (as
// vgpuctl gpu retype does): the status, the body and its content type.
func (w *world) retypeAPI(svc *placement.Service, pf, typeID string) (int, string, string) {
	w.t.Helper()
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Auth: api.NoAuth{}})
	placementapi.New(svc).Register(srv)
	req := httptest.NewRequest(http.MethodPost, "/v1/hosts/"+w.host+"/gpus/"+pf+"/retype", strings.NewReader(`{"type_id": "`+typeID+`"}`))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	srv.Echo().ServeHTTP(rec, req)
	return rec.Code, rec.Body.String(), rec.Header().Get("Content-Type")
}

// ownedCandidates asks Placement for one unit of the bridge's class with
// the type's trait in the world's tree: the providers it offers.
//
// Placement refuses a query that requires a trait it does not know (400
// "No such trait"): on a fresh Placement CUSTOM_1430 exists only once a
// re-type made it, so the trait is created first (as the bridge does
// before it sets one).
func (w *world) ownedCandidates(trait string) []string {
	w.t.Helper()
	testsvc.Must(w.t, traits.Create(w.ctx, w.sc, trait).ExtractErr(), "create trait "+trait)
	pages, err := allocationcandidates.List(w.sc, allocationcandidates.ListOpts{Resources: placement.BridgeClass + ":1",
		Required: []string{trait}, InTree: w.root}).AllPages(w.ctx)
	testsvc.Must(w.t, err, "allocation candidates")
	ac, err := allocationcandidates.ExtractAllocationCandidates(pages)
	testsvc.Must(w.t, err, "allocation candidates")
	var out []string
	for _, ar := range ac.AllocationRequests {
		for rp := range ar.Allocations {
			if !slices.Contains(out, rp) {
				out = append(out, rp)
			}
		}
	}
	return out
}

// wantOffers checks which of the two types Placement offers on rp.
func (w *world) wantOffers(rp string, old, new bool) {
	w.t.Helper()
	w.wantOffersOf(vfRetype, rp, old, new)
}

// wantOffersOf checks which of the two types of c Placement offers on rp.
func (w *world) wantOffersOf(rc retypeCase, rp string, old, new bool) {
	w.t.Helper()
	for _, c := range []struct {
		trait string
		want  bool
	}{{rc.fromTrait, old}, {rc.toTrait, new}} {
		if got := slices.Contains(w.ownedCandidates(c.trait), rp); got != c.want {
			w.t.Errorf("allocation candidates %s:1 required=%s offer %s: %v, want %v", placement.BridgeClass, c.trait, rp, got, c.want)
		}
	}
}

func (w *world) wantTraits(rp string, want ...string) {
	w.t.Helper()
	tr, err := resourceproviders.GetTraits(w.ctx, w.sc, rp).Extract()
	testsvc.Must(w.t, err, "traits")
	if !slices.Equal(tr.Traits, want) && !(len(want) == 0 && len(tr.Traits) == 0) {
		w.t.Errorf("traits of %s = %v, want %v", rp, tr.Traits, want)
	}
}

// TestBridgeOwnedVFRetype: an empty bridge-owned VF GPU declared for
// 1429 is re-typed to 1430: its provider then has the trait of 1430 only
// and four usable units (the GPU's 8 VFs hold four H200X-35C), Placement
// offers 1430 on it and never 1429, the bridge's state says 1430, and a
// direct-path request for H200X-35C types a VF 1430 on it. A re-type
// after a restart keeps 1430 (the bridge's state, not the declaration).
func TestBridgeOwnedVFRetype(t *testing.T) {
	t.Parallel()
	w, r, rp := vfWorld(t)
	w.emptyVFGPU()
	_, err := r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish the empty GPU")
	w.wantOwnedInventory(rp, 2, 0)
	w.wantOffers(rp, true, false)

	code, body, _ := w.retypeAPI(r.svc, vfPF, retypeTo)
	if code != http.StatusOK {
		t.Fatalf("POST retype: %d %s", code, body)
	}
	var res placementapi.RetypeResult
	testsvc.Must(t, json.Unmarshal([]byte(body), &res), "retype answer")
	if res.TypeID != retypeTo || res.Step != placement.RetypeDone || res.PCI != vfPF {
		t.Errorf("retype answer = %+v, want %s %s done", res, vfPF, retypeTo)
	}
	var detail string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT detail::text FROM audit_log WHERE action = 'gpu.retype' AND object_id = $1`,
		w.host+"/"+vfPF).Scan(&detail), "audit row")
	if !strings.Contains(detail, `"from": "`+vfType+`"`) || !strings.Contains(detail, `"to": "`+retypeTo+`"`) {
		t.Errorf("audit detail = %s, want from %s to %s", detail, vfType, retypeTo)
	}
	w.wantTraits(rp, retypeTrait)
	w.wantOwnedInventory(rp, 4, 0)
	w.wantOffers(rp, false, true)
	w.wantNeverVGPUCandidate(rp)
	typ, step, err := r.svc.OwnedType(w.ctx, w.host, vfPF)
	testsvc.Must(t, err, "owned type")
	if typ != retypeTo || step != placement.RetypeDone {
		t.Errorf("bridge's type of %s = %s (%s), want %s (%s)", vfPF, typ, step, retypeTo, placement.RetypeDone)
	}
	// Publishing again (every sync does) keeps the new type.
	n, err := r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish after the re-type")
	if n != 0 {
		t.Errorf("PublishOwned after the re-type changed %d providers, want 0", n)
	}
	w.wantTraits(rp, retypeTrait)

	inst := w.domains[3].UUID
	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": retypeProfile})
	if res := w.wait(id, 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("attach %s: %s (%s: %s)", retypeProfile, res.State, res.Code, res.Reason)
	}
	w.attachedVF(inst, rp, retypeTo)
}

// TestBridgeOwnedVFRetypeRefused: a re-type is refused for a GPU that is
// not bridge-owned, for a type the agent does not report creatable (Nova's
// VF holds 1429, so the GPU's other VFs can take 1429 only), and for a GPU
// with a vGPU of the bridge; each refusal leaves the provider as it was.
func TestBridgeOwnedVFRetypeRefused(t *testing.T) {
	t.Parallel()
	w, r, rp := vfWorld(t)
	if err := r.svc.Retype(w.ctx, w.host, "0000:3b:00.0", retypeTo); !errors.Is(err, placement.ErrRetypeNotOwned) {
		t.Errorf("re-type of a T4: %v, want %v", err, placement.ErrRetypeNotOwned)
	}
	if err := r.svc.Retype(w.ctx, w.host, vfPF, retypeTo); !errors.Is(err, placement.ErrRetypeNotCreatable) {
		t.Errorf("re-type to %s beside Nova's %s VF: %v, want %v", retypeTo, vfType, err, placement.ErrRetypeNotCreatable)
	}
	for _, c := range []struct {
		pf, typeID string
		want       int
		title      string
	}{
		{"0000:3b:00.0", retypeTo, http.StatusNotFound, "GPU not bridge-owned"},
		{vfPF, retypeTo, http.StatusUnprocessableEntity, "Type not creatable"},
		{vfPF, "H200X-35C", http.StatusUnprocessableEntity, "Invalid request"},
	} {
		code, body, ctype := w.retypeAPI(r.svc, c.pf, c.typeID)
		if code != c.want || ctype != "application/problem+json" || !strings.Contains(body, `"title":"`+c.title+`"`) {
			t.Errorf("POST retype %s %s: %d %s (%s), want %d problem+json %q", c.pf, c.typeID, code, body, ctype, c.want, c.title)
		}
	}
	w.wantTraits(rp, vfTrait)
	w.wantOwnedInventory(rp, 1, 0)

	w.emptyVFGPU()
	inst := w.domains[3].UUID
	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": vfProfile})
	if res := w.wait(id, 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("attach: %s (%s: %s)", res.State, res.Code, res.Reason)
	}
	// In use by its allocation before the agent's report shows the VF.
	if err := r.svc.Retype(w.ctx, w.host, vfPF, retypeTo); !errors.Is(err, placement.ErrRetypeInUse) {
		t.Errorf("re-type of a GPU in use: %v, want %v", err, placement.ErrRetypeInUse)
	}
	w.reportedVF(w.attachments(inst)[0].pci, inst, true, 30*time.Second)
	if err := r.svc.Retype(w.ctx, w.host, vfPF, retypeTo); !errors.Is(err, placement.ErrRetypeInUse) {
		t.Errorf("re-type of a GPU with a typed VF: %v, want %v", err, placement.ErrRetypeInUse)
	}
	if code, body, _ := w.retypeAPI(r.svc, vfPF, retypeTo); code != http.StatusConflict {
		t.Errorf("POST retype of a GPU in use: %d %s, want 409", code, body)
	}
	w.wantTraits(rp, vfTrait)
	typ, step, err := r.svc.OwnedType(w.ctx, w.host, vfPF)
	testsvc.Must(t, err, "owned type")
	if typ != vfType || step != "" {
		t.Errorf("bridge's type of %s = %s (%q), want %s, never re-typed", vfPF, typ, step, vfType)
	}
}

// TestBridgeOwnedVFRetypeStoppedAtEachStep stops the bridge at each step
// of a re-type from 1429 to 1430. At the stop, Placement offers neither
// type once the old one is withdrawn (never the old type after the
// bridge's state says the new one, never both), and the bridge's state
// says the step; a bridge started again finishes the re-type when it
// publishes its GPUs: 1430 offered, 1429 not.
func TestBridgeOwnedVFRetypeStoppedAtEachStep(t *testing.T) {
	t.Parallel()
	for _, stop := range []string{placement.RetypeWithdrawing, placement.RetypeWithdrawn, placement.RetypeTyped} {
		t.Run(stop, func(t *testing.T) {
			w, r, rp := vfWorld(t)
			w.emptyVFGPU()
			_, err := r.svc.PublishOwned(w.ctx)
			testsvc.Must(t, err, "publish the empty GPU")

			stopped := w.retypeService("stops-at-"+stop, func(step string) error {
				if step == stop {
					return fmt.Errorf("at %s: %w", step, errCrash)
				}
				return nil
			})
			if err := stopped.Retype(w.ctx, w.host, vfPF, retypeTo); !errors.Is(err, errCrash) {
				t.Fatalf("re-type stopped at %s: %v, want the stop", stop, err)
			}
			_, step, err := stopped.OwnedType(w.ctx, w.host, vfPF)
			testsvc.Must(t, err, "owned type")
			if want := map[string]string{placement.RetypeWithdrawn: placement.RetypeWithdrawing}[stop]; step != stop && step != want {
				t.Errorf("step recorded at the stop = %q, want %q", step, stop)
			}
			switch stop {
			case placement.RetypeWithdrawing:
				// Recorded, Placement not written yet: still 1429 only.
				w.wantOffers(rp, true, false)
			case placement.RetypeWithdrawn, placement.RetypeTyped:
				w.wantOffers(rp, false, false)
				w.wantTraits(rp)
			}
			// Another re-type of the GPU is refused meanwhile (409).
			if err := w.retypeService("another", nil).Retype(w.ctx, w.host, vfPF, vfType); !errors.Is(err, placement.ErrRetypeBusy) {
				t.Errorf("re-type to %s during the re-type to %s: %v, want %v", vfType, retypeTo, err, placement.ErrRetypeBusy)
			}
			if code, body, _ := w.retypeAPI(stopped, vfPF, vfType); code != http.StatusConflict || !strings.Contains(body, "Re-type in progress") {
				t.Errorf("POST retype during a re-type: %d %s, want 409 Re-type in progress", code, body)
			}
			// The old replica's sync must not publish 1429 again
			// while the re-type is unfinished: it resumes it.
			restarted := w.retypeService("restarted", nil)
			_, err = restarted.PublishOwned(w.ctx)
			testsvc.Must(t, err, "publish after the restart")
			w.wantOffers(rp, false, true)
			w.wantTraits(rp, retypeTrait)
			w.wantOwnedInventory(rp, 4, 0)
			typ, step, err := restarted.OwnedType(w.ctx, w.host, vfPF)
			testsvc.Must(t, err, "owned type")
			if typ != retypeTo || step != placement.RetypeDone {
				t.Errorf("bridge's type after the restart = %s (%s), want %s (%s)", typ, step, retypeTo, placement.RetypeDone)
			}
		})
	}
}

// TestBridgeOwnedVFRetypeUndoneWhenClaimed: a bridge stops once it has
// recorded a re-type and before its provider stops offering the old type;
// meanwhile a direct-path request claims a vGPU of the old type there. The
// bridge started again finds the claim after the withdrawal and undoes the
// re-type: the old type is offered again (one VF left), never the new
// one, and the bridge's state forgets the re-type.
func TestBridgeOwnedVFRetypeUndoneWhenClaimed(t *testing.T) {
	t.Parallel()
	w, r, rp := vfWorld(t)
	w.emptyVFGPU()
	_, err := r.svc.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish the empty GPU")
	stopped := w.retypeService("stops-at-withdrawing", func(step string) error {
		if step == placement.RetypeWithdrawing {
			return errCrash
		}
		return nil
	})
	if err := stopped.Retype(w.ctx, w.host, vfPF, retypeTo); !errors.Is(err, errCrash) {
		t.Fatalf("re-type: %v, want the stop", err)
	}
	inst := w.domains[3].UUID
	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": vfProfile})
	if res := w.wait(id, 60*time.Second); res.State != requests.Succeeded {
		t.Fatalf("attach %s: %s (%s: %s)", vfProfile, res.State, res.Code, res.Reason)
	}
	restarted := w.retypeService("restarted", nil)
	_, err = restarted.PublishOwned(w.ctx)
	testsvc.Must(t, err, "publish after the restart")
	w.wantTraits(rp, vfTrait)
	w.wantOffers(rp, true, false)
	w.wantOwnedInventory(rp, 2, 1)
	typ, step, err := restarted.OwnedType(w.ctx, w.host, vfPF)
	testsvc.Must(t, err, "owned type")
	if typ != vfType || step != "" {
		t.Errorf("bridge's type after the undo = %s (%q), want %s, never re-typed", typ, step, vfType)
	}
}
