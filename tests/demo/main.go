// Command demo is `make demo`: the product's main job, run against the
// local services (Postgres, RabbitMQ, Placement started by `make
// services`). It starts the real vgpu-bridge and two vgpu-agents on
// simulated compute hosts (--fake-host), creates what Nova would have in
// Placement, publishes real-shaped Nova notifications, sends signed
// webhooks and prints a timeline of what the bridge decided and did,
// then a summary. Everything it creates is removed at the end, also on
// failure or Ctrl-C. It exits non-zero when a step that should succeed
// did not.
//
//	go run ./tests/demo            (after `make build`; run from the repository root)
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

const (
	pgAdminURL   = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	rabbitURL    = "amqp://guest:guest@127.0.0.1:5672/"
	transportURL = "rabbit://guest:guest@127.0.0.1:5672/"
	placementURL = "http://127.0.0.1:8778"
	adminToken   = "demo-admin-token"
	// Nova's project and user in the notification samples (and in the
	// request context nova.WireMessage adds).
	novaProject = "6f70656e737461636b20342065766572"
	novaUser    = "fake"
	t4Trait     = "CUSTOM_NVIDIA_232" // nvidia-232 = GRID T4-4Q
	t42QTrait   = "CUSTOM_NVIDIA_231" // nvidia-231 = GRID T4-2Q, the second T4's type
	t4Type      = "nvidia-232"
	// The fake host's H200-like VF GPU (fakehost.DefaultSpec), bridge-owned
	// on the second host for type 1429 (H200X-70C).
	vfPF      = "0000:c1:00.0"
	vfType    = "1429"
	vfProfile = "H200X-70C"
	overall   = 150 * time.Second // the whole demo, cleanup excluded
)

// The fake host's T4s (fakehost.DefaultSpec).
var gpuPCIs = []string{"0000:3b:00.0", "0000:d8:00.0"}

type host struct {
	name, node string
	agent      bool   // an agent runs on it
	keys       string // its files from vgpu-bridge keys enrol
	fake       string // fake host directory
	root       string // Placement root provider
	gpus       map[string]string
	sameType   bool // both T4s serve T4-4Q (else the second serves T4-2Q)
	proc       *exec.Cmd
}

type instance struct {
	label, uuid, name string
	host              *host
}

type demo struct {
	ctx     context.Context
	start   time.Time
	id      string
	work    string
	dbName  string
	dbURL   string
	sc      *gophercloud.ServiceClient
	hosts   []*host
	vms     []*instance
	api     *apiclient.Client
	apiURL  string
	secret  []byte
	bridge  *exec.Cmd
	queues  []string
	cleanup []func(context.Context)
	failed  []string
	rows    []summaryRow
	names   map[string]string // provider uuid → name
	exited  map[*exec.Cmd]chan struct{}
}

// gone tells whether a process the demo started has exited.
func (d *demo) gone(c *exec.Cmd) bool {
	select {
	case <-d.exited[c]:
		return true
	default:
		return false
	}
}

type summaryRow struct {
	label, id, vm, kind, state, code, reason string
	took                                     time.Duration
}

func main() {
	os.Exit(run())
}

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, overall)
	defer cancel()
	d := &demo{ctx: ctx, start: time.Now(), id: randHex(3), names: map[string]string{}, exited: map[*exec.Cmd]chan struct{}{}}
	err := d.main()
	d.runCleanup()
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		fmt.Println("\nDEMO INTERRUPTED (everything it created was removed)")
		return 130
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		fmt.Printf("\nDEMO FAILED: it did not finish within %s: %v\n", overall, err)
		return 1
	case err != nil:
		fmt.Printf("\nDEMO FAILED: %v\n", err)
		if d.work != "" {
			fmt.Println("(logs were in the temporary directory, removed; rerun with DEMO_KEEP=1 to keep them)")
		}
		return 1
	case len(d.failed) > 0:
		fmt.Printf("\nDEMO FAILED: %d expectation(s) not met:\n", len(d.failed))
		for _, f := range d.failed {
			fmt.Println("  - " + f)
		}
		return 1
	}
	fmt.Printf("\nDemo finished OK in %s.\n", time.Since(d.start).Round(100*time.Millisecond))
	return 0
}

