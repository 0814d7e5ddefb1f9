package keystone_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestCatalog: `vgpu-bridge keystone register` puts the bridge in the real
// Keystone's catalog (service type vgpu, an endpoint per interface in the
// region), idempotently; `vgpuctl --os-cloud` then finds the bridge there
// with no --url, and says what to do when the catalog has no bridge.
func TestCatalog(t *testing.T) {
	w := newWorld(t)
	ks := w.ks
	bin := testsvc.Binary(t, "vgpu-bridge")
	alice := ks.user("alice", w.pa, "member")
	clouds := writeCloudsYAML(t,
		cloud{name: "admin", authURL: keystoneURL(), user: "admin", password: adminPassword(t), project: "admin", region: w.region},
		cloud{name: "alice", authURL: keystoneURL(), user: alice.name, password: alice.password, project: w.pa.Name, region: w.region},
		cloud{name: "elsewhere", authURL: keystoneURL(), user: alice.name, password: alice.password, project: w.pa.Name, region: "RegionNone"})

	// What a previous run left is reused; what this run creates goes.
	var before []string
	pages, err := services.List(ks.admin, services.ListOpts{ServiceType: "vgpu"}).AllPages(context.Background())
	testsvc.Must(t, err, "list services")
	svcs, _ := services.ExtractServices(pages)
	for _, s := range svcs {
		before = append(before, s.ID)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		pages, err := services.List(ks.admin, services.ListOpts{ServiceType: "vgpu"}).AllPages(ctx)
		if err != nil {
			return
		}
		svcs, _ := services.ExtractServices(pages)
		for _, s := range svcs {
			eps, _ := endpoints.List(ks.admin, endpoints.ListOpts{ServiceID: s.ID, RegionID: w.region}).AllPages(ctx)
			list, _ := endpoints.ExtractEndpoints(eps)
			for _, e := range list {
				endpoints.Delete(ctx, ks.admin, e.ID) //nolint:errcheck
			}
			if !strings.Contains(strings.Join(before, ","), s.ID) {
				services.Delete(ctx, ks.admin, s.ID) //nolint:errcheck
			}
		}
	})

	register := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"keystone", "register", "--config", "", "--os-cloud", "admin"}, args...)...)
		cmd.Env = append(cmd.Environ(), "OS_CLIENT_CONFIG_FILE="+clouds, "OS_CLOUD=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("keystone register %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := register("--public-url", "http://192.0.2.10:9797", "--internal-url", w.url)
	if !strings.Contains(out, "endpoint public") || !strings.Contains(out, "endpoint internal") || !strings.Contains(out, "created") {
		t.Errorf("first register:\n%s", out)
	}
	if out := register("--public-url", "http://192.0.2.10:9797", "--internal-url", w.url); strings.Contains(out, "created") || strings.Contains(out, "updated") {
		t.Errorf("second register changed something:\n%s", out)
	}
	if out := register("--public-url", w.url, "--internal-url", w.url); !strings.Contains(out, "endpoint public    updated") {
		t.Errorf("register with a new public URL:\n%s", out)
	}

	env := []string{"OS_CLIENT_CONFIG_FILE=" + clouds, "VGPUCTL_TOKEN=", "OS_CLOUD=", "VGPUCTL_URL="}
	code, out, errs := vgpuctl(t, env, "--os-cloud", "alice", "instances", "-o", "json")
	if code != 0 || !strings.Contains(out, w.instA) || strings.Contains(out, w.instB) {
		t.Errorf("vgpuctl --os-cloud alice without --url: exit %d, out %s, err %s; want A's instance, found through the catalog", code, out, errs)
	}
	code, _, errs = vgpuctl(t, env, "--os-cloud", "elsewhere", "instances")
	if code == 0 || !strings.Contains(errs, "keystone register") {
		t.Errorf("vgpuctl in a region without the bridge: exit %d, stderr %s; want the hint to register it", code, errs)
	}
}
