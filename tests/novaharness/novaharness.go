// Package novaharness runs a real OpenStack Nova (Debian's python3-nova) for
// vgpu-bridge's end-to-end tests: nova-api (osapi_compute, noauth2),
// nova-conductor, nova-scheduler and one nova-compute per host with
// compute_driver = fake.FakeDriver, each a Python process started through
// launcher.py, on databases and a RabbitMQ vhost of their own and the
// shared Placement of tests/testsvc.
//
// Every compute host has a simulated host (agent/fakehost) on which the
// harness plays Nova's libvirt driver: when Nova spawns or destroys an
// instance there, the FakeDriver calls back (synchronously) and the
// harness creates or removes the instance's domain and its mdevs, so an
// agent on that host (StartAgent) sees what it would on a real one.
//
// Start one Nova per package in TestMain with New (it takes ~20 s), or
// per test with Start. Everything a run creates — processes, databases,
// vhost, Placement providers and allocations — is removed by Close.
package novaharness

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

//go:embed launcher.py
var launcherPy []byte

//go:embed api-paste.ini
var apiPaste []byte

// Python is the interpreter that sees Debian's python3-nova (a pyenv
// python3 earlier on PATH does not).
const Python = "/usr/bin/python3"

// installHint is what a test prints when Nova cannot run here.
const installHint = "install it with `make services` (tests/services.sh installs python3-nova python3-wsgi-intercept)"

// Options configure a Nova.
type Options struct {
	// Hosts are the compute hosts' name prefixes; each gets the run's
	// unique suffix (Placement is shared by every test). None is fine:
	// AddHost adds hosts later.
	Hosts []string
	// TransportURL is Nova's oslo transport (rabbit://user:pw@host:port/vhost).
	// Default: a vhost of its own on the test broker, deleted by Close.
	TransportURL string
	// LogDir receives the services' logs and configuration. Default: a
	// temporary directory, removed by Close unless the run failed.
	LogDir string
	// UnifiedLimits, when set, has Nova enforce Keystone's unified limits
	// ([quota] driver = nova.quota.UnifiedLimitsDriver, [oslo_limit]).
	// Default: the database quota driver with unlimited quotas.
	UnifiedLimits *UnifiedLimits
	// ImagesFile names a JSON file of images every service adds to its
	// GlanceFixture (launcher.py's _add_images): a list of image dicts as
	// GlanceFixture keeps them, each with an optional "file" holding the
	// image's data, which nova-compute downloads.
	ImagesFile string
	// PCIAliases are [pci] alias entries (JSON objects) of every service:
	// nova-api turns a flavor's pci_passthrough:alias into PCI requests
	// with them when a server is created, so they are known from the
	// start. With any, the scheduler also runs PciPassthroughFilter.
	// Hosts whose compute reports PCI devices are added with AddPCIHost.
	PCIAliases []string
}

// Nova is a running Nova.
type Nova struct {
	id        string // unique run id: nt<pid>x<hex>
	dir       string
	ownDir    bool
	api       string // http://127.0.0.1:port/v2.1
	transport string
	vhost     string // own vhost, "" when given
	dbs       []string
	hosts     []string
	procs     []*proc
	placement string
	images    string // Options.ImagesFile
	hook      *hookServer
	fake      map[string]*FakeHost
	limits    *UnifiedLimits // Options.UnifiedLimits
	// pciAliases are Options.PCIAliases.
	pciAliases []string
	// pciHosts are the hosts AddPCIHost added.
	pciHosts map[string]bool

	mu        sync.Mutex
	children  map[string]vgpuChild     // provider uuid → GPU
	holds     map[string]chan struct{} // instance → closed when its next spawn may finish (HoldSpawn)
	failLive  map[string]string        // instance → reason its next live migration fails (FailLiveMigration)
	providers []string                 // providers AddVGPUChild created
	failed    bool
	closed    bool
	started   time.Duration
	phases    []string
	mark      time.Time
}

// phase records how long the step since the last mark took.
func (n *Nova) phase(name string) {
	now := time.Now()
	n.phases = append(n.phases, fmt.Sprintf("%s %.1fs", name, now.Sub(n.mark).Seconds()))
	n.mark = now
}

