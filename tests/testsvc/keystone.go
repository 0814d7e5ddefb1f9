package testsvc

import (
	"cmp"
	"os"
	"strings"
	"testing"
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
