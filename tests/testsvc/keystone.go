package testsvc

import (
	"cmp"
	"context"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"

	"github.com/vgpu-bridge/vgpu-bridge/internal/osclient"
)

// KeystoneURL is the test Keystone's identity v3 endpoint (tests/keystone.sh,
// run by `make services`; VGPU_TEST_KEYSTONE_URL, default
// http://127.0.0.1:5000/v3/).
func KeystoneURL() string {
	return cmp.Or(os.Getenv("VGPU_TEST_KEYSTONE_URL"), "http://127.0.0.1:5000/v3/")
}

// KeystoneAdminPassword reads the password tests/keystone.sh bootstrapped
// the admin user with (VGPU_TEST_KEYSTONE_PASSWORD_FILE); it fails t with
// the command that starts Keystone when there is none.
func KeystoneAdminPassword(t testing.TB) string {
	t.Helper()
	p := cmp.Or(os.Getenv("VGPU_TEST_KEYSTONE_PASSWORD_FILE"), "/var/lib/vgpu-bridge-test/keystone/admin-password")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("Keystone admin password: %v; start Keystone with `tests/keystone.sh` (run by `make services`)", err)
	}
	return strings.TrimSpace(string(b))
}

// KeystoneAdmin is an identity v3 client of the test Keystone logged in
// as its admin (project admin), the way the bridge logs in (package
// osclient); it fails t with the command that starts Keystone when the
// login fails.
func KeystoneAdmin(ctx context.Context, t testing.TB) *gophercloud.ServiceClient {
	t.Helper()
	c := osclient.Cloud{Name: "test-admin", Auth: gophercloud.AuthOptions{IdentityEndpoint: KeystoneURL(), Username: "admin",
		Password: KeystoneAdminPassword(t), DomainName: "Default", TenantName: "admin"}}
	pc, err := c.Login(ctx, http.Client{})
	if err != nil {
		t.Fatalf("Keystone at %s: admin login: %v; start Keystone with `tests/keystone.sh` (run by `make services`)", KeystoneURL(), err)
	}
	sc, err := osclient.Config{Type: "identity", FromCatalog: openstack.NewIdentityV3}.Service(pc, gophercloud.EndpointOpts{})
	Must(t, err, "identity client")
	return sc
}