// StartupPhases says how long each start step took ("databases 12.3s", …).
func (n *Nova) StartupPhases() string { return strings.Join(n.phases, ", ") }

type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs a Nova for one test; it stops when the test ends, printing
// the tail of each service's log when the test failed.
func Start(t testing.TB, o Options) *Nova {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	n, err := New(ctx, o)
	if err != nil {
		t.Fatalf("start Nova: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			n.MarkFailed()
			t.Logf("Nova logs (%s):\n%s", n.dir, n.LogTail(40))
		}
		if err := n.Close(); err != nil {
			t.Errorf("stop Nova: %v", err)
		}
	})
	return n
}

// New starts Nova and waits until its API answers, every compute service
// is up with its resource provider in Placement and mapped to the cell.
// On error everything started is removed again.
func New(ctx context.Context, o Options) (n *Nova, err error) {
	begin := time.Now()
	if err := checkInstalled(ctx, Python, novaModules); err != nil {
		return nil, err
	}
	n = &Nova{id: fmt.Sprintf("nt%dx%s", os.Getpid(), randHex(3)), fake: map[string]*FakeHost{},
		children: map[string]vgpuChild{}, mark: begin, limits: o.UnifiedLimits}
	defer func() {
		if err != nil {
			n.failed = true
			tail := n.LogTail(30)
			_ = n.Close()
			err = fmt.Errorf("%w\n%s", err, tail)
		}
	}()
	sweep(ctx)
	n.dir, n.images = o.LogDir, o.ImagesFile
	if n.dir == "" {
		if n.dir, err = os.MkdirTemp("", "novatest-"+n.id+"-"); err != nil {
			return n, err
		}
		n.ownDir = true
	}
	for _, h := range o.Hosts {
		n.hosts = append(n.hosts, h+"-"+n.id)
	}
	if n.placement, err = placementURL(ctx); err != nil {
		return n, err
	}
	n.transport = o.TransportURL
	n.pciAliases = o.PCIAliases
	if n.transport == "" {
		if err := n.createVhost(ctx); err != nil {
			return n, err
		}
	}
	fromTemplates, err := n.createDatabases(ctx)
	if err != nil {
		return n, err
	}
	n.phase("prepare")
	if n.hook, err = newHookServer(n); err != nil {
		return n, err
	}
	for _, h := range n.hosts {
		if err := n.prepareHost(h); err != nil {
			return n, err
		}
	}
	port, err := freePort()
	if err != nil {
		return n, err
	}
	n.api = fmt.Sprintf("http://127.0.0.1:%d/v2.1", port)
	if err := n.writeConfig(port); err != nil {
		return n, err
	}
	steps := [][]string{
		{"api_db", "sync"},
		{"cell_v2", "map_cell0", "--database_connection", n.dbURL("cell0")},
		{"cell_v2", "create_cell", "--name", "cell1"},
		{"db", "sync"},
	}
	if fromTemplates { // migrated already (dbtemplate.go)
		steps = steps[1:3]
	}
	for _, args := range steps {
		if err := n.manage(ctx, args...); err != nil {
			return n, err
		}
	}
	if !fromTemplates {
		if err := n.keepTemplates(ctx); err != nil {
			n.logManage("keeping the migrated databases as templates: %v", err)
		}
	}
	if fromTemplates {
		n.phase("nova-manage (schema copied)")
	} else {
		n.phase("nova-manage")
	}
	for _, s := range []string{"conductor", "scheduler", "api"} {
		if err := n.startService(s, s); err != nil {
			return n, err
		}
	}
	for _, h := range n.hosts {
		if err := n.startCompute(h); err != nil {
			return n, err
		}
	}
	if err := n.waitReady(ctx, n.hosts); err != nil {
		return n, err
	}
	n.started = time.Since(begin)
	return n, nil
}

// prepareHost builds the fake host and the nova-compute configuration of
// a compute host.
func (n *Nova) prepareHost(h string) error {
	fh, err := newFakeHost(filepath.Join(n.dir, "hosts", h), h)
	if err != nil {
		return fmt.Errorf("fake host %s: %w", h, err)
	}
	n.mu.Lock()
	n.fake[h] = fh
	n.mu.Unlock()
	return os.WriteFile(filepath.Join(n.dir, "compute-"+h+".conf"), []byte("[DEFAULT]\nhost = "+h+"\n"), 0o644)
}

