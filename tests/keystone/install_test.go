package keystone_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	osuser "os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// The three packages, and what installing them puts on the machine that a
// purge must take away again.
var (
	installPackages = []string{"vgpu-bridge", "vgpu-agent", "vgpuctl"}
	installedPaths  = []string{"/usr/bin/vgpu-bridge", "/usr/bin/vgpu-agent", "/usr/bin/vgpuctl",
		"/lib/systemd/system/vgpu-bridge.service", "/lib/systemd/system/vgpu-agent.service",
		"/etc/vgpu-bridge/rules.yaml", "/etc/vgpu-bridge/keys", "/var/log/vgpu-bridge", "/var/lib/vgpu-bridge/agent",
		"/usr/share/doc/vgpu-bridge/examples/bridge.conf.sample",
		"/usr/share/doc/vgpu-bridge/examples/setup-rabbitmq-accounts.sh"}
)

// installMarker opens the bridge.conf this test writes, so that a second
// run knows the file for its own and never overwrites an operator's.
const installMarker = "# written by vgpu-bridge's TestInstall"

// TestInstall installs the built packages as an operator would, with
// dpkg -i on this machine, and follows the install guide
// (doc/source/install.rst) against the real services: a RabbitMQ vhost and
// least-privilege account made by the packaged setup script, an empty
// database migrated by the installed binary running as the packaged
// vgpu-bridge user, keys from `vgpu-bridge keys`, bridge.conf edited from
// the installed sample, the bridge registered in the real Keystone, and
// `vgpuctl --os-cloud` finding it there and listing the fleet. `upgrade
// check` passes with warnings, then fails naming a GPU provider that has
// no type trait. dpkg --purge then leaves nothing behind.
//
// The GPUs are counted by an inventory class of the test's own
// ([placement] vgpu_resource_classes), so the GPU providers other tests
// make at the same time in the shared Placement are not this bridge's.
func TestInstall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestInstall installs the .deb packages with dpkg -i: run the tests as root (make test does on the CI machine)")
	}
	for _, tool := range []string{"dpkg", "dpkg-query", "make", "rabbitmqctl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: `make services` installs it", tool)
		}
	}
	if b, err := os.ReadFile("/etc/vgpu-bridge/bridge.conf"); err == nil && !strings.HasPrefix(string(b), installMarker) {
		t.Fatal("/etc/vgpu-bridge/bridge.conf exists and is not this test's: vgpu-bridge is installed on this machine; " +
			"TestInstall installs and purges the packages, so run it on a test machine")
	}
	ctx := context.Background()
	dpkg := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("dpkg", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	purge := func() {
		os.Remove("/etc/vgpu-bridge/bridge.conf") // the operator's files: not the package's to remove
		os.Remove("/etc/vgpu-bridge/clouds.yaml")
		os.Remove("/etc/vgpu-bridge/placement-token")
		out, err := exec.Command("dpkg", append([]string{"--purge"}, installPackages...)...).CombinedOutput()
		if err != nil {
			t.Errorf("dpkg --purge: %v\n%s", err, out)
		}
	}
	purge() // what an interrupted run left

	// 1. Build and install. Nothing starts.
	debDir := t.TempDir()
	build := exec.Command("make", "deb", "DEB_DIR="+debDir)
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "VERSION=0.1.0.dev0+install")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make deb: %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(debDir, "*.deb"))
	if len(debs) != len(installPackages) {
		t.Fatalf("make deb built %v", debs)
	}
	dpkg(append([]string{"-i"}, debs...)...)
	cleanedUp := false
	t.Cleanup(func() {
		if !cleanedUp {
			purge()
		}
	})
	for _, pkg := range installPackages {
		if out, _ := exec.Command("dpkg-query", "-W", "-f", "${Status} ${Version}", pkg).Output(); string(out) != "install ok installed 0.1.0~dev0+install" {
			t.Errorf("dpkg-query %s: %q", pkg, out)
		}
	}
	for _, p := range installedPaths {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("installed: %v", err)
		}
	}
	assertNothingRuns(t)
	svcUser, err := osuser.Lookup("vgpu-bridge")
	testsvc.Must(t, err, "the packaged system user")
	if st, err := os.Stat("/etc/vgpu-bridge/keys"); err != nil || st.Mode().Perm() != 0o700 || st.Sys().(*syscall.Stat_t).Uid != uid(svcUser) {
		t.Errorf("/etc/vgpu-bridge/keys: %v %v; want mode 0700, owned by vgpu-bridge", st.Mode(), err)
	}
	if out := run(t, nil, nil, "/usr/bin/vgpu-bridge", "--version"); !strings.Contains(out, "0.1.0.dev0+install") {
		t.Errorf("vgpu-bridge --version: %s", out)
	}

	// 2. The broker: a vhost and the bridge's least-privilege account,
	// made by the packaged script.
	vhostURL, err := url.Parse(testsvc.PrivateVHost(t))
	testsvc.Must(t, err, "vhost URL")
	vhost := strings.TrimPrefix(vhostURL.Path, "/")
	rabbitUser, rabbitPassword := testsvc.Name("vgpu-bridge"), testsvc.Name("pw")
	setup := exec.Command("sh", "/usr/share/doc/vgpu-bridge/examples/setup-rabbitmq-accounts.sh", "-p", vhost, "-P", "-", "bridge", rabbitUser)
	setup.Stdin = strings.NewReader(rabbitPassword + "\n")
	if out, err := setup.CombinedOutput(); err != nil {
		t.Fatalf("setup-rabbitmq-accounts.sh bridge: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("rabbitmqctl", "delete_user", rabbitUser).Run() }) //nolint:errcheck
	// Nova's account declares Nova's exchange, as Nova's services do when
	// they start; the bridge's account may only bind to it.
	novaUser := testsvc.Name("nova")
	setup = exec.Command("sh", "/usr/share/doc/vgpu-bridge/examples/setup-rabbitmq-accounts.sh", "-p", vhost, "-P", "-", "nova", novaUser)
	setup.Stdin = strings.NewReader(rabbitPassword + "\n")
	if out, err := setup.CombinedOutput(); err != nil {
		t.Fatalf("setup-rabbitmq-accounts.sh nova: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("rabbitmqctl", "delete_user", novaUser).Run() }) //nolint:errcheck
	novaURL := *vhostURL
	novaURL.User = url.UserPassword(novaUser, rabbitPassword)
	conn, err := amqp.Dial(novaURL.String())
	testsvc.Must(t, err, "connect as Nova")
	ch, err := conn.Channel()
	testsvc.Must(t, err, "channel")
	testsvc.Must(t, ch.ExchangeDeclare("nova", "topic", false, false, false, false, nil), "declare Nova's exchange")
	conn.Close()
	vhostURL.User = url.UserPassword(rabbitUser, rabbitPassword)

	// 3. Keystone: the bridge's service user, an operator, the region.
	ks := newKeystone(t)
	svcProject, opsProject := ks.project("vgpu-install-service"), ks.project("vgpu-install-ops")
	bridgeUser := ks.user("vgpu-bridge", svcProject, "service")
	operator := ks.user("operator", opsProject, "admin")
	region := ks.regionVia(keystoneURL())
	cloudsYAML, err := os.ReadFile(writeCloudsYAML(t,
		cloud{name: "vgpu-bridge", authURL: keystoneURL(), user: bridgeUser.name, password: bridgeUser.password, project: svcProject.Name, region: region}))
	testsvc.Must(t, err, "clouds.yaml")
	operatorClouds := writeCloudsYAML(t,
		cloud{name: "admin", authURL: keystoneURL(), user: "admin", password: adminPassword(t), project: "admin", region: region},
		cloud{name: "operator", authURL: keystoneURL(), user: operator.name, password: operator.password, project: opsProject.Name, region: region})

	// 4. The fleet in Placement: one typed T4 and, later, an untyped GPU.
	class := "CUSTOM_VGPU_INSTALL_" + strings.ToUpper(strings.ReplaceAll(uuid.NewString()[:8], "-", ""))
	pc, err := placement.NewClient(ctx, placement.ClientConfig{Endpoint: testsvc.PlacementURL(t), Token: "admin"})
	testsvc.Must(t, err, "placement client")
	node := testsvc.Name("cmp-install")
	testsvc.PlacementFleet(ctx, t, pc.ServiceClient(), []testsvc.FleetHost{{Node: node, VM: uuid.NewString(),
		GPUs: []testsvc.FleetGPU{{PCI: "0000:3b:00.0", Trait: "CUSTOM_NVIDIA_232", Class: class, Total: 4}}}})

	// 5. Configuration: bridge.conf from the installed sample, secrets
	// root:vgpu-bridge 0640 (doc/source/install.rst).
	sample, err := os.ReadFile("/usr/share/doc/vgpu-bridge/examples/bridge.conf.sample")
	testsvc.Must(t, err, "the installed sample")
	listen := fmt.Sprintf("127.0.0.1:%d", testsvc.FreePort(t))
	db := testsvc.Postgres(t) // empty: the installed binary migrates it
	cfg := setOptions(t, string(sample), [][3]string{
		{"DEFAULT", "transport_url", vhostURL.String()},
		{"api", "listen", listen},
		{"api", "auth_strategy", "keystone"},
		{"database", "connection", db},
		{"openstack", "cloud", "vgpu-bridge"},
		{"placement", "endpoint_override", testsvc.PlacementURL(t)},
		{"placement", "token_file", "/etc/vgpu-bridge/placement-token"},
		{"placement", "vgpu_resource_classes", class},
		{"placement", "sync_interval", "1s"},
		// This cloud's catalog has no Nova: the override is what the bridge uses.
		{"nova", "endpoint_override", "http://127.0.0.1:1/v2.1"},
		{"security", "signing_key_file", "/etc/vgpu-bridge/keys/signing.key"},
		{"security", "agent_keys_file", "/etc/vgpu-bridge/keys/agent-keys"},
		{"security", "key_id", "bridge-install"},
	})
	writeSecret(t, svcUser, "/etc/vgpu-bridge/bridge.conf", installMarker+"\n"+cfg)
	writeSecret(t, svcUser, "/etc/vgpu-bridge/clouds.yaml", string(cloudsYAML))
	writeSecret(t, svcUser, "/etc/vgpu-bridge/placement-token", "admin\n")
	asBridge := []string{"OS_CLIENT_CONFIG_FILE=/etc/vgpu-bridge/clouds.yaml"}

	// 6. Keys, as the daemon's user; a host's files go to a scratch directory.
	run(t, asBridge, svcUser, "/usr/bin/vgpu-bridge", "keys", "init")
	scratch, err := os.MkdirTemp("", "vgpu-install-keys-") // t.TempDir's parent is root's alone
	testsvc.Must(t, err, "scratch directory")
	t.Cleanup(func() { os.RemoveAll(scratch) })
	testsvc.Must(t, os.Chown(scratch, int(uid(svcUser)), int(gid(svcUser))), "chown the scratch directory")
	hostKeys := filepath.Join(scratch, "cmp-1")
	if out := run(t, asBridge, svcUser, "/usr/bin/vgpu-bridge", "keys", "enrol", node, "-o", hostKeys); !strings.Contains(out, "enrolled") {
		t.Errorf("keys enrol: %s", out)
	}
	for _, f := range []string{"/etc/vgpu-bridge/keys/signing.key", filepath.Join(hostKeys, "agent.key")} {
		if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v; want mode 0600", f, st.Mode(), err)
		}
	}

	// 7. Migrate and serve, as the packaged unit does.
	run(t, asBridge, svcUser, "/usr/bin/vgpu-bridge", "migrate", "up", "--config", "/etc/vgpu-bridge/bridge.conf")
	serve := exec.Command("/usr/bin/vgpu-bridge", "serve", "--config", "/etc/vgpu-bridge/bridge.conf")
	logPath := filepath.Join(t.TempDir(), "bridge.log")
	bridgeLog = logPath
	logf, err := os.Create(logPath)
	testsvc.Must(t, err, "bridge log")
	serve.Stdout, serve.Stderr = logf, logf
	serve.Env, serve.SysProcAttr = append(bridgeEnv(svcUser), asBridge...), &syscall.SysProcAttr{Credential: cred(svcUser), Setpgid: true}
	testsvc.Must(t, serve.Start(), "start vgpu-bridge serve")
	logf.Close()
	exited := make(chan error, 1)
	go func() { exited <- serve.Wait() }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		serve.Process.Signal(syscall.SIGTERM) //nolint:errcheck
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("vgpu-bridge serve exited with %v on SIGTERM\n%s", err, tail(logPath))
			}
		case <-time.After(time.Minute):
			syscall.Kill(-serve.Process.Pid, syscall.SIGKILL) //nolint:errcheck
			t.Errorf("vgpu-bridge serve did not stop within a minute of SIGTERM\n%s", tail(logPath))
		}
	}
	t.Cleanup(stop)
	base := "http://" + listen
	waitUntil(t, 2*time.Minute, "the installed bridge is ready", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("vgpu-bridge serve exited: %v\n%s", err, tail(logPath))
		default:
		}
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	var doc struct {
		Versions []struct {
			ID, Status string
		} `json:"versions"`
	}
	getJSON(t, base+"/", &doc)
	if len(doc.Versions) == 0 || doc.Versions[0].Status != "CURRENT" {
		t.Errorf("GET / = %+v, want an OpenStack version document", doc)
	}

	// 8. The catalog, then vgpuctl with no --url.
	cleanupCatalog(t, ks, region)
	reg := exec.Command("/usr/bin/vgpu-bridge", "keystone", "register", "--os-cloud", "admin", "--public-url", base)
	reg.Env = append(os.Environ(), "OS_CLIENT_CONFIG_FILE="+operatorClouds, "OS_CLOUD=")
	if out, err := reg.CombinedOutput(); err != nil || !strings.Contains(string(out), "endpoint public") {
		t.Fatalf("keystone register: %v\n%s", err, out)
	}
	ctlEnv := []string{"OS_CLIENT_CONFIG_FILE=" + operatorClouds, "OS_CLOUD=", "VGPUCTL_URL=", "VGPUCTL_TOKEN="}
	var listed string
	waitUntil(t, time.Minute, "vgpuctl --os-cloud operator gpus lists the T4 as T4-4Q", func() bool {
		listed = run(t, ctlEnv, nil, "/usr/bin/vgpuctl", "--os-cloud", "operator", "gpus", "--host", node)
		return strings.Contains(listed, "T4-4Q")
	})
	if !strings.Contains(listed, node) {
		t.Errorf("vgpuctl gpus:\n%s", listed)
	}

	// 9. upgrade check: warnings only (no notification, no agent yet), then
	// a failure naming an untyped GPU that no agent reports.
	check := func(want int) string {
		t.Helper()
		cmd := exec.Command("/usr/bin/vgpu-bridge", "upgrade", "check", "--config", "/etc/vgpu-bridge/bridge.conf")
		cmd.Env, cmd.SysProcAttr = append(bridgeEnv(svcUser), asBridge...), &syscall.SysProcAttr{Credential: cred(svcUser)}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		code := 0
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("upgrade check: %v", err)
		}
		if code != want {
			return fmt.Sprintf("exit %d, want %d:\n%s", code, want, out)
		}
		return ""
	}
	if msg := check(1); msg != "" {
		t.Errorf("upgrade check after install: %s", msg)
	}
	untyped := testsvc.Name("cmp-untyped")
	testsvc.PlacementFleet(ctx, t, pc.ServiceClient(), []testsvc.FleetHost{{Node: untyped, VM: uuid.NewString(),
		GPUs: []testsvc.FleetGPU{{PCI: "0000:af:00.0", Class: class, Total: 4}}}})
	gpuName := testsvc.GPUProviderName(untyped, "0000:af:00.0")
	var last string
	waitUntil(t, time.Minute, "upgrade check fails naming "+gpuName, func() bool {
		last = check(2)
		return last == ""
	})
	cmd := exec.Command("/usr/bin/vgpu-bridge", "upgrade", "check", "--config", "/etc/vgpu-bridge/bridge.conf")
	cmd.Env, cmd.SysProcAttr = append(bridgeEnv(svcUser), asBridge...), &syscall.SysProcAttr{Credential: cred(svcUser)}
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), gpuName) || !strings.Contains(string(out), "Failure") {
		t.Errorf("upgrade check names no untyped GPU %s:\n%s", gpuName, out)
	}

	// 10. Stop, purge: nothing of the packages remains.
	stop()
	purge()
	cleanedUp = true
	for _, p := range installedPaths {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after dpkg --purge, %s: %v", p, err)
		}
	}
	for _, pkg := range installPackages {
		if out, _ := exec.Command("dpkg-query", "-W", "-f", "${Status}", pkg).Output(); strings.Contains(string(out), "installed") {
			t.Errorf("after dpkg --purge, %s: %s", pkg, out)
		}
	}
}