// say prints one timeline line.
func (d *demo) say(format string, a ...any) {
	fmt.Printf("[%6.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, a...))
}

func (d *demo) section(title string) { fmt.Printf("\n== %s\n", title) }

func (d *demo) expect(ok bool, format string, a ...any) {
	if !ok {
		msg := fmt.Sprintf(format, a...)
		d.failed = append(d.failed, msg)
		d.say("!! UNEXPECTED: %s", msg)
	}
}

func (d *demo) onCleanup(f func(context.Context)) { d.cleanup = append(d.cleanup, f) }

func (d *demo) runCleanup() {
	if len(d.cleanup) == 0 {
		return
	}
	fmt.Println("\n== Cleanup")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d.stopProcs()
	for i := len(d.cleanup) - 1; i >= 0; i-- {
		d.cleanup[i](ctx)
	}
	d.say("removed processes, Placement providers and allocations, queues, database %s and the temporary directory", d.dbName)
}

// stopProcs stops every process the demo started, all at once: SIGTERM,
// then SIGKILL of its process group after 15s.
func (d *demo) stopProcs() {
	for c := range d.exited {
		c.Process.Signal(syscall.SIGTERM)
	}
	timeout := time.After(15 * time.Second)
	for c, done := range d.exited {
		select {
		case <-done:
		case <-timeout:
			fmt.Printf("cleanup: %s did not stop on SIGTERM; killing it\n", filepath.Base(c.Path))
			syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (d *demo) main() error {
	fmt.Printf("vgpu-bridge demo %s (%s): the main job against the local Postgres, RabbitMQ and Placement\n", d.id, d.start.UTC().Format(time.RFC3339))
	for _, b := range []string{"bin/vgpu-bridge", "bin/vgpu-agent", "bin/vgpuctl"} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s is missing: run `make build` (or `make demo`) from the repository root", b)
		}
	}
	var err error
	d.work, err = os.MkdirTemp("", "vgpu-demo-"+d.id+"-")
	if err != nil {
		return err
	}
	d.onCleanup(func(context.Context) {
		if os.Getenv("DEMO_KEEP") != "" {
			fmt.Println("kept " + d.work)
			return
		}
		os.RemoveAll(d.work)
	})

	d.section("Setup")
	if err := d.database(); err != nil {
		return fmt.Errorf("postgres: %w (is `make services` done?)", err)
	}
	if err := d.placement(); err != nil {
		return fmt.Errorf("placement: %w", err)
	}
	if err := d.fakeHosts(); err != nil {
		return fmt.Errorf("fake hosts: %w", err)
	}
	if err := d.startBridge(); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	if err := d.startAgents(); err != nil {
		return fmt.Errorf("agents: %w", err)
	}

	d.section("Nova notifications (exchange nova, routing key versioned_notifications.info)")
	if err := d.publishCreates(); err != nil {
		return fmt.Errorf("notifications: %w", err)
	}

	d.section("Webhooks (source demo, HMAC X-Hub-Signature-256)")
	if err := d.webhooks(); err != nil {
		return fmt.Errorf("webhooks: %w", err)
	}

	d.section("GPU fault (an Xid 79 injected through the fake host's NVML mock)")
	if err := d.gpuFault(); err != nil {
		return fmt.Errorf("GPU fault: %w", err)
	}

	d.section("Bridge-owned VF GPU ([placement] bridge_owned_gpus, direct path)")
	if err := d.vfGPU(); err != nil {
		return fmt.Errorf("bridge-owned VF GPU: %w", err)
	}

	d.section("Summary")
	d.summary()
	return nil
}

// database creates the demo's own database (the bridge migrates it).
func (d *demo) database() error {
	d.dbName = "vgpu_demo_" + d.id
	ctx, cancel := context.WithTimeout(d.ctx, 15*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, pgAdminURL)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+d.dbName); err != nil {
		return err
	}
	d.onCleanup(func(ctx context.Context) {
		c, err := pgx.Connect(ctx, pgAdminURL)
		if err != nil {
			fmt.Printf("cleanup: database %s: %v\n", d.dbName, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+d.dbName+" WITH (FORCE)"); err != nil {
			fmt.Printf("cleanup: drop database %s: %v\n", d.dbName, err)
		}
	})
	d.dbURL = "postgres://postgres@127.0.0.1:5432/" + d.dbName + "?sslmode=disable"
	d.say("created database %s", d.dbName)
	return nil
}

// placement creates what Nova's libvirt driver would for each compute
// host: the root provider named like the agent's node (VCPU, MEMORY_MB),
// one child per T4 with VGPU inventory and the vGPU type's trait, and the
// instances as consumers holding VCPU and MEMORY_MB.
func (d *demo) placement() error {
	ctx, cancel := context.WithTimeout(d.ctx, 30*time.Second)
	defer cancel()
	c, err := placement.NewClient(ctx, placement.ClientConfig{Endpoint: placementURL, Token: "admin"})
	if err != nil {
		return err
	}
	d.sc = c.ServiceClient()
	for _, tr := range []string{t4Trait, t42QTrait} {
		if err := traits.Create(ctx, d.sc, tr).ExtractErr(); err != nil {
			return fmt.Errorf("trait: %w (is `make services` done?)", err)
		}
	}
	for i, agent := range []bool{true, true, false} {
		// The first host's T4s both serve T4-4Q (a GPU fault moves a vGPU
		// to the other); the others' second T4 serves T4-2Q (a profile change).
		h := &host{name: fmt.Sprintf("demo-compute-%d-%s", i+1, d.id), agent: agent, gpus: map[string]string{}, sameType: i == 0}
		h.node = h.name + ".demo.local"
		d.hosts = append(d.hosts, h)
		if err := d.providers(ctx, h); err != nil {
			return err
		}
		what := "agent on a fake host"
		if !agent {
			what = "NO agent (its requests cannot complete)"
		}
		second := fmt.Sprintf("VGPU 8 %s", t42QTrait)
		if h.sameType {
			second = fmt.Sprintf("VGPU 4 %s", t4Trait)
		}
		d.say("Placement: provider %s (VCPU 64, MEMORY_MB 256G) + 2 × T4 children (VGPU 4 %s; %s); %s", h.node, t4Trait, second, what)
	}
	// Three instances on the hosts with agents, one on the host without,
	// and vm-5 on the second host for its bridge-owned VF GPU.
	for i, h := range []*host{d.hosts[0], d.hosts[1], d.hosts[0], d.hosts[2], d.hosts[1]} {
		vm := &instance{label: fmt.Sprintf("vm-%d", i+1), uuid: uuid.NewString(), name: fmt.Sprintf("instance-%08x", i+1), host: h}
		d.vms = append(d.vms, vm)
		err := allocations.Update(ctx, d.sc, vm.uuid, allocations.UpdateOpts{
			Allocations: map[string]allocations.ProviderAllocationsOpts{h.root: {Resources: map[string]int{"VCPU": 2, "MEMORY_MB": 2048}}},
			ProjectID:   novaProject, UserID: novaUser, ConsumerType: "INSTANCE"}).ExtractErr()
		if err != nil {
			return fmt.Errorf("allocations of %s: %w", vm.label, err)
		}
		d.onCleanup(func(ctx context.Context) {
			if err := allocations.Delete(ctx, d.sc, vm.uuid).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
				fmt.Printf("cleanup: allocations of %s: %v\n", vm.uuid, err)
			}
		})
	}
	d.say("Placement: consumers vm-1..vm-5 hold VCPU 2 + MEMORY_MB 2048 on their host (as Nova's scheduler claimed)")
	return nil
}

func (d *demo) providers(ctx context.Context, h *host) error {
	h.root = uuid.NewString()
	if _, err := resourceproviders.Create(ctx, d.sc, resourceproviders.CreateOpts{Name: h.node, UUID: h.root}).Extract(); err != nil {
		return fmt.Errorf("root provider %s: %w", h.node, err)
	}
	d.names[h.root] = h.node
	var children []string
	d.onCleanup(func(ctx context.Context) {
		for _, id := range append(children, h.root) {
			if err := resourceproviders.Delete(ctx, d.sc, id).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
				fmt.Printf("cleanup: provider %s: %v\n", id, err)
			}
		}
	})
	if _, err := resourceproviders.UpdateInventories(ctx, d.sc, h.root, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
		"VCPU":      {Total: 64, MinUnit: 1, MaxUnit: 64, StepSize: 1, AllocationRatio: 4},
		"MEMORY_MB": {Total: 262144, MinUnit: 1, MaxUnit: 262144, StepSize: 1, AllocationRatio: 1},
	}}).Extract(); err != nil {
		return fmt.Errorf("root inventory: %w", err)
	}
	for i, pci := range gpuPCIs {
		// The first T4 serves T4-4Q, the second T4-2Q (a GPU holds one type)
		// or, on a sameType host, T4-4Q too.
		total, trait := 4, t4Trait
		if i == 1 && !h.sameType {
			total, trait = 8, t42QTrait
		}
		id := uuid.NewString()
		name := h.node + "_pci_" + strings.NewReplacer(":", "_", ".", "_").Replace(pci)
		if _, err := resourceproviders.Create(ctx, d.sc, resourceproviders.CreateOpts{Name: name, UUID: id, ParentProviderUUID: h.root}).Extract(); err != nil {
			return fmt.Errorf("GPU provider %s: %w", name, err)
		}
		children = append(children, id)
		h.gpus[pci] = id
		d.names[id] = name
		r, err := resourceproviders.UpdateInventories(ctx, d.sc, id, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
			"VGPU": {Total: total, MinUnit: 1, MaxUnit: total, StepSize: 1, AllocationRatio: 1},
		}}).Extract()
		if err != nil {
			return fmt.Errorf("GPU inventory: %w", err)
		}
		if _, err := resourceproviders.UpdateTraits(ctx, d.sc, id, resourceproviders.UpdateTraitsOpts{
			ResourceProviderGeneration: r.ResourceProviderGeneration, Traits: []string{trait}}).Extract(); err != nil {
			return fmt.Errorf("GPU traits: %w", err)
		}
	}
	return nil
}

