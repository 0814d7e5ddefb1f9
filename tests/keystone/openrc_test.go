package keystone_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/applicationcredentials"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"

	"github.com/vgpu-bridge/vgpu-bridge/internal/osclient"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestOpenrc: vgpuctl logs in to the real Keystone from the OS_* variables
// of an openrc file (password, token, application credential), finds the
// bridge in the catalog of OS_REGION_NAME, and prints one column with
// -f value -c name. A cloud named by OS_CLOUD wins over the variables,
// as with the openstack client.
func TestOpenrc(t *testing.T) {
	w := newWorld(t)
	ks := w.ks
	ctx := context.Background()
	alice := ks.user("alice", w.pa, "member")

	// The bridge in the catalog of the test's region (what `vgpu-bridge
	// keystone register` makes), gone when the test ends.
	svc, err := services.Create(ctx, ks.admin, services.CreateOpts{Type: "vgpu",
		Extra: map[string]any{"name": testsvc.Name("vgpu-openrc")}}).Extract()
	testsvc.Must(t, err, "create vgpu service")
	t.Cleanup(func() { services.Delete(context.Background(), ks.admin, svc.ID) }) //nolint:errcheck
	ep, err := endpoints.Create(ctx, ks.admin, endpoints.CreateOpts{Availability: gophercloud.AvailabilityInternal,
		Region: w.region, URL: w.url, ServiceID: svc.ID}).Extract()
	testsvc.Must(t, err, "create vgpu endpoint")
	t.Cleanup(func() { endpoints.Delete(context.Background(), ks.admin, ep.ID) }) //nolint:errcheck

	// Project A's instance has a name, for -c name to print.
	name := testsvc.Name("vm-openrc")
	_, err = w.pool.Exec(ctx, `UPDATE instances SET display_name = $1 WHERE uuid = $2`, name, w.instA)
	testsvc.Must(t, err, "name instance A")

	// An openrc file as Horizon writes it (the internal interface: the
	// bridge's only endpoint in the region is internal).
	openrc := []string{"OS_AUTH_URL=" + keystoneURL(), "OS_IDENTITY_API_VERSION=3", "OS_USERNAME=" + alice.name,
		"OS_PASSWORD=" + alice.password, "OS_PROJECT_NAME=" + w.pa.Name, "OS_PROJECT_ID=", "OS_USER_DOMAIN_NAME=Default",
		"OS_PROJECT_DOMAIN_ID=default", "OS_REGION_NAME=" + w.region, "OS_INTERFACE=internal",
		// Nothing else may supply credentials or the URL.
		"OS_CLOUD=", "OS_CLIENT_CONFIG_FILE=" + t.TempDir() + "/none.yaml", "VGPUCTL_TOKEN=", "VGPUCTL_URL=", "OS_AUTH_TYPE=",
		"OS_TOKEN=", "OS_APPLICATION_CREDENTIAL_ID=", "OS_APPLICATION_CREDENTIAL_SECRET=", "OS_CACERT="}
	with := func(kv ...string) []string { return append(append([]string(nil), openrc...), kv...) }

	// alice's token, and an application credential of hers (it carries
	// project A's scope).
	token := ks.token(alice)
	idc := osclient.Config{Endpoint: keystoneURL(), Token: token, Type: "identity", HTTPClient: &http.Client{}}.Static()
	ac, err := applicationcredentials.Create(ctx, idc, alice.id, applicationcredentials.CreateOpts{Name: testsvc.Name("vgpuctl")}).Extract()
	testsvc.Must(t, err, "create application credential")

	for _, tt := range []struct {
		name string
		env  []string
	}{
		{"password", openrc},
		{"token", with("OS_AUTH_TYPE=token", "OS_TOKEN="+token, "OS_PASSWORD=", "OS_USERNAME=")},
		{"application credential", with("OS_AUTH_TYPE=v3applicationcredential", "OS_APPLICATION_CREDENTIAL_ID="+ac.ID,
			"OS_APPLICATION_CREDENTIAL_SECRET="+ac.Secret, "OS_PASSWORD=", "OS_USERNAME=")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := vgpuctl(t, tt.env, "instances", "-f", "value", "-c", "name")
			if code != 0 || out != name+"\n" {
				t.Errorf("vgpuctl instances -f value -c name: exit %d, stdout %q, stderr %s; want project A's one instance, %q",
					code, out, errs, name)
			}
		})
	}

	// Two columns, in the order named; the table format with -c.
	if code, out, errs := vgpuctl(t, openrc, "instances", "-f", "value", "-c", "uuid", "-c", "name"); code != 0 || out != w.instA+" "+name+"\n" {
		t.Errorf("-c uuid -c name: exit %d, stdout %q, stderr %s", code, out, errs)
	}
	if code, out, errs := vgpuctl(t, openrc, "instances", "show", w.instA, "-f", "value", "-c", "project"); code != 0 || out != w.projA+"\n" {
		t.Errorf("instances show -c project: exit %d, stdout %q, stderr %s", code, out, errs)
	}

	// Wrong password: Keystone refuses, and vgpuctl says the variables
	// were used.
	if code, _, errs := vgpuctl(t, with("OS_PASSWORD=wrong"), "instances"); code == 0 || !strings.Contains(errs, "OS_* variables: Keystone login") {
		t.Errorf("wrong OS_PASSWORD: exit %d, stderr %s", code, errs)
	}
	// --os-interface beats OS_INTERFACE: there is no public endpoint.
	if code, _, errs := vgpuctl(t, openrc, "--os-interface", "public", "instances"); code == 0 || !strings.Contains(errs, "keystone register") {
		t.Errorf("--os-interface public: exit %d, stderr %s; want no endpoint found", code, errs)
	}
	// A cloud named by OS_CLOUD wins over the variables (this one has a
	// wrong password), as --os-cloud does.
	clouds := writeCloudsYAML(t, cloud{name: "stale", authURL: keystoneURL(), user: alice.name, password: "wrong", project: w.pa.Name})
	code, _, errs := vgpuctl(t, with("OS_CLOUD=stale", "OS_CLIENT_CONFIG_FILE="+clouds), "instances")
	if code == 0 || !strings.Contains(errs, "cloud stale: Keystone login") {
		t.Errorf("OS_CLOUD beside OS_* variables: exit %d, stderr %s; want the cloud's credentials used", code, errs)
	}
	code, _, errs = vgpuctl(t, with("OS_CLIENT_CONFIG_FILE="+clouds), "--os-cloud", "stale", "instances")
	if code == 0 || !strings.Contains(errs, "cloud stale: Keystone login") {
		t.Errorf("--os-cloud beside OS_* variables: exit %d, stderr %s; want the cloud's credentials used", code, errs)
	}
}