func (n *Nova) startCompute(h string) error {
	return n.startService("compute-"+h, "compute", "--config-file", filepath.Join(n.dir, "compute-"+h+".conf"))
}

// AddHost starts one more nova-compute (FakeDriver) with its fake host,
// named prefix plus the run's suffix, waits until it is up and mapped to
// the cell, and returns its name. It runs until the test ends (then its
// service is disabled and its process stopped: retireHost). With a Nova
// shared by a package's tests, each test can have hosts of its own.
func (n *Nova) AddHost(t testing.TB, prefix string) string {
	t.Helper()
	return n.addHost(t, prefix, nil)
}

// addHost is AddHost; prepare, when set, runs once the host's fake host
// and compute configuration exist, before its nova-compute starts.
func (n *Nova) addHost(t testing.TB, prefix string, prepare func(h string) error) string {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	h := prefix + "-" + n.id
	n.mu.Lock()
	_, dup := n.fake[h]
	n.mu.Unlock()
	if dup {
		t.Fatalf("AddHost: host %s exists already", h)
	}
	if err := n.prepareHost(h); err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		if err := prepare(h); err != nil {
			t.Fatalf("AddHost %s: %v", h, err)
		}
	}
	n.mu.Lock()
	n.hosts = append(n.hosts, h)
	n.mu.Unlock()
	if err := n.startCompute(h); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.retireHost(h) })
	if err := n.waitReady(ctx, []string{h}); err != nil {
		t.Fatalf("AddHost %s: %v\n%s", h, err, n.LogTail(30))
	}
	return h
}

// RemoteCompute is a nova-compute this harness does not run (one in the
// lab VM, with Nova's libvirt driver) but whose services it serves: Config
// is what its nova.conf adds to the run's own (Launcher's --config-file
// ConfigFile, then this).
type RemoteCompute struct {
	Launcher   string // launcher.py of the run
	ConfigFile string // the run's nova.conf
	Config     string // [DEFAULT] host, transport_url and [placement] for the remote side
}

// AddRemoteHost prepares a nova-compute that runs elsewhere as host,
// reaching this machine's loopback services at addr (the lab VM's
// 10.0.2.2). The host's name must be its hypervisor's node name (so its
// compute node provider is named host); Close removes its providers and
// allocations as it does those of the harness's own hosts. Start the
// compute, then WaitHost.
func (n *Nova) AddRemoteHost(host, addr string) (RemoteCompute, error) {
	swap := func(u string) (string, error) {
		p, err := url.Parse(u)
		if err != nil {
			return "", err
		}
		port := p.Port()
		p.Host = addr
		if port != "" {
			p.Host = net.JoinHostPort(addr, port)
		}
		return p.String(), nil
	}
	transport, err := swap(n.transport)
	if err != nil {
		return RemoteCompute{}, fmt.Errorf("transport url: %w", err)
	}
	placement, err := swap(n.placement)
	if err != nil {
		return RemoteCompute{}, fmt.Errorf("placement url: %w", err)
	}
	// The host's name is fixed (its node name), so a run that was killed
	// may have left its provider tree: Nova would fail to create its own.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := n.removeTrees(ctx, []string{host}, nil); err != nil {
		return RemoteCompute{}, fmt.Errorf("remove %s's stale providers: %w", host, err)
	}
	n.mu.Lock()
	n.hosts = append(n.hosts, host)
	n.mu.Unlock()
	return RemoteCompute{
		Launcher:   filepath.Join(n.dir, "launcher.py"),
		ConfigFile: filepath.Join(n.dir, "nova.conf"),
		Config: fmt.Sprintf("[DEFAULT]\nhost = %s\ntransport_url = %s\n[placement]\nendpoint_override = %s\n",
			host, transport, placement),
	}, nil
}

// WaitHost waits, up to within, until host's nova-compute is up with its
// resource provider, then maps it to the cell.
func (n *Nova) WaitHost(ctx context.Context, host string, within time.Duration) error {
	return n.waitReadyWithin(ctx, []string{host}, within)
}

// novaModules are what the launcher imports.
var novaModules = []string{"nova.cmd.compute", "nova.tests.fixtures", "nova.virt.fake", "wsgi_intercept", "psycopg2", "fixtures"}