// assertNothingRuns: installing started no daemon of the packages and
// enabled no unit.
func assertNothingRuns(t *testing.T) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/exe")
	for _, p := range procs {
		if exe, err := os.Readlink(p); err == nil && (exe == "/usr/bin/vgpu-bridge" || exe == "/usr/bin/vgpu-agent") {
			t.Errorf("installing started %s (%s)", exe, p)
		}
	}
	wants, _ := filepath.Glob("/etc/systemd/system/*.wants/vgpu-*")
	for _, w := range wants {
		t.Errorf("installing enabled %s", w)
	}
}

var reOption = regexp.MustCompile(`^#?\s*([a-z0-9_]+)\s*=`)

// setOptions edits an oslo-style sample as an operator does: in each
// section, the commented default line of each option becomes its value.
// An option the sample lacks fails the test (the sample must hold them).
func setOptions(t *testing.T, sample string, opts [][3]string) string {
	t.Helper()
	lines := strings.Split(sample, "\n")
	for _, o := range opts {
		section, key, value := o[0], o[1], o[2]
		in, done := false, false
		for i, l := range lines {
			if strings.HasPrefix(l, "[") {
				in = l == "["+section+"]"
				continue
			}
			if m := reOption.FindStringSubmatch(l); in && m != nil && m[1] == key && strings.HasPrefix(l, "#") {
				lines[i] = key + " = " + value
				done = true
				break
			}
		}
		if !done {
			t.Fatalf("the installed bridge.conf.sample has no [%s] %s", section, key)
		}
	}
	return strings.Join(lines, "\n")
}

