// Package keystone_test runs the bridge with [api] auth_strategy = keystone
// against a real Keystone (Debian's python3-keystone, started by
// tests/keystone.sh, which `make services` runs): projects, users and role
// assignments are made through Keystone's API, and their tokens call the
// real bridge and vgpuctl. TestStaticTokenProjectScope checks the same
// project scoping with static tokens, without Keystone.
package keystone_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/regions"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/roles"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const startHint = "start it with `tests/keystone.sh` (run by `make services`)"

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// keystoneURL is the test Keystone's identity v3 endpoint
// (VGPU_TEST_KEYSTONE_URL, default http://127.0.0.1:5000/v3/).
func keystoneURL() string { return env("VGPU_TEST_KEYSTONE_URL", "http://127.0.0.1:5000/v3/") }

// adminPassword reads the password tests/keystone.sh bootstrapped the
// admin user with (VGPU_TEST_KEYSTONE_PASSWORD_FILE).
func adminPassword(t *testing.T) string {
	t.Helper()
	p := env("VGPU_TEST_KEYSTONE_PASSWORD_FILE", "/var/lib/vgpu-bridge-test/keystone/admin-password")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("Keystone admin password: %v; %s", err, startHint)
	}
	return strings.TrimSpace(string(b))
}

// keystone is the test's view of Keystone: an admin client and what the
// test created, deleted when it ends.
type keystone struct {
	t     *testing.T
	ctx   context.Context
	admin *gophercloud.ServiceClient
	anon  *gophercloud.ServiceClient // for logins
	roles map[string]string          // name → id
}

func newKeystone(t *testing.T) *keystone {
	t.Helper()
	ctx := context.Background()
	url := keystoneURL()
	admin := testsvc.KeystoneAdmin(ctx, t)
	apc, err := openstack.NewClient(url)
	testsvc.Must(t, err, "identity client")
	anon, err := openstack.NewIdentityV3(apc, gophercloud.EndpointOpts{})
	testsvc.Must(t, err, "identity client")
	k := &keystone{t: t, ctx: ctx, admin: admin, anon: anon, roles: map[string]string{}}
	pages, err := roles.List(admin, roles.ListOpts{}).AllPages(ctx)
	testsvc.Must(t, err, "list roles")
	rs, err := roles.ExtractRoles(pages)
	testsvc.Must(t, err, "list roles")
	for _, r := range rs {
		k.roles[r.Name] = r.ID
	}
	return k
}

// role returns the id of role name, creating the role (kept: roles are
// global, and "service" is what a real deployment has) when missing.
func (k *keystone) role(name string, keep bool) string {
	k.t.Helper()
	if id, ok := k.roles[name]; ok {
		return id
	}
	r, err := roles.Create(k.ctx, k.admin, roles.CreateOpts{Name: name}).Extract()
	if gophercloud.ResponseCodeIs(err, http.StatusConflict) {
		// Another test run made it meanwhile.
		pages, lerr := roles.List(k.admin, roles.ListOpts{Name: name}).AllPages(k.ctx)
		testsvc.Must(k.t, lerr, "list role "+name)
		rs, lerr := roles.ExtractRoles(pages)
		testsvc.Must(k.t, lerr, "list role "+name)
		if len(rs) == 1 {
			r, err = &rs[0], nil
		}
	}
	testsvc.Must(k.t, err, "create role "+name)
	k.roles[name] = r.ID
	if !keep {
		k.t.Cleanup(func() { roles.Delete(context.Background(), k.admin, r.ID) })
	}
	return r.ID
}

func (k *keystone) project(prefix string) *projects.Project {
	k.t.Helper()
	p, err := projects.Create(k.ctx, k.admin, projects.CreateOpts{Name: testsvc.Name(prefix), DomainID: "default"}).Extract()
	testsvc.Must(k.t, err, "create project")
	k.t.Cleanup(func() {
		// Keystone deletes the project's role assignments with it.
		if err := projects.Delete(context.Background(), k.admin, p.ID).ExtractErr(); err != nil {
			k.t.Logf("delete project %s: %v", p.Name, err)
		}
	})
	return p
}

// user creates a user with roles on project and returns its name and
// password.
type user struct {
	name, password, id string
	project            *projects.Project
}

func (k *keystone) user(prefix string, project *projects.Project, roleNames ...string) user {
	k.t.Helper()
	u := user{name: testsvc.Name(prefix), password: testsvc.Name("pw"), project: project}
	cu, err := users.Create(k.ctx, k.admin, users.CreateOpts{Name: u.name, Password: u.password, DomainID: "default",
		DefaultProjectID: project.ID}).Extract()
	testsvc.Must(k.t, err, "create user")
	u.id = cu.ID
	k.t.Cleanup(func() {
		if err := users.Delete(context.Background(), k.admin, cu.ID).ExtractErr(); err != nil {
			k.t.Logf("delete user %s: %v", u.name, err)
		}
	})
	for _, rn := range roleNames {
		err := roles.Assign(k.ctx, k.admin, k.role(rn, rn == "service"), roles.AssignOpts{UserID: cu.ID, ProjectID: project.ID}).ExtractErr()
		testsvc.Must(k.t, err, "assign role "+rn)
	}
	return u
}