// checkInstalled fails with the install command when python (or one of
// modules, looked up without importing them) is missing.
func checkInstalled(ctx context.Context, python string, modules []string) error {
	if _, err := os.Stat(python); err != nil {
		return fmt.Errorf("%s is missing (%v): Nova's tests need Debian's python3-nova; %s", python, err, installHint)
	}
	cmd := exec.CommandContext(ctx, python, "-c", `import importlib.util as u, sys
def find(m):
    try:
        return u.find_spec(m) is not None
    except ImportError:
        return False
missing = [m for m in sys.argv[1:] if not find(m)]
sys.exit("missing Python modules: " + ", ".join(missing) if missing else 0)`)
	cmd.Args = append(cmd.Args, modules...)
	cmd.Env = pythonEnv(nil)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("python3-nova is not usable by %s (%v: %s); %s", python, err, lastLines(string(out), 3), installHint)
	}
	return nil
}

// pythonEnv is the environment of the Python processes: the test's,
// without what would make /usr/bin/python3 load another Python's modules.
func pythonEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV", "PYENV_VERSION", "OS_AUTH_URL", "OS_CLOUD":
			continue
		}
		env = append(env, kv)
	}
	return append(env, append([]string{"PYTHONNOUSERSITE=1", "PYTHONDONTWRITEBYTECODE=1"}, extra...)...)
}

// StartupTime is how long New took.
func (n *Nova) StartupTime() time.Duration { return n.started }

// ComputeEndpoint is the compute API's base URL, with /v2.1.
func (n *Nova) ComputeEndpoint() string { return n.api }

// Token is the X-Auth-Token the API accepts (noauth2: user:project).
func (n *Nova) Token() string { return "admin:admin" }

// Hosts are the compute hosts, which FakeDriver also uses as node names
// (and so as the names of their Placement root providers).
func (n *Nova) Hosts() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.hosts...)
}

// TransportURL is Nova's RabbitMQ transport in oslo form (rabbit://…).
func (n *Nova) TransportURL() string { return n.transport }

// AMQPURL is TransportURL as an amqp:// URL.
func (n *Nova) AMQPURL() string { return "amqp://" + strings.TrimPrefix(n.transport, "rabbit://") }

// PlacementURL is the Placement Nova uses.
func (n *Nova) PlacementURL() string { return n.placement }

// Dir holds the services' configuration and logs.
func (n *Nova) Dir() string { return n.dir }

// MarkFailed keeps the log directory on Close (for TestMain, after a
// failed m.Run).
func (n *Nova) MarkFailed() {
	n.mu.Lock()
	n.failed = true
	n.mu.Unlock()
}

func (n *Nova) dbName(cell string) string { return "novatest_" + n.id + "_" + cell }

func (n *Nova) dbURL(cell string) string {
	u, _ := url.Parse(testsvc.PostgresAdminURL())
	u.Scheme = "postgresql+psycopg2"
	u.Path = "/" + n.dbName(cell)
	u.RawQuery = ""
	return u.String()
}

// createDatabases creates n's api, cell0 and cell1 databases: copies of
// the migrated templates when there are any (then it returns true), else
// empty ones.
func (n *Nova) createDatabases(ctx context.Context) (bool, error) {
	conn, err := pgx.Connect(ctx, testsvc.PostgresAdminURL())
	if err != nil {
		return false, fmt.Errorf("connect to Postgres at %s: %w; start it with `make services`", testsvc.PostgresAdminURL(), err)
	}
	defer conn.Close(ctx)
	if ok, err := n.createFromTemplates(ctx, conn); ok || err != nil {
		return ok, err
	}
	for _, c := range []string{"api", "cell0", "cell1"} {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+n.dbName(c)); err != nil {
			return false, fmt.Errorf("create database %s: %w", n.dbName(c), err)
		}
		n.dbs = append(n.dbs, n.dbName(c))
	}
	return false, nil
}

