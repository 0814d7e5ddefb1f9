package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// typeFlavorPlan is TestFlavorPlan's type: T4-16A (nvidia-229), one per T4,
// which no other test's GPU is set to.
var typeFlavorPlan = vgpuType{"T4-16A", "nvidia-229", 1}

// flavorPlanRow is what the test reads of a proposal of vgpuctl flavor
// plan -o json.
type flavorPlanRow struct {
	Flavor struct {
		Name       string            `json:"name"`
		VCPUs      int               `json:"vcpus"`
		RAM        int               `json:"ram"`
		Disk       int               `json:"disk"`
		Public     bool              `json:"is_public"`
		ExtraSpecs map[string]string `json:"extra_specs"`
	} `json:"flavor"`
	BasedOn      string `json:"based_on"`
	Profile      string `json:"profile"`
	Trait        string `json:"trait"`
	DriverBranch int    `json:"driver_branch"`
	Action       string `json:"action"`
	ExistingID   string `json:"existing_id"`
	Detail       string `json:"detail"`
}

// TestFlavorPlan: vgpuctl flavor plan proposes, for a plain flavor of the
// test's own and the profile its host's GPU is typed for, the vGPU flavor
// to create; --apply creates it through Nova (once: again, it exists);
// a tenant's server on the plain flavor resizes to it through Nova's API,
// and ends with a vGPU of the type in Nova, Placement and on the host.
func TestFlavorPlan(t *testing.T) {
	w := newWorld(t, worldOpts{typ: typeFlavorPlan})
	base := w.flavorName("plan")
	plainID := w.flavor("plan", 2, 2048, 10, 0)
	want := base + ".vgpu-" + strings.ToLower(w.typ.profile)
	wantSpecs := map[string]string{"resources1:VGPU": "1", "trait1:" + w.typ.trait(): "required", "trait1:" + nova.GPUFaultTrait: "forbidden"}
	sc := w.n.ComputeClient(t)
	// The flavors the plan made for the test's flavor (whatever run made
	// them) go at the end; the shared Nova keeps the others'.
	t.Cleanup(func() {
		pages, err := flavors.ListDetail(sc, flavors.ListOpts{AccessType: flavors.AllAccess}).AllPages(w.ctx)
		if err != nil {
			t.Errorf("list flavors to clean up: %v", err)
			return
		}
		all, _ := flavors.ExtractFlavors(pages)
		for _, f := range all {
			if strings.HasPrefix(f.Name, base+".vgpu-") {
				if err := flavors.Delete(w.ctx, sc, f.ID).ExtractErr(); err != nil {
					t.Errorf("delete flavor %s: %v", f.Name, err)
				}
			}
		}
	})
	w.startBridge()
	vm := w.n.CreateServer(t, "e2e-flavorplan", plainID, w.host)

	// Plan, as a table: every profile the fleet's GPUs are typed for
	// (the shared Placement has other tests' GPUs), the test's flavor only.
	only := []string{"flavor", "plan", "--flavor", base}
	var table string
	w.waitFor(time.Minute, "a plan row for "+want, func() bool {
		code, out, errs := w.vgpuctl(only...)
		if code != 0 {
			t.Fatalf("vgpuctl flavor plan: exit %d\n%s%s", code, out, errs)
		}
		table = out
		return strings.Contains(out, want)
	})
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if f := strings.Fields(lines[0]); strings.Join(f, " ") != "FLAVOR BASED ON PROFILE ACTION DETAIL" {
		t.Errorf("table header %q", lines[0])
	}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < 4 || f[1] != base {
			t.Errorf("a row not based on the test's flavor: %q", l)
			continue
		}
		if f[0] == want && (f[2] != w.typ.profile || f[3] != "create" || !strings.Contains(l, "trait1:"+w.typ.trait()+"=required trait1:"+nova.GPUFaultTrait+"=forbidden")) {
			t.Errorf("row of %s: %q; want %s, create, naming the trait", want, l, w.typ.profile)
		}
	}

	// Apply, for the host's profile only (the others' types stay off the
	// shared Nova's flavors), then again: created, then exists.
	apply := append(only, "--profile", w.typ.profile, "--apply", "-o", "json")
	row := func(wantAction string) flavorPlanRow {
		t.Helper()
		start := time.Now()
		code, out, errs := w.vgpuctl(apply...)
		t.Logf("vgpuctl %s: exit %d in %s", strings.Join(apply, " "), code, time.Since(start).Round(time.Millisecond))
		if code != 0 {
			t.Fatalf("vgpuctl flavor plan --apply: exit %d\n%s%s", code, out, errs)
		}
		var plan struct {
			Proposals []flavorPlanRow `json:"proposals"`
		}
		testsvc.Must(t, json.Unmarshal([]byte(out), &plan), "plan JSON: "+out)
		if len(plan.Proposals) != 1 {
			t.Fatalf("%d proposals, want one for %s:\n%s", len(plan.Proposals), want, out)
		}
		p := plan.Proposals[0]
		if p.Flavor.Name != want || p.BasedOn != base || p.Profile != w.typ.profile || p.Trait != w.typ.trait() || p.Action != wantAction ||
			p.ExistingID == "" {
			t.Fatalf("proposal %+v; want %s from %s for %s, %s, with the flavor's id", p, want, base, w.typ.profile, wantAction)
		}
		if f := p.Flavor; f.VCPUs != 2 || f.RAM != 2048 || f.Disk != 10 || !f.Public || !maps.Equal(f.ExtraSpecs, wantSpecs) {
			t.Errorf("proposed flavor %+v, want 2 vCPU, 2048 MB, 10 GB, public, extra specs %v", f, wantSpecs)
		}
		return p
	}
	created := row("created")
	again := row("exists")
	if again.ExistingID != created.ExistingID {
		t.Errorf("the second run found flavor %s, the first created %s", again.ExistingID, created.ExistingID)
	}
	got, err := flavors.Get(w.ctx, sc, created.ExistingID).Extract()
	testsvc.Must(t, err, "get the created flavor")
	specs, err := flavors.ListExtraSpecs(w.ctx, sc, created.ExistingID).Extract()
	testsvc.Must(t, err, "extra specs of the created flavor")
	if got.Name != want || got.VCPUs != 2 || got.RAM != 2048 || got.Disk != 10 || !got.IsPublic || !maps.Equal(specs, wantSpecs) {
		t.Errorf("Nova's flavor %+v with extra specs %v; want %s, 2/2048/10, public, %v", got, specs, want, wantSpecs)
	}
	pages, err := flavors.ListDetail(sc, flavors.ListOpts{AccessType: flavors.AllAccess}).AllPages(w.ctx)
	testsvc.Must(t, err, "list flavors")
	all, err := flavors.ExtractFlavors(pages)
	testsvc.Must(t, err, "list flavors")
	n := 0
	for _, f := range all {
		if f.Name == want {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d flavors named %s after two --apply runs, want 1", n, want)
	}

	// For guests with a 550 driver: --driver-branch 550 --apply makes
	// BASE.vgpu-PROFILE-r550 beside it, which also requires the driver
	// trait in the VGPU's group (no server boots on it here:
	// TestGuestDriverTraitsKeepNovaOff has Nova schedule by the trait).
	branchWant := want + "-r550"
	branchSpecs := maps.Clone(wantSpecs)
	branchSpecs["trait1:"+nova.GuestDriverTrait(550)] = "required"
	code, out, errs := w.vgpuctl("flavor", "plan", "--flavor", base, "--profile", w.typ.profile, "--driver-branch", "550", "--apply", "-o", "json")
	if code != 0 {
		t.Fatalf("vgpuctl flavor plan --driver-branch 550 --apply: exit %d\n%s%s", code, out, errs)
	}
	var branchPlan struct {
		Proposals []flavorPlanRow `json:"proposals"`
	}
	testsvc.Must(t, json.Unmarshal([]byte(out), &branchPlan), "plan JSON: "+out)
	if len(branchPlan.Proposals) != 1 {
		t.Fatalf("%d proposals with --driver-branch 550, want one for %s:\n%s", len(branchPlan.Proposals), branchWant, out)
	}
	bp := branchPlan.Proposals[0]
	if bp.Flavor.Name != branchWant || bp.DriverBranch != 550 || bp.Action != "created" || bp.ExistingID == "" || bp.ExistingID == created.ExistingID ||
		!maps.Equal(bp.Flavor.ExtraSpecs, branchSpecs) {
		t.Fatalf("proposal %+v; want %s, driver branch 550, created as a new flavor, extra specs %v", bp, branchWant, branchSpecs)
	}
	bf, err := flavors.Get(w.ctx, sc, bp.ExistingID).Extract()
	testsvc.Must(t, err, "get the created -r550 flavor")
	bspecs, err := flavors.ListExtraSpecs(w.ctx, sc, bp.ExistingID).Extract()
	testsvc.Must(t, err, "extra specs of the created -r550 flavor")
	if bf.Name != branchWant || bf.VCPUs != 2 || bf.RAM != 2048 || bf.Disk != 10 || !maps.Equal(bspecs, branchSpecs) {
		t.Errorf("Nova's flavor %+v with extra specs %v; want %s, 2/2048/10, %v", bf, bspecs, branchWant, branchSpecs)
	}

	// The tenant's resize to it, through Nova's API: Nova's scheduler
	// finds the host's GPU by the trait, the harness makes the mdev.
	srv := w.n.WaitServer(t, vm, "ACTIVE")
	w.systemdScope(srv.InstanceName) // the bridge's tuning rule acts on the resize
	testsvc.Must(t, servers.Resize(w.ctx, sc, vm, servers.ResizeOpts{FlavorRef: created.ExistingID}).ExtractErr(), "resize")
	w.n.WaitServer(t, vm, "VERIFY_RESIZE")
	testsvc.Must(t, servers.ConfirmResize(w.ctx, sc, vm).ExtractErr(), "confirm resize")
	w.n.WaitServer(t, vm, "ACTIVE")
	w.assertResized(vm, "plan.vgpu-"+strings.ToLower(w.typ.profile))
	if s := w.n.Server(t, vm); s.Flavor.ExtraSpecs["trait1:"+w.typ.trait()] != "required" {
		t.Errorf("server flavor %+v lacks trait1:%s=required", s.Flavor, w.typ.trait())
	}
}

// vgpuctl runs the vgpuctl binary against the world's bridge (admin
// token) and Nova (noauth2 token, --compute-url) and returns its exit
// code, stdout and stderr.
func (w *world) vgpuctl(args ...string) (code int, stdout, stderr string) {
	w.t.Helper()
	full := append(append([]string{}, args...), "--url", w.api, "--timeout", "60s", "--compute-url", w.n.ComputeEndpoint())
	cmd := exec.CommandContext(w.ctx, testsvc.Binary(w.t, "vgpuctl"), full...)
	cmd.Env = append(os.Environ(), "VGPUCTL_TOKEN="+testbridge.AdminToken, "VGPUCTL_COMPUTE_TOKEN="+w.n.Token(), "OS_CLOUD=", "VGPUCTL_URL=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		w.t.Fatalf("run vgpuctl: %v", err)
	}
	return code, out.String(), errb.String()
}