// fakeHosts builds the simulated hosts (sysfs with two T4s, libvirt test
// driver, NVML mock) with a running domain per instance of the host.
func (d *demo) fakeHosts() error {
	for _, h := range d.hosts {
		if !h.agent {
			continue
		}
		spec := fakehost.DefaultSpec()
		spec.Host = h.name
		spec.MdevGPUs[0].Mdevs = nil   // start with no vGPU at all
		spec.VFIOGPUs[0].Current = nil // (no VF typed by Nova either)
		spec.Domains = nil
		for _, vm := range d.vms {
			if vm.host == h {
				spec.Domains = append(spec.Domains, fakehost.Domain{Name: vm.name, UUID: vm.uuid, Running: true})
			}
		}
		h.fake = filepath.Join(d.work, h.name)
		if _, err := fakehost.Build(h.fake, spec); err != nil {
			return err
		}
		var doms []string
		for _, dom := range spec.Domains {
			doms = append(doms, dom.Name)
		}
		d.say("fake host %s: T4 %s, T4 %s, H200 (VFIO); running domains %s", h.name, gpuPCIs[0], gpuPCIs[1], strings.Join(doms, ", "))
	}
	return nil
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startProc starts a binary with its output in logName; runCleanup
// stops it (SIGTERM, then SIGKILL after 15s).
func (d *demo) startProc(logName string, args ...string) (*exec.Cmd, error) {
	logf, err := os.Create(filepath.Join(d.work, logName))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	done := make(chan struct{})
	d.exited[cmd] = done
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	return cmd, nil
}

func (d *demo) logTail(name string) string {
	b, _ := os.ReadFile(filepath.Join(d.work, name))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return "\n    " + strings.Join(lines, "\n    ")
}

func (d *demo) startBridge() error {
	root, _ := os.Getwd()
	etc := filepath.Join(root, "etc", "vgpu-bridge")
	// The demo policy: the shipped one, with direct attach (the agent
	// hot-plugs into the running domain) instead of a Nova resize.
	src, err := os.ReadFile(filepath.Join(etc, "rules.yaml"))
	if err != nil {
		return err
	}
	pol := strings.Replace(string(src), "attach_mode: nova-resize", "attach_mode: direct-live", 1)
	if pol == string(src) {
		return errors.New("etc/vgpu-bridge/rules.yaml has no `attach_mode: nova-resize` default to change")
	}
	pol += "\n" + gpuFaultRules
	polFile := filepath.Join(d.work, "rules.yaml")
	secretFile := filepath.Join(d.work, "demo-webhook.secret")
	d.secret = []byte("demo-" + randHex(16))
	listen, err := freePort()
	if err != nil {
		return err
	}
	notifQueue := "vgpu-demo-" + d.id + ".notifications"
	results, reports := "vgpu-demo-"+d.id+".results", "vgpu-demo-"+d.id+".reports"
	d.queues = append(d.queues, notifQueue, results, reports)
	conf := fmt.Sprintf(`[DEFAULT]
transport_url = %s
log_format = text

[database]
connection = %s
auto_migrate = true

[api]
listen = %s
auth_strategy = token
token_file = %s

[notifications]
queue = %s
exchange = nova

[dispatch]
results_queue = %s
reports_queue = %s

[pipeline]
request_timeout = 10s
poll_interval = 100ms
deadline_check_interval = 500ms

[placement]
endpoint_override = %s
token_file = %s
# The second host's H200 is the bridge's: the syncing replica publishes
# its provider (CUSTOM_VGPU_BRIDGE, trait CUSTOM_1429) after each sync.
bridge_owned_gpus = %s/%s=%s
sync_interval = 2s

[policy]
rules_file = %s
profiles_file = %s
driver_compat_file = %s

[security]
signing_key_file = %s
key_id = demo-bridge
agent_keys_file = %s

[webhook_source:demo]
auth = hmac
secret_files = %s
`, transportURL, d.dbURL, listen, filepath.Join(d.work, "api-tokens"), notifQueue, results, reports, placementURL,
		filepath.Join(d.work, "placement-token"), d.hosts[1].name, vfPF, vfType, polFile, filepath.Join(etc, "profiles.yaml"), filepath.Join(etc, "driver-compat.yaml"),
		filepath.Join(d.work, "bridge.key"), filepath.Join(d.work, "agent-keys.pem"), secretFile)
	for name, content := range map[string]string{
		"rules.yaml":          pol,
		"demo-webhook.secret": string(d.secret) + "\n",
		"api-tokens":          adminToken + " admin demo\n",
		"placement-token":     "admin\n",
		"bridge.conf":         conf,
	} {
		if err := os.WriteFile(filepath.Join(d.work, name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	cfg := filepath.Join(d.work, "bridge.conf")
	out, err := exec.CommandContext(d.ctx, "bin/vgpu-bridge", "--config", cfg, "policy", "check").CombinedOutput()
	if err != nil {
		return fmt.Errorf("policy check: %v\n%s", err, out)
	}
	d.say("policy: shipped rules.yaml with defaults.attach_mode = direct-live and the GPU fault rules of doc/source/operations.rst "+
		"(move() a direct-path vGPU off a faulted GPU, notify() a Nova-path one's tenant); `vgpu-bridge policy check`: %s", strings.TrimSpace(string(out)))
	d.say("config: %s ([webhook_source:demo] hmac, secret file 0600; [pipeline] request_timeout = 10s)", cfg)
	// Signed commands, results and reports (the default): the bridge's
	// key, then one command per host issues its key pair and enrolls it.
	if out, err = exec.CommandContext(d.ctx, "bin/vgpu-bridge", "--config", cfg, "keys", "init").CombinedOutput(); err != nil {
		return fmt.Errorf("keys init: %v\n%s", err, out)
	}
	d.say("`vgpu-bridge keys init`: signing key %s (key id demo-bridge), empty agent keys file", filepath.Join(d.work, "bridge.key"))
	for _, h := range d.hosts {
		if !h.agent {
			continue
		}
		h.keys = filepath.Join(d.work, h.name+"-keys")
		if out, err = exec.CommandContext(d.ctx, "bin/vgpu-bridge", "--config", cfg, "keys", "enrol", h.name,
			"--key-id", h.name+"-demo", "--out", h.keys, "--etc-dir", h.keys).CombinedOutput(); err != nil {
			return fmt.Errorf("keys enrol %s: %v\n%s", h.name, err, out)
		}
		d.say("`vgpu-bridge keys enrol %s`: key %s-demo trusted for the host's results and reports; agent.key and bridge-keys.pem in %s", h.name, h.name, h.keys)
	}

	// The provider the bridge creates for the bridge-owned GPU goes with the
	// demo (after the bridge stopped): vm-5's allocation first, then it.
	owned := placement.GPUProviderName(d.hosts[1].node, vfPF)
	d.onCleanup(func(ctx context.Context) {
		if err := allocations.Delete(ctx, d.sc, d.vms[4].uuid).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
			fmt.Printf("cleanup: allocations of %s: %v\n", d.vms[4].uuid, err)
		}
		pages, err := resourceproviders.List(d.sc, resourceproviders.ListOpts{Name: owned}).AllPages(ctx)
		if err == nil {
			var ps []resourceproviders.ResourceProvider
			if ps, err = resourceproviders.ExtractResourceProviders(pages); err == nil {
				for _, p := range ps {
					if err := resourceproviders.Delete(ctx, d.sc, p.UUID).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
						fmt.Printf("cleanup: provider %s: %v\n", p.UUID, err)
					}
				}
			}
		}
		if err != nil {
			fmt.Printf("cleanup: provider %s: %v\n", owned, err)
		}
	})
	d.bridge, err = d.startProc("bridge.log", "bin/vgpu-bridge", "--config", cfg, "serve")
	if err != nil {
		return err
	}
	d.apiURL = "http://" + listen
	d.api = apiclient.New(apiclient.Config{URL: d.apiURL, Token: adminToken, Timeout: 10 * time.Second})
	deadline := time.Now().Add(60 * time.Second)
	for {
		r, err := d.api.Ready(d.ctx)
		if err == nil {
			d.say("bridge serving on %s (pid %d, database migrated, first Placement sync done): /readyz %s", d.apiURL, d.bridge.Process.Pid, r.Status)
			return nil
		}
		if d.gone(d.bridge) || time.Now().After(deadline) || d.ctx.Err() != nil {
			return fmt.Errorf("not ready within 60s (%v); bridge.log:%s", err, d.logTail("bridge.log"))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (d *demo) startAgents() error {
	for _, h := range d.hosts {
		if !h.agent {
			continue
		}
		d.queues = append(d.queues, protocol.AgentQueue(h.name))
		var err error
		h.proc, err = d.startProc(h.name+".log", "bin/vgpu-agent", "--config", "", "serve", "--fake-host", h.fake,
			"--set", "DEFAULT.host="+h.name, "--set", "DEFAULT.node="+h.node, "--set", "DEFAULT.transport_url="+transportURL,
			"--set", "DEFAULT.state_path="+filepath.Join(h.fake, "state"), "--set", "DEFAULT.listen=127.0.0.1:0",
			"--set", "DEFAULT.log_format=text", "--set", "DEFAULT.report_check_interval=1s",
			"--set", "DEFAULT.reconnect_max_backoff=2s", "--set", "DEFAULT.shutdown_timeout=5s",
			"--set", "security.bridge_keys_file="+filepath.Join(h.keys, "bridge-keys.pem"),
			"--set", "security.signing_key_file="+filepath.Join(h.keys, "agent.key"), "--set", "security.key_id="+h.name+"-demo")
		if err != nil {
			return err
		}
		d.say("vgpu-agent serve --fake-host … for %s (pid %d)", h.name, h.proc.Process.Pid)
	}
	d.queues = append(d.queues, protocol.AgentQueue(d.hosts[2].name))
	// Wait for each agent's first report to reach the bridge.
	for _, h := range d.hosts {
		if !h.agent {
			continue
		}
		deadline := time.Now().Add(45 * time.Second)
		for {
			r, err := d.report(h)
			if err == nil && r != nil {
				free := 0
				for _, g := range r.GPUs {
					for _, t := range g.Types {
						if t.ID == t4Type {
							free += t.AvailableInstances
						}
					}
				}
				d.say("agent report from %s (node %s): %d GPUs, driver %s, T4-4Q available %d", r.Host, r.Node, len(r.GPUs), r.DriverVersion, free)
				break
			}
			if d.gone(h.proc) || time.Now().After(deadline) || d.ctx.Err() != nil {
				return fmt.Errorf("no report from %s within 45s (%v); %s.log:%s", h.name, err, h.name, d.logTail(h.name+".log"))
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	// /readyz waits for the first full Placement sync; check that the
	// mirror holds every demo host's GPUs.
	for _, h := range d.hosts {
		deadline := time.Now().Add(60 * time.Second)
		for {
			x, err := d.api.Host(d.ctx, h.node)
			// (The second host's bridge-owned GPU joins its T4s once published.)
			if err == nil && x.GPUCount >= len(gpuPCIs) && x.Free > 0 {
				d.say("bridge's Placement mirror: %s has %d GPUs, %d vGPU slots free", h.node, x.GPUCount, x.Free)
				break
			}
			if time.Now().After(deadline) || d.ctx.Err() != nil {
				return fmt.Errorf("the bridge's Placement mirror does not show %s's GPUs within 60s (%v)", h.node, err)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	return nil
}

// report is the host's last report as the bridge keeps it (nil if none).
func (d *demo) report(h *host) (*protocol.Report, error) {
	ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, d.dbURL)
	if err != nil {
		return nil, err
	}
	defer c.Close(ctx)
	var raw []byte
	err = c.QueryRow(ctx, `SELECT report FROM hosts WHERE name = $1 AND report IS NOT NULL`, h.name).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r protocol.Report
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// publishCreates publishes instance.create.end for every instance, built
// from Nova's sample with the instance's uuid, name, host and node.
func (d *demo) publishCreates() error {
	path := filepath.Join(novatest.SamplesDir, "instance-create-end.json")
	sample, err := novatest.ResolveFile(path)
	if err != nil {
		return err
	}
	conn, err := amqp.DialConfig(rabbitURL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	d.onCleanup(func(context.Context) { d.deleteQueues() })
	for _, vm := range d.vms {
		var msg map[string]any
		if err := json.Unmarshal(sample, &msg); err != nil {
			return err
		}
		payload := msg["payload"].(map[string]any)["nova_object.data"].(map[string]any)
		now := time.Now().UTC().Format(time.RFC3339)
		for k, v := range map[string]any{"uuid": vm.uuid, "instance_name": vm.name, "display_name": "demo-" + vm.label,
			"host_name": "demo-" + vm.label, "host": vm.host.name, "node": vm.host.node, "updated_at": now, "launched_at": now} {
			payload[k] = v
		}
		msg["publisher_id"] = "nova-compute:" + vm.host.name
		b, _ := json.Marshal(msg)
		wire, err := nova.WireMessage(b, uuid.NewString(), time.Now())
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(d.ctx, 10*time.Second)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "nova", "versioned_notifications.info", false, false, amqp.Publishing{
			ContentType: "application/json", ContentEncoding: "utf-8", DeliveryMode: amqp.Persistent, Body: wire})
		if err == nil {
			var ok bool
			ok, err = dc.WaitContext(ctx)
			if err == nil && !ok {
				err = errors.New("RabbitMQ nacked the message")
			}
		}
		cancel()
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		d.say("published instance.create.end  %s %s (%s) on host %s", vm.label, vm.uuid, vm.name, vm.host.name)
	}
	// The bridge folds them into its instance records.
	for _, vm := range d.vms {
		deadline := time.Now().Add(30 * time.Second)
		for {
			in, err := d.api.Instance(d.ctx, vm.uuid)
			if err == nil && strings.Contains(string(in.Raw), vm.host.name) {
				d.say("bridge knows %s: host %s, active (from the notification)", vm.label, vm.host.name)
				break
			}
			if time.Now().After(deadline) || d.ctx.Err() != nil {
				return fmt.Errorf("the bridge did not record %s within 30s (%v); bridge.log:%s", vm.label, err, d.logTail("bridge.log"))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

func (d *demo) deleteQueues() {
	conn, err := amqp.DialConfig(rabbitURL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		fmt.Printf("cleanup: RabbitMQ: %v\n", err)
		return
	}
	defer conn.Close()
	for _, q := range d.queues {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		ch.QueueDelete(q, false, false, false)
		ch.Close()
	}
}

func (d *demo) send(label string, vm *instance, body map[string]any, key []byte) (apiclient.WebhookAnswer, error) {
	// A signed body acts once: the nonce makes each request its own.
	body["nonce"] = label + "-" + uuid.NewString()[:8]
	b, _ := json.Marshal(body)
	d.say("%s: POST /v1/webhooks/demo %s", label, b)
	ctx, cancel := context.WithTimeout(d.ctx, 15*time.Second)
	defer cancel()
	return d.api.SendWebhook(ctx, "demo", b, apiclient.WebhookAuth{Scheme: apiclient.SchemeHub, Key: key})
}

// follow polls GET /v1/requests/{id}, printing every state or phase
// change, until the request is final or within runs out.
func (d *demo) follow(label string, vm *instance, id string, within time.Duration) (apiclient.Request, error) {
	var last apiclient.Request
	seen := ""
	deadline := time.Now().Add(within)
	for {
		r, err := d.api.Request(d.ctx, id)
		if err == nil {
			cur := r.State + "/" + r.Phase + "/" + r.Code
			if cur != seen {
				seen = cur
				line := fmt.Sprintf("%s: request %s → %s", label, short(id), strings.ToUpper(r.State))
				if r.Phase != "" {
					line += " (phase " + r.Phase + ")"
				}
				if r.Code != "" {
					line += " code=" + r.Code
				}
				if r.Reason != "" {
					line += ": " + r.Reason
				}
				d.say("%s", line)
			}
			last = r
			if final(r.State) {
				return r, nil
			}
		}
		if time.Now().After(deadline) || d.ctx.Err() != nil {
			return last, fmt.Errorf("%s: request %s not finished within %s (last state %q, %v)", label, id, within, last.State, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func final(s string) bool {
	return s == "succeeded" || s == "failed" || s == "rejected" || s == "cancelled"
}

// short is the tail of a request id: ids are UUIDv7, whose first 48 bits
// are the time in milliseconds, so their heads are the same for weeks; the
// tail is random.
func short(id string) string {
	if len(id) > 8 {
		return id[len(id)-8:]
	}
	return id
}

func (d *demo) record(label string, vm *instance, r apiclient.Request) {
	took := time.Duration(0)
	if r.FinishedAt != nil {
		took = r.FinishedAt.Sub(r.CreatedAt)
	}
	d.rows = append(d.rows, summaryRow{label: label, id: r.ID, vm: vm.label, kind: r.Kind, state: r.State, code: r.Code, reason: r.Reason, took: took})
}

func (d *demo) webhooks() error {
	vm1, vm2, vm4 := d.vms[0], d.vms[1], d.vms[3]
	type step struct {
		label string
		vm    *instance
		body  map[string]any
		want  string
	}
	request := func(vm *instance) map[string]any {
		return map[string]any{"type": "GPU_REQUEST", "vm_id": vm.uuid, "workload": "vdi", "vgpu_profile": "T4-4Q", "count": 1}
	}
	for _, s := range []step{
		{"#1", vm1, request(vm1), "succeeded"},
		{"#2", vm2, request(vm2), "succeeded"},
		// A profile change on the direct path: T4-4Q → T4-2Q, on the T4
		// that offers it (detach and remove the old, create and attach the new).
		{"#2b", vm2, map[string]any{"type": "GPU_RESIZE", "vm_id": vm2.uuid, "workload": "vdi", "vgpu_profile": "T4-2Q"}, "succeeded"},
		{"#3", vm1, map[string]any{"type": "GPU_RELEASE", "vm_id": vm1.uuid}, "succeeded"},
	} {
		ans, err := d.send(s.label, s.vm, s.body, d.secret)
		if err != nil {
			return fmt.Errorf("%s: %w", s.label, err)
		}
		d.say("%s: 202 Accepted, request %s (%s)", s.label, ans.RequestID, ans.StatusURL)
		r, err := d.follow(s.label, s.vm, ans.RequestID, 60*time.Second)
		if err != nil {
			return err
		}
		d.record(s.label, s.vm, r)
		d.expect(r.State == s.want, "%s %s for %s ended %s (%s %s), want %s", s.label, s.body["type"], s.vm.label, r.State, r.Code, r.Reason, s.want)
		d.showAllocations(s.vm)
	}

	// A sender with the wrong secret is refused before anything is stored.
	_, err := d.send("#4", vm2, request(vm2), []byte("not-the-demo-secret-at-all"))
	code := apiclient.StatusCode(err)
	if e, ok := apiclient.AsError(err); ok {
		d.say("#4: refused: %d %s", e.Status, strings.TrimSpace(e.Problem.Title+" "+e.Problem.Detail))
	} else {
		d.say("#4: answer %v", err)
	}
	d.expect(code == http.StatusUnauthorized, "a bad signature got %d (%v), want 401", code, err)
	d.rows = append(d.rows, summaryRow{label: "#4", id: "-", vm: vm2.label, kind: "GPU_REQUEST", state: "refused", code: fmt.Sprint(code), reason: "bad X-Hub-Signature-256"})

	// A request for an instance whose host runs no agent: the claim is
	// made, attach_vgpu is never answered, the request fails at its
	// deadline and the claim is released (compensation).
	ans, err := d.send("#5", vm4, request(vm4), d.secret)
	if err != nil {
		return fmt.Errorf("#5: %w", err)
	}
	d.say("#5: 202 Accepted, request %s — %s has no agent: expect a failure after request_timeout (10s)", ans.RequestID, vm4.host.name)
	r, err := d.follow("#5", vm4, ans.RequestID, 45*time.Second)
	if err != nil {
		return err
	}
	d.record("#5", vm4, r)
	d.expect(r.State == "failed", "#5 for %s ended %s (%s), want failed", vm4.label, r.State, r.Reason)
	d.showAllocations(vm4)
	return nil
}

// gpuFaultRules are the GPU fault rules of doc/source/operations.rst,
// added to the shipped rules.
const gpuFaultRules = `  - name: gpu-fault-move
    description: A vGPU the bridge attached leaves a faulted GPU for a healthy one of its host.
    on: [bridge.GPU_FAULT]
    when: instance.vgpus.exists(v, v.gpu == event.labels.gpu && v.path == "direct")
    then: ['move()']

  - name: gpu-fault-tell
    description: The tenant of a vGPU that came with the flavor (Nova's) is told.
    on: [bridge.GPU_FAULT]
    when: instance.vgpus.exists(v, v.gpu == event.labels.gpu && v.path == "nova")
    then: ['notify("the GPU of your vGPU failed (" + event.labels.reason + "); migrate the VM to get a healthy one")']
`

// gpuFault gives vm-3 a vGPU, injects an Xid 79 on its GPU through the
// fake host's NVML mock (fakehost.FaultsFile, read by the agent), and
// shows what the bridge did: the GPU drained with the fault as reason,
// the rule's move() taking the vGPU to the host's other T4 (a request of
// the bridge's own, kind GPU_FAULT), and an operator's undrain.
func (d *demo) gpuFault() error {
	vm3 := d.vms[2]
	h := vm3.host
	ans, err := d.send("#6", vm3, map[string]any{"type": "GPU_REQUEST", "vm_id": vm3.uuid, "workload": "vdi", "vgpu_profile": "T4-4Q", "count": 1}, d.secret)
	if err != nil {
		return fmt.Errorf("#6: %w", err)
	}
	r, err := d.follow("#6", vm3, ans.RequestID, 60*time.Second)
	if err != nil {
		return err
	}
	d.record("#6", vm3, r)
	d.expect(r.State == "succeeded", "#6 GPU_REQUEST for vm-3 ended %s (%s %s), want succeeded", r.State, r.Code, r.Reason)
	gpuOf := func() string {
		l, err := d.api.Allocations(d.ctx, vm3.uuid)
		if err != nil {
			return ""
		}
		for _, a := range l.Allocations {
			if a.ResourceClass == "VGPU" {
				return a.PCIAddress
			}
		}
		return ""
	}
	sick := gpuOf()
	if sick == "" || h.gpus[sick] == "" {
		return fmt.Errorf("vm-3's vGPU is on no known GPU (%q)", sick)
	}
	d.say("#6: vm-3's vGPU runs on %s GPU %s", h.name, sick)

	file := filepath.Join(h.fake, fakehost.FaultsFile)
	if err := os.WriteFile(file+".tmp", []byte(sick+" xid 79\n"), 0o644); err != nil {
		return err
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		return err
	}
	d.say("#7: Xid 79 (GPU has fallen off the bus) injected on %s GPU %s: %s", h.name, sick, file)
	var drained apiclient.GPU
	deadline := time.Now().Add(20 * time.Second)
	for {
		l, err := d.api.GPUs(d.ctx, apiclient.GPUFilter{})
		if err == nil {
			if i := slices.IndexFunc(l.GPUs, func(g apiclient.GPU) bool { return g.ProviderUUID == h.gpus[sick] }); i >= 0 && l.GPUs[i].Drained {
				drained = l.GPUs[i]
				break
			}
		}
		if time.Now().After(deadline) || d.ctx.Err() != nil {
			return fmt.Errorf("GPU %s not drained within 20s (%v); %s.log:%s", sick, err, h.name, d.logTail(h.name+".log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	d.say("#7: GET /v1/gpus: %s drained, reason %q (no new vGPU lands there; the placement sync adds trait CUSTOM_VGPU_BRIDGE_GPU_FAULT for Nova's scheduler)",
		drained.Name, drained.DrainReason)
	var faultReq string
	deadline = time.Now().Add(20 * time.Second)
	for faultReq == "" {
		l, err := d.api.Requests(d.ctx, apiclient.RequestFilter{InstanceUUID: vm3.uuid})
		if err == nil {
			for _, x := range l.Requests {
				if x.Kind == "GPU_FAULT" {
					faultReq = x.ID
				}
			}
		}
		if faultReq == "" && (time.Now().After(deadline) || d.ctx.Err() != nil) {
			return fmt.Errorf("no GPU_FAULT request for vm-3 within 20s (%v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	d.say("#7: the bridge's event bridge.GPU_FAULT for vm-3: rule gpu-fault-move fired, move() → request %s", short(faultReq))
	r, err = d.follow("#7", vm3, faultReq, 30*time.Second)
	if err != nil {
		return err
	}
	d.record("#7", vm3, r)
	now := gpuOf()
	d.expect(r.State == "succeeded" && now != "" && now != sick, "the move off the faulted GPU ended %s (%s), vm-3's vGPU on %q, want succeeded on another GPU than %s",
		r.State, r.Reason, now, sick)
	d.say("#7: vm-3's vGPU moved from GPU %s to GPU %s (same profile, T4-4Q)", sick, now)
	d.showAllocations(vm3)

	g, err := d.api.SetDrain(d.ctx, apiclient.DrainGPU, h.gpus[sick], "demo: GPU reset, Xid cleared", false)
	if err != nil {
		return fmt.Errorf("#8: undrain: %w", err)
	}
	d.say("#8: operator: DELETE /v1/gpus/%s/drain (vgpuctl undrain gpu): drained=%v; the mark is cleared, the next sync removes the trait", h.gpus[sick], g.Drained)
	d.expect(!g.Drained, "GPU %s still drained after the undrain", sick)
	d.rows = append(d.rows, summaryRow{label: "#8", id: "-", vm: "-", kind: "undrain gpu", state: "done", reason: "operator cleared the fault mark of " + sick})
	return nil
}

// vfGPU shows the second host's bridge-owned VF GPU: the provider the
// bridge published for it (GET /v1/gpus), a direct-path GPU_REQUEST of
// vm-5 for H200X-70C that types a free VF of it and hot-plugs it, the
// claim on the bridge's provider, and `vgpuctl gpus --host` of the host.
func (d *demo) vfGPU() error {
	vm5 := d.vms[4]
	h := vm5.host
	var owned apiclient.GPU
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := d.api.GPUs(d.ctx, apiclient.GPUFilter{Host: h.node})
		if err == nil {
			if i := slices.IndexFunc(l.GPUs, func(g apiclient.GPU) bool {
				return g.PCIAddress == vfPF && g.Owner == "bridge" && g.Free > 0 && g.Trait == "CUSTOM_"+vfType
			}); i >= 0 {
				owned = l.GPUs[i]
				break
			}
		}
		if time.Now().After(deadline) || d.ctx.Err() != nil {
			return fmt.Errorf("the bridge did not publish %s/%s within 30s (%v); bridge.log:%s", h.name, vfPF, err, d.logTail("bridge.log"))
		}
		time.Sleep(250 * time.Millisecond)
	}
	d.names[owned.ProviderUUID] = owned.Name
	d.say("#9: GET /v1/gpus: the bridge published %s for %s/%s=%s: %s %d, trait %s (%s), owner %s (Nova's VGPU flavors never match it)",
		owned.Name, h.name, vfPF, vfType, owned.ResourceClass, owned.Total, owned.Trait, owned.Profile, owned.Owner)

	ans, err := d.send("#9", vm5, map[string]any{"type": "GPU_REQUEST", "vm_id": vm5.uuid, "workload": "training", "vgpu_profile": vfProfile, "count": 1}, d.secret)
	if err != nil {
		return fmt.Errorf("#9: %w", err)
	}
	d.say("#9: 202 Accepted, request %s (%s)", ans.RequestID, ans.StatusURL)
	r, err := d.follow("#9", vm5, ans.RequestID, 60*time.Second)
	if err != nil {
		return err
	}
	d.record("#9", vm5, r)
	d.expect(r.State == "succeeded", "#9 GPU_REQUEST %s for vm-5 on the bridge-owned GPU ended %s (%s %s), want succeeded", vfProfile, r.State, r.Code, r.Reason)
	d.showAllocations(vm5)

	// What an operator sees: vgpuctl against the bridge's API.
	cmd := exec.CommandContext(d.ctx, "bin/vgpuctl", "gpus", "--host", h.name)
	cmd.Env = append(os.Environ(), "VGPUCTL_URL="+d.apiURL, "VGPUCTL_TOKEN="+adminToken)
	out, err := cmd.CombinedOutput()
	d.say("#9: vgpuctl gpus --host %s:", h.name)
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		fmt.Println("    " + l)
	}
	if err != nil {
		d.expect(false, "vgpuctl gpus --host %s: %v", h.name, err)
		return nil
	}
	l, err := d.api.GPUs(d.ctx, apiclient.GPUFilter{Host: h.node})
	used := -1
	if err == nil {
		if i := slices.IndexFunc(l.GPUs, func(g apiclient.GPU) bool { return g.ProviderUUID == owned.ProviderUUID }); i >= 0 {
			used = l.GPUs[i].Used
		}
	}
	d.expect(used == 1, "GET /v1/gpus: %d vGPU(s) used on the bridge-owned GPU %s (%v), want 1", used, owned.Name, err)
	return nil
}

// vgpuOf returns the consumer's allocations in Placement, printed, and
// its VGPU units.
func (d *demo) placementAllocs(vm *instance) (string, int, error) {
	ctx, cancel := context.WithTimeout(d.ctx, 10*time.Second)
	defer cancel()
	a, err := allocations.Get(ctx, d.sc, vm.uuid).Extract()
	if err != nil {
		return "", 0, err
	}
	var parts []string
	units := 0
	for rp, pa := range a.Allocations {
		var res []string
		for rc, n := range pa.Resources {
			res = append(res, fmt.Sprintf("%s=%d", rc, n))
			if rc == "VGPU" || rc == placement.BridgeClass {
				units += n
			}
		}
		sort.Strings(res)
		name := d.names[rp]
		if name == "" {
			name = rp
		}
		parts = append(parts, name+": "+strings.Join(res, ","))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; "), units, nil
}

func (d *demo) showAllocations(vm *instance) {
	s, n, err := d.placementAllocs(vm)
	if err != nil {
		d.say("   Placement allocations of %s: error %v", vm.label, err)
		return
	}
	d.say("   Placement now: %s → %s (vGPUs %d)", vm.label, s, n)
}

func (d *demo) summary() {
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REQ\tID\tINSTANCE\tTYPE\tFINAL STATE\tCODE\tDURATION\tREASON")
	for _, r := range d.rows {
		took := "-"
		if r.took > 0 {
			took = r.took.Round(10 * time.Millisecond).String()
		}
		code := r.code
		if code == "" {
			code = "-"
		}
		reason := r.reason
		if len(reason) > 70 {
			reason = reason[:67] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.label, short(r.id), r.vm, r.kind, r.state, code, took, reason)
	}
	tw.Flush()

	fmt.Println("\nPlacement allocations (GET /allocations/{instance} on Placement):")
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	want := map[string]int{"vm-1": 0, "vm-2": 1, "vm-3": 1, "vm-4": 0, "vm-5": 1}
	for _, vm := range d.vms {
		s, n, err := d.placementAllocs(vm)
		if err != nil {
			s = "error: " + err.Error()
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", vm.label, vm.uuid, s)
		d.expect(err == nil && n == want[vm.label], "%s holds %d vGPU(s) in Placement, want %d", vm.label, n, want[vm.label])
	}
	tw.Flush()

	// The bridge answers from its mirror of Placement.
	bridgeView := func() (map[string]string, map[string]int) {
		text, units := map[string]string{}, map[string]int{}
		for _, vm := range d.vms {
			l, err := d.api.Allocations(d.ctx, vm.uuid)
			if err != nil {
				text[vm.label] = "error: " + err.Error()
				continue
			}
			var parts []string
			for _, a := range l.Allocations {
				p := fmt.Sprintf("%s=%d", a.ResourceClass, a.Amount)
				if a.PCIAddress != "" {
					p += " on " + a.Host + " " + a.PCIAddress
				}
				if a.Profile != "" {
					p += " (" + a.Profile + ")"
				}
				parts = append(parts, p)
				if a.ResourceClass == "VGPU" || a.ResourceClass == placement.BridgeClass {
					units[vm.label] += a.Amount
				}
			}
			sort.Strings(parts)
			if len(parts) == 0 {
				parts = []string{"(no vGPU)"}
			}
			text[vm.label] = strings.Join(parts, ", ")
		}
		return text, units
	}
	fmt.Println("\nBridge's view (GET /v1/allocations?instance=, its Placement mirror):")
	view, units := bridgeView()
	for _, vm := range d.vms {
		fmt.Printf("  %s: %s\n", vm.label, view[vm.label])
		d.expect(units[vm.label] == want[vm.label], "the bridge's view of %s: %d vGPU(s), want %d (Placement holds the truth above)", vm.label, units[vm.label], want[vm.label])
	}

	fmt.Println("\nvGPUs on the simulated hosts (the agents' last reports, and the fake sysfs):")
	byUUID := map[string]string{}
	for _, vm := range d.vms {
		byUUID[vm.uuid] = vm.label
	}
	vm2Has, vm5Has := false, false
	for _, h := range d.hosts {
		if !h.agent {
			fmt.Printf("  %s: no agent\n", h.name)
			continue
		}
		// Give the agent a moment to report the last change.
		var r *protocol.Report
		var lines []string
		deadline := time.Now().Add(5 * time.Second)
		for {
			lines = lines[:0]
			var err error
			r, err = d.report(h)
			if err == nil && r != nil {
				for _, g := range r.GPUs {
					for _, a := range g.Active {
						who := byUUID[a.InstanceUUID]
						if who == "" {
							who = a.InstanceUUID
						}
						if who == "" {
							who = "(no domain)"
						}
						switch {
						case a.MdevUUID != "":
							lines = append(lines, fmt.Sprintf("    mdev %s type %s on %s → %s (owner %s)", a.MdevUUID, a.TypeID, g.PCI, who, a.Owner))
						case a.PCI != "":
							lines = append(lines, fmt.Sprintf("    VF %s type %s of %s → %s (owner %s)", a.PCI, a.TypeID, g.PCI, who, a.Owner))
							if who == "vm-5" {
								vm5Has = true
							}
						}
					}
				}
			}
			if h != d.hosts[1] || vm5Has || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		sysfs, _ := filepath.Glob(filepath.Join(h.fake, "sys", "bus", "mdev", "devices", "*"))
		fmt.Printf("  %s: %d vGPU(s) reported (mdevs and typed VFs), %d mdev(s) in sysfs\n", h.name, len(lines), len(sysfs))
		for _, l := range lines {
			fmt.Println(l)
			if h == d.hosts[1] && strings.Contains(l, "vm-2") {
				vm2Has = true
			}
		}
	}
	d.expect(vm2Has, "the agent of %s does not report vm-2's mdev", d.hosts[1].name)
	d.expect(vm5Has, "the agent of %s does not report vm-5's VF", d.hosts[1].name)
}