func dropDatabases(ctx context.Context, names []string) error {
	if len(names) == 0 {
		return nil
	}
	conn, err := pgx.Connect(ctx, testsvc.PostgresAdminURL())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var errs []error
	for _, d := range names {
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+d+" WITH (FORCE)"); err != nil {
			errs = append(errs, fmt.Errorf("drop database %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

func (n *Nova) createVhost(ctx context.Context) error {
	base := rabbitURL()
	u, err := url.Parse(base)
	if err != nil {
		return err
	}
	n.vhost = "novatest-" + n.id
	if err := rabbitmqctl(ctx, "add_vhost", n.vhost); err != nil {
		n.vhost = ""
		return err
	}
	user := u.User.Username()
	if err := rabbitmqctl(ctx, "set_permissions", "-p", n.vhost, user, ".*", ".*", ".*"); err != nil {
		return err
	}
	u.Scheme, u.Path, u.RawPath = "rabbit", "/"+n.vhost, ""
	n.transport = u.String()
	return nil
}

// rabbitmqctl runs rabbitmqctl (VGPU_TEST_RABBITMQCTL, e.g. "sudo
// rabbitmqctl", or rabbitmqctl as root).
func rabbitmqctl(ctx context.Context, args ...string) error {
	c := []string{"rabbitmqctl"}
	if s := os.Getenv("VGPU_TEST_RABBITMQCTL"); s != "" {
		c = strings.Fields(s)
	}
	out, err := exec.CommandContext(ctx, c[0], append(c[1:], args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s (a vhost per run needs rabbitmqctl next to the broker, as root or VGPU_TEST_RABBITMQCTL=\"sudo rabbitmqctl\"; or pass Options.TransportURL)",
			strings.Join(c, " "), strings.Join(args, " "), err, lastLines(string(out), 3))
	}
	return nil
}

func (n *Nova) writeConfig(port int) error {
	if err := os.MkdirAll(filepath.Join(n.dir, "logs"), 0o755); err != nil {
		return err
	}
	files := map[string][]byte{"launcher.py": launcherPy, "api-paste.ini": apiPaste}
	var b bytes.Buffer
	fmt.Fprintf(&b, `# Generated by tests/novaharness for run %s.
[DEFAULT]
transport_url = %s
compute_driver = fake.FakeDriver
enabled_apis = osapi_compute
osapi_compute_listen = 127.0.0.1
osapi_compute_listen_port = %d
osapi_compute_workers = 1
state_path = %s
allow_resize_to_same_host = true
graceful_shutdown_timeout = 5
use_stderr = true
debug = false
[api]
auth_strategy = noauth2
[wsgi]
api_paste_config = %s
[api_database]
connection = %s
[database]
connection = %s
[placement]
auth_type = admin_token
token = admin
endpoint_override = %s
[notifications]
notification_format = versioned
[oslo_messaging_notifications]
driver = messagingv2
[oslo_concurrency]
lock_path = %s
[conductor]
workers = 1
[scheduler]
workers = 1
[compute]
resource_provider_association_refresh = 5
[quota]
# The package's tests share one project (admin) and keep their servers.
instances = -1
cores = -1
ram = -1
`, n.id, n.transport, port, filepath.Join(n.dir, "state"), filepath.Join(n.dir, "api-paste.ini"),
		n.dbURL("api"), n.dbURL("cell1"), n.placement, filepath.Join(n.dir, "lock"))
	if n.limits != nil {
		n.limits.writeConfig(&b)
	}
	writePCIConfig(&b, n.pciAliases)
	files["nova.conf"] = b.Bytes()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(n.dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// command is a launcher.py command line; with a ctx, the process is
// killed when ctx ends (nova-manage), else it lives until Close.
func (n *Nova) command(ctx context.Context, service string, args ...string) *exec.Cmd {
	full := append([]string{filepath.Join(n.dir, "launcher.py"), service, "--config-file", filepath.Join(n.dir, "nova.conf")}, args...)
	var cmd *exec.Cmd
	if ctx != context.Background() {
		cmd = exec.CommandContext(ctx, Python, full...)
	} else {
		cmd = exec.Command(Python, full...)
	}
	cmd.Dir = n.dir
	cmd.Env = pythonEnv([]string{"NOVATEST_HOOK_URL=" + n.hook.url, "NOVATEST_IMAGES=" + n.images,
		"NOVATEST_GLANCE_DIR=" + filepath.Join(n.dir, "glance")})
	// Own process group (nova-api forks a worker); killed with us.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// logManage adds a line to logs/manage.log.
func (n *Nova) logManage(format string, args ...any) {
	f, err := os.OpenFile(filepath.Join(n.dir, "logs", "manage.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "\n# "+format+"\n", args...)
}

// manage runs nova-manage args, its output in logs/manage.log.
func (n *Nova) manage(ctx context.Context, args ...string) error {
	logPath := filepath.Join(n.dir, "logs", "manage.log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "\n$ nova-manage %s\n", strings.Join(args, " "))
	var out bytes.Buffer
	cmd := n.command(ctx, "manage", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	f.Write(out.Bytes())
	if err != nil {
		return fmt.Errorf("nova-manage %s: %v: %s", strings.Join(args, " "), err, lastLines(out.String(), 5))
	}
	return nil
}

func (n *Nova) startService(name, service string, args ...string) error {
	logPath := filepath.Join(n.dir, "logs", name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := n.command(context.Background(), service, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start nova-%s: %w", service, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	n.mu.Lock()
	n.procs = append(n.procs, p)
	n.mu.Unlock()
	return nil
}

// exited returns the first service that is no longer running.
func (n *Nova) exited() *proc {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.procs {
		select {
		case <-p.done:
			return p
		default:
		}
	}
	return nil
}

func (n *Nova) waitReady(ctx context.Context, hosts []string) error {
	return n.waitReadyWithin(ctx, hosts, 5*time.Minute)
}

func (n *Nova) waitReadyWithin(ctx context.Context, hosts []string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	step := func(what string, ok func() (bool, error)) error {
		for {
			if p := n.exited(); p != nil {
				return fmt.Errorf("nova %s exited (%v) while waiting for %s; its log %s ends:\n%s", p.name, p.cmd.ProcessState,
					what, p.log, lastLines(readFile(p.log), 15))
			}
			done, err := ok()
			if done {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), err)
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	if err := step("the compute API", func() (bool, error) {
		var v map[string]any
		err := n.do(ctx, http.MethodGet, "/", nil, &v)
		return err == nil, err
	}); err != nil {
		return err
	}
	n.phase("API up")
	for _, h := range hosts {
		if err := step("nova-compute on "+h+" up with its resource provider", func() (bool, error) {
			var out struct {
				Services []struct{ Binary, Host, State string }
			}
			if err := n.do(ctx, http.MethodGet, "/os-services?binary=nova-compute&host="+url.QueryEscape(h), nil, &out); err != nil {
				return false, err
			}
			if len(out.Services) == 0 || out.Services[0].State != "up" {
				return false, fmt.Errorf("service %+v", out.Services)
			}
			_, err := n.providerByName(ctx, h)
			return err == nil, err
		}); err != nil {
			return err
		}
	}
	n.phase("computes up")
	if err := n.manage(ctx, "cell_v2", "discover_hosts", "--verbose"); err != nil {
		return err
	}
	n.phase("discover_hosts")
	return nil
}

// RSS returns the resident memory of each running service (its whole
// process group: nova-api's worker too), in bytes, by service name.
func (n *Nova) RSS() map[string]int64 {
	n.mu.Lock()
	procs := slices.Clone(n.procs)
	n.mu.Unlock()
	groups := map[int]string{}
	for _, p := range procs {
		groups[p.cmd.Process.Pid] = p.name
	}
	out := map[string]int64{}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		pgid, err := syscall.Getpgid(pid)
		name, ok := groups[pgid]
		if err != nil || !ok {
			continue
		}
		// /proc/PID/statm: size resident … in pages.
		f := strings.Fields(readFile(filepath.Join("/proc", d.Name(), "statm")))
		if len(f) > 1 {
			pages, _ := strconv.ParseInt(f[1], 10, 64)
			out[name] += pages * int64(os.Getpagesize())
		}
	}
	return out
}

// LogTail returns the last lines of every service's log.
func (n *Nova) LogTail(lines int) string {
	if n.dir == "" {
		return ""
	}
	var b strings.Builder
	names := []string{filepath.Join(n.dir, "logs", "manage.log")}
	n.mu.Lock()
	procs := slices.Clone(n.procs)
	n.mu.Unlock()
	for _, p := range procs {
		names = append(names, p.log)
	}
	for _, name := range names {
		s := readFile(name)
		if s == "" {
			continue
		}
		fmt.Fprintf(&b, "----- %s (last %d lines)\n%s\n", filepath.Base(name), lines, lastLines(s, lines))
	}
	return b.String()
}

// Close stops the services (SIGTERM to each process group, SIGKILL after
// 10 s), removes the Placement providers and allocations of the run's
// hosts, the databases and the vhost, and the log directory unless the
// run failed. It may be called more than once.
func (n *Nova) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	failed := n.failed
	procs := slices.Clone(n.procs)
	fakes := maps.Clone(n.fake)
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var errs []error
	for _, p := range procs {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	}
	deadline := time.After(10 * time.Second)
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline:
		}
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // the group: nova-api's worker too
		<-p.done
	}
	if n.hook != nil {
		n.hook.close()
	}
	for _, fh := range fakes {
		fh.close()
	}
	if n.placement != "" {
		if err := n.cleanupPlacement(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := dropDatabases(ctx, n.dbs); err != nil {
		errs = append(errs, err)
	}
	if n.vhost != "" {
		if err := rabbitmqctl(ctx, "delete_vhost", n.vhost); err != nil {
			errs = append(errs, err)
		}
	}
	if n.ownDir && !failed {
		os.RemoveAll(n.dir)
	}
	return errors.Join(errs...)
}

// sweep removes what runs of dead test processes left behind (a test
// binary killed by -timeout runs no cleanup): databases, vhosts and
// Placement providers named novatest_nt<pid>x… / novatest-nt<pid>x… /
// …-nt<pid>x… whose pid is gone, and log directories older than a day.
func sweep(ctx context.Context) {
	dead := func(name, prefix string) bool {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			return false
		}
		pidStr, _, ok := strings.Cut(rest, "x")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 {
			return false
		}
		return syscall.Kill(pid, 0) == syscall.ESRCH
	}
	// Log directories kept after failed runs: a day.
	if old, err := filepath.Glob(filepath.Join(os.TempDir(), "novatest-nt*")); err == nil {
		for _, d := range old {
			if fi, err := os.Stat(d); err == nil && time.Since(fi.ModTime()) > 24*time.Hour {
				os.RemoveAll(d)
			}
		}
	}
	sweepPlacement(ctx, envOr("VGPU_TEST_PLACEMENT_URL", "http://127.0.0.1:8778"), func(pid int) bool {
		return pid != os.Getpid() && syscall.Kill(pid, 0) == syscall.ESRCH
	})
	if conn, err := pgx.Connect(ctx, testsvc.PostgresAdminURL()); err == nil {
		var stale []string
		if rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE datname LIKE 'novatest\\_nt%'"); err == nil {
			for rows.Next() {
				var d string
				if rows.Scan(&d) == nil && dead(d, "novatest_nt") {
					stale = append(stale, d)
				}
			}
			rows.Close()
		}
		conn.Close(ctx)
		_ = dropDatabases(ctx, stale)
	}
	c := []string{"rabbitmqctl"}
	if s := os.Getenv("VGPU_TEST_RABBITMQCTL"); s != "" {
		c = strings.Fields(s)
	}
	out, err := exec.CommandContext(ctx, c[0], append(c[1:], "list_vhosts", "--quiet", "--no-table-headers")...).Output()
	if err == nil {
		for _, v := range strings.Fields(string(out)) {
			if dead(v, "novatest-nt") {
				_ = rabbitmqctl(ctx, "delete_vhost", v)
			}
		}
	}
}

func placementURL(ctx context.Context) (string, error) {
	u := envOr("VGPU_TEST_PLACEMENT_URL", "http://127.0.0.1:8778")
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"/", nil)
	req.Header.Set("X-Auth-Token", "admin")
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return "", fmt.Errorf("the Placement at %s is not reachable (%v); start the local services with `make services`", u, err)
	}
	resp.Body.Close()
	return u, nil
}

// rabbitURL is testsvc.RabbitURL's broker, without a testing.TB.
func rabbitURL() string { return envOr("VGPU_TEST_RABBIT_URL", "amqp://guest:guest@127.0.0.1:5672/") }

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func readFile(name string) string {
	b, _ := os.ReadFile(name)
	return string(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