// token logs u in, scoped to its project.
func (k *keystone) token(u user) string {
	k.t.Helper()
	r := tokens.Create(k.ctx, k.anon, &tokens.AuthOptions{Username: u.name, Password: u.password, DomainID: "default",
		Scope: tokens.Scope{ProjectID: u.project.ID}})
	id, err := r.ExtractTokenID()
	testsvc.Must(k.t, err, "log in as "+u.name)
	return id
}

// adminToken is a token of the bootstrap admin (admin role on project admin).
func (k *keystone) adminToken() string {
	k.t.Helper()
	r := tokens.Create(k.ctx, k.anon, &tokens.AuthOptions{Username: "admin", Password: adminPassword(k.t), DomainID: "default",
		Scope: tokens.Scope{ProjectName: "admin", DomainID: "default"}})
	id, err := r.ExtractTokenID()
	testsvc.Must(k.t, err, "log in as admin")
	return id
}

// regionVia creates a region whose public identity endpoint is url, so a
// client of that region reaches Keystone through url (the catalog is what
// gophercloud follows after login). Both go when the test ends.
func (k *keystone) regionVia(url string) string {
	k.t.Helper()
	pages, err := services.List(k.admin, services.ListOpts{ServiceType: "identity"}).AllPages(k.ctx)
	testsvc.Must(k.t, err, "list identity services")
	svcs, err := services.ExtractServices(pages)
	testsvc.Must(k.t, err, "list identity services")
	if len(svcs) == 0 {
		k.t.Fatalf("Keystone's catalog has no identity service; %s", startHint)
	}
	reg, err := regions.Create(k.ctx, k.admin, regions.CreateOpts{ID: testsvc.Name("vgpu-test-region")}).Extract()
	testsvc.Must(k.t, err, "create region")
	ep, err := endpoints.Create(k.ctx, k.admin, endpoints.CreateOpts{Availability: gophercloud.AvailabilityPublic,
		Region: reg.ID, URL: url, ServiceID: svcs[0].ID}).Extract()
	testsvc.Must(k.t, err, "create endpoint")
	k.t.Cleanup(func() {
		ctx := context.Background()
		if err := endpoints.Delete(ctx, k.admin, ep.ID).ExtractErr(); err != nil {
			k.t.Logf("delete endpoint %s: %v", ep.ID, err)
		}
		if err := regions.Delete(ctx, k.admin, reg.ID).ExtractErr(); err != nil {
			k.t.Logf("delete region %s: %v", reg.ID, err)
		}
	})
	return reg.ID
}

func (k *keystone) revoke(tok string) {
	k.t.Helper()
	testsvc.Must(k.t, tokens.Revoke(k.ctx, k.admin, tok).Err, "revoke token")
}

// cloud is one entry of a clouds.yaml the test writes.
type cloud struct {
	name, authURL, user, password, project string
	region                                 string // region_name, when set
}

func writeCloudsYAML(t *testing.T, cs ...cloud) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("clouds:\n")
	for _, c := range cs {
		fmt.Fprintf(&b, "  %s:\n    auth:\n      auth_url: %s\n      username: %s\n      password: %s\n      project_name: %s\n"+
			"      user_domain_name: Default\n      project_domain_name: Default\n    identity_api_version: 3\n",
			c.name, c.authURL, c.user, c.password, c.project)
		if c.region != "" {
			fmt.Fprintf(&b, "    region_name: %s\n", c.region)
		}
	}
	path := filepath.Join(t.TempDir(), "clouds.yaml")
	testsvc.Must(t, os.WriteFile(path, []byte(b.String()), 0o600), "write clouds.yaml")
	return path
}

// vgpuctlPath is the binary TestMain built.
var vgpuctlPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vgpuctl-keystone-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	vgpuctlPath = filepath.Join(dir, "vgpuctl")
	goTool := "/usr/local/go/bin/go"
	if p, err := exec.LookPath("go"); err == nil {
		goTool = p
	}
	build := exec.Command(goTool, "build", "-o", vgpuctlPath, "github.com/vgpu-bridge/vgpu-bridge/cmd/vgpuctl")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build vgpuctl:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// vgpuctl runs the binary with env added; it returns the exit code,
// stdout and stderr.
func vgpuctl(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, vgpuctlPath, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("vgpuctl: %v", err)
	}
	return code, out.String(), errb.String()
}