// writeSecret writes a file the daemon reads: root:vgpu-bridge, 0640.
func writeSecret(t *testing.T, u *osuser.User, path, content string) {
	t.Helper()
	testsvc.Must(t, os.WriteFile(path, []byte(content), 0o640), "write "+path)
	testsvc.Must(t, os.Chmod(path, 0o640), "chmod "+path)
	testsvc.Must(t, os.Chown(path, 0, int(gid(u))), "chown "+path)
}

func uid(u *osuser.User) uint32 { n, _ := strconv.Atoi(u.Uid); return uint32(n) }
func gid(u *osuser.User) uint32 { n, _ := strconv.Atoi(u.Gid); return uint32(n) }

func cred(u *osuser.User) *syscall.Credential {
	return &syscall.Credential{Uid: uid(u), Gid: gid(u), Groups: []uint32{}}
}

// bridgeEnv is the environment systemd gives the unit: no root's HOME.
func bridgeEnv(*osuser.User) []string {
	return []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "HOME=/nonexistent"}
}

// run runs a command, as u when set (else as root with env added), and
// returns its output; it fails the test when the command fails.
func run(t *testing.T, env []string, u *osuser.User, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if u != nil {
		cmd.Env = append(bridgeEnv(u), env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred(u)}
		cmd.Dir = "/"
	} else {
		cmd.Env = append(os.Environ(), env...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// cleanupCatalog removes, when the test ends, the vgpu service and
// endpoints that `keystone register` adds in region; a vgpu service that
// was there before stays.
func cleanupCatalog(t *testing.T, ks *keystone, region string) {
	t.Helper()
	list := func(ctx context.Context) []services.Service {
		pages, err := services.List(ks.admin, services.ListOpts{ServiceType: "vgpu"}).AllPages(ctx)
		if err != nil {
			return nil
		}
		s, _ := services.ExtractServices(pages)
		return s
	}
	before := map[string]bool{}
	for _, s := range list(context.Background()) {
		before[s.ID] = true
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, s := range list(ctx) {
			pages, _ := endpoints.List(ks.admin, endpoints.ListOpts{ServiceID: s.ID, RegionID: region}).AllPages(ctx)
			eps, _ := endpoints.ExtractEndpoints(pages)
			for _, e := range eps {
				endpoints.Delete(ctx, ks.admin, e.ID) //nolint:errcheck
			}
			if !before[s.ID] {
				services.Delete(ctx, ks.admin, s.ID) //nolint:errcheck
			}
		}
	})
}

func getJSON(t *testing.T, u string, out any) {
	t.Helper()
	resp, err := http.Get(u)
	testsvc.Must(t, err, "GET "+u)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %s: %s", u, resp.Status, b)
	}
	testsvc.Must(t, json.Unmarshal(b, out), "decode "+u)
}

// waitUntil polls ok until it holds; past within, the test fails with
// what and, when set, the bridge's last log lines.
func waitUntil(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s\n%s", within, what, tail(bridgeLog))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// bridgeLog is the log of the bridge TestInstall runs.
var bridgeLog string

func tail(path string) string {
	b, _ := os.ReadFile(path)
	return testsvc.LastLines(string(b), 30)
}
