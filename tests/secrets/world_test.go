// Package secrets runs a whole bridge (bridge.Run) and a vgpu-agent on a
// fake host, against the real Postgres, RabbitMQ and Placement, with
// every secret configured, and checks two things of secret handling: that no
// secret ever reaches either daemon's log (debug level, JSON), and that
// secrets rotate on SIGHUP without a restart: webhook secrets, API
// tokens, the bridge's signing key and the keys the agent trusts.
package secrets

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const t4qTrait = "CUSTOM_NVIDIA_232"

// The policy: direct attach on a GPU_REQUEST, release on GPU_RELEASE.
var testPolicy = testsvc.DirectPolicy(testsvc.RuleReleaseOnRequest)

// logBuffer collects a daemon's log lines; safe for concurrent writes.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) Lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimRight(l.b.String(), "\n"), "\n")
}

// Count is how many times s occurs in the log.
func (l *logBuffer) Count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// Last is the last line holding s ("" if none).
func (l *logBuffer) Last(s string) string {
	lines := l.Lines()
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return ""
}

func (l *logBuffer) Contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.b.String(), s)
}

// clock is the agent's signature clock (the real one, behind the hook
// the agent offers for key grace periods).
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// secret is one configured secret and the forms it may appear in.
type secret struct {
	name  string
	forms []string
}

// world is one bridge, one agent on a fake host, and their secrets.
type world struct {
	t    *testing.T
	ctx  context.Context
	dir  string
	host string
	node string
	fake string
	vms  []string // instance uuids on the fake host (running, no vGPU)

	instancesProject string

	bridgeLog, agentLog *logBuffer
	conf                string   // bridge.conf
	overrides           []string // bridge --set
	d                   *bridge.Daemon
	apiURL              string
	clk                 *clock
	agentOverrides      atomic.Pointer[[]string] // what the agent's SIGHUP loads

	// Secrets, in the files the configuration names.
	adminToken, readerToken string
	hmacSecret              []byte // [webhook_source:batch]
	whsec                   []byte // [webhook_source:std], whsec_ base64
	bearer                  string // [webhook_source:alerts]
	rabbitPassword          string
	dbPassword              string
	bridgeKey, agentKey     ed25519.PrivateKey
	secrets                 []secret
}

func randText(prefix string) string {
	b := make([]byte, 18)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// keyFiles writes an Ed25519 key (PEM PKCS#8, 0600) and returns it with
// its public PEM block carrying headers.
func keyFiles(t *testing.T, path string, headers map[string]string) (ed25519.PrivateKey, string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	testsvc.Must(t, err, "key")
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	testsvc.Must(t, err, "pkcs8")
	testsvc.Must(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600), "write key")
	pder, err := x509.MarshalPKIXPublicKey(pub)
	testsvc.Must(t, err, "pkix")
	return priv, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Headers: headers, Bytes: pder}))
}

// publicBlock is the keyring entry of k's public key with headers.
func (w *world) publicBlock(k ed25519.PrivateKey, headers map[string]string) string {
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	testsvc.Must(w.t, err, "pkix")
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Headers: headers, Bytes: der}))
}

// metric sums the samples of a counter or gauge on the bridge's /metrics
// whose line holds labels.
func (w *world) metric(name, labels string) float64 {
	w.t.Helper()
	a := w.do(nil, http.MethodGet, "/metrics", nil, nil)
	sum := 0.0
	for _, line := range strings.Split(string(a.body), "\n") {
		if strings.HasPrefix(line, name) && strings.Contains(line, labels) {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// keySecret lists the forms of a private key that must never be logged.
func keySecret(name string, k ed25519.PrivateKey) secret {
	der, _ := x509.MarshalPKCS8PrivateKey(k)
	pemBody := base64.StdEncoding.EncodeToString(der)
	return secret{name: name, forms: []string{
		hex.EncodeToString(k.Seed()), base64.StdEncoding.EncodeToString(k.Seed()), base64.RawURLEncoding.EncodeToString(k.Seed()),
		hex.EncodeToString(k), base64.StdEncoding.EncodeToString(k),
		pemBody[:48], // the PEM body (any 48 characters of it would do)
	}}
}

func bytesSecret(name string, b []byte) secret {
	return secret{name: name, forms: []string{string(b), hex.EncodeToString(b), base64.StdEncoding.EncodeToString(b),
		base64.RawURLEncoding.EncodeToString(b)}}
}

func textSecret(name, s string) secret {
	return secret{name: name, forms: []string{s, hex.EncodeToString([]byte(s)), base64.StdEncoding.EncodeToString([]byte(s)),
		url.QueryEscape(s)}}
}

func rabbitmqctl(t *testing.T, stdin string, args ...string) {
	t.Helper()
	c := []string{"rabbitmqctl"}
	if s := os.Getenv("VGPU_TEST_RABBITMQCTL"); s != "" {
		c = strings.Fields(s)
	}
	cmd := exec.Command(c[0], append(c[1:], args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s (rabbitmqctl must run next to the broker of testsvc.RabbitURL, as root or via VGPU_TEST_RABBITMQCTL)",
			strings.Join(c, " "), args[0], err, out)
	}
}

// newWorld builds the fleet in Placement, the fake host, every secret and
// the bridge's configuration file, then starts the bridge and the agent
// and waits for the agent's first report.
func newWorld(t *testing.T) *world {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &world{t: t, ctx: ctx, dir: t.TempDir(), host: testsvc.Name("secrets-host"), clk: &clock{},
		bridgeLog: &logBuffer{}, agentLog: &logBuffer{}}
	w.node = w.host + ".nodes.test"
	w.conf = w.path("bridge.conf")

	// A RabbitMQ account of the test's own, so its password is a secret.
	rabbitUser := testsvc.Name("vgpu-secrets")
	w.rabbitPassword = randText("rabbit")
	amqpURL, err := url.Parse(testsvc.RabbitURL(t))
	testsvc.Must(t, err, "rabbit url")
	rabbitmqctl(t, w.rabbitPassword+"\n", "add_user", rabbitUser)
	t.Cleanup(func() {
		cmd := exec.Command("rabbitmqctl", "delete_user", rabbitUser)
		_ = cmd.Run()
	})
	rabbitmqctl(t, "", "set_permissions", "-p", "/", rabbitUser, ".*", ".*", ".*")
	transport := (&url.URL{Scheme: "rabbit", User: url.UserPassword(rabbitUser, w.rabbitPassword), Host: amqpURL.Host, Path: "/"}).String()

	// The database URL carries a password (the test server trusts
	// loopback, so any password passes; it is still a configured secret).
	w.dbPassword = randText("db")
	dbURL, err := url.Parse(testsvc.Postgres(t))
	testsvc.Must(t, err, "db url")
	dbURL.User = url.UserPassword(dbURL.User.Username(), w.dbPassword)

	w.adminToken, w.readerToken = randText("admin-token"), randText("reader-token")
	w.hmacSecret = []byte(randText("hmac"))
	whKey := make([]byte, 24)
	_, _ = rand.Read(whKey)
	w.whsec = whKey
	w.bearer = randText("bearer")
	files := map[string]string{
		"transport_url":   transport,
		"database":        dbURL.String(),
		"api-tokens":      w.adminToken + " admin ops\n" + w.readerToken + " reader viewer\n",
		"batch.secret":    string(w.hmacSecret) + "\n",
		"std.secret":      webhook.SecretPrefix + base64.StdEncoding.EncodeToString(whKey) + "\n",
		"alerts.token":    w.bearer + "\n",
		"placement-token": "admin\n",
		"policy.yaml":     testPolicy,
	}
	for name, content := range files {
		testsvc.Must(t, os.WriteFile(w.path(name), []byte(content), 0o600), "write "+name)
	}
	var bridgePub, agentPub string
	w.bridgeKey, bridgePub = keyFiles(t, w.path("bridge.key"), map[string]string{"Key-Id": "bridge-a"})
	w.agentKey, agentPub = keyFiles(t, w.path("agent.key"), map[string]string{"Key-Id": "agent-a", "Host": w.host})
	testsvc.Must(t, os.WriteFile(w.path("bridge-keys.pem"), []byte(bridgePub), 0o644), "bridge keys")
	testsvc.Must(t, os.WriteFile(w.path("agent-keys.pem"), []byte(agentPub), 0o644), "agent keys")
	w.secrets = []secret{
		textSecret("RabbitMQ password (transport_url)", w.rabbitPassword),
		textSecret("database password ([database] connection_file)", w.dbPassword),
		textSecret("API admin token", w.adminToken),
		textSecret("API reader token", w.readerToken),
		bytesSecret("HMAC secret of [webhook_source:batch]", w.hmacSecret),
		bytesSecret("whsec_ key of [webhook_source:std]", w.whsec),
		textSecret("whsec_ secret text of [webhook_source:std]", webhook.SecretPrefix+base64.StdEncoding.EncodeToString(whKey)),
		textSecret("bearer token of [webhook_source:alerts]", w.bearer),
		keySecret("bridge signing key", w.bridgeKey),
		keySecret("agent signing key", w.agentKey),
	}

	w.fleet()
	w.writeConf("bridge-a", "bridge.key")
	etc := testbridge.EtcDir()
	w.overrides = []string{"DEFAULT.debug=true", "api.listen=127.0.0.1:0",
		"notifications.queue=" + testsvc.Name("vgpu-secrets-notifications"),
		"dispatch.results_queue=" + testsvc.Name("vgpu-secrets-results"), "dispatch.reports_queue=" + testsvc.Name("vgpu-secrets-reports"),
		"placement.endpoint_override=" + testsvc.PlacementURL(t),
		"policy.profiles_file=" + filepath.Join(etc, "profiles.yaml"), "policy.driver_compat_file=" + filepath.Join(etc, "driver-compat.yaml"),
		"pipeline.poll_interval=50ms", "pipeline.deadline_check_interval=200ms",
		"webhooks.write_timeout=3s"} // a stopping bridge waits 2/3 of it for webhooks still draining
	t.Cleanup(w.deleteQueues)
	w.startBridge()
	w.startAgent(transport)
	// The agent's first (signed) report reaches the bridge.
	w.eventually(45*time.Second, "the agent's first report", func() bool {
		var node string
		err := w.d.Pool.QueryRow(ctx, `SELECT node FROM hosts WHERE name = $1`, w.host).Scan(&node)
		return err == nil && node == w.node
	})
	return w
}

func (w *world) path(name string) string { return filepath.Join(w.dir, name) }

// writeFile replaces a file of w.dir the way an operator's tooling would:
// a new file renamed over the old one (mode 0600).
func (w *world) writeFile(name, content string) {
	w.t.Helper()
	tmp := w.path("." + name + ".new")
	testsvc.Must(w.t, os.WriteFile(tmp, []byte(content), 0o600), "write "+name)
	testsvc.Must(w.t, os.Rename(tmp, w.path(name)), "rename "+name)
}

// sendHUP sends SIGHUP to this process, as systemctl reload would.
func sendHUP() error { return syscall.Kill(os.Getpid(), syscall.SIGHUP) }

// writeConf writes bridge.conf: secrets from files only, the signing key
// keyFile with keyID.
func (w *world) writeConf(keyID, keyFile string) {
	c := fmt.Sprintf(`[DEFAULT]
transport_url_file = %[1]s/transport_url
log_format = json

[database]
connection_file = %[1]s/database
auto_migrate = true

[api]
auth_strategy = token
token_file = %[1]s/api-tokens

[placement]
token_file = %[1]s/placement-token

[policy]
rules_file = %[1]s/policy.yaml

[security]
signing_key_file = %[1]s/%[3]s
key_id = %[2]s
agent_keys_file = %[1]s/agent-keys.pem

[webhook_source:batch]
auth = hmac
secret_files = %[1]s/batch.secret

[webhook_source:std]
auth = hmac
secret_files = %[1]s/std.secret

[webhook_source:alerts]
auth = bearer
format = alertmanager
token_files = %[1]s/alerts.token
`, w.dir, keyID, keyFile)
	w.writeFile("bridge.conf", c)
}

// load reads the bridge's configuration the way serve does.
func (w *world) load() (*conf.Values, error) {
	return bridge.LoadConfig(conf.Source{File: w.conf, Overrides: w.overrides})
}

func (w *world) startBridge() {
	t := w.t
	v, err := w.load()
	testsvc.Must(t, err, "bridge config")
	log := slog.New(slog.NewJSONHandler(w.bridgeLog, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(w.ctx)
	started := make(chan *bridge.Daemon, 1)
	done := make(chan error, 1)
	go func() { done <- bridge.Run(ctx, v, log, func(d *bridge.Daemon) { started <- d }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("bridge.Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("bridge did not stop within 30s")
		}
	})
	select {
	case w.d = <-started:
	case err := <-done:
		t.Fatalf("bridge stopped at start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("bridge did not start within 60s")
	}
	// SIGHUP reloads as in serve.
	go w.d.ReloadOnSignal(ctx, w.load)
	w.apiURL = "http://" + w.d.API.Addr()
	w.eventually(2*time.Minute, "bridge ready", func() bool {
		resp, err := http.Get(w.apiURL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func (w *world) startAgent(transport string) {
	t := w.t
	testsvc.Must(t, os.WriteFile(w.path("agent-transport_url"), []byte(transport+"\n"), 0o600), "agent transport")
	overrides := []string{"DEFAULT.host=" + w.host, "DEFAULT.node=" + w.node, "DEFAULT.debug=true", "DEFAULT.log_format=json",
		"DEFAULT.transport_url_file=" + w.path("agent-transport_url"), "DEFAULT.state_path=" + filepath.Join(w.dir, "agent-state"),
		"DEFAULT.listen=127.0.0.1:0", "DEFAULT.report_check_interval=1s", "DEFAULT.reconnect_max_backoff=2s",
		"DEFAULT.shutdown_timeout=5s", "security.bridge_keys_file=" + w.path("bridge-keys.pem"),
		"security.require_signed_commands=true", "security.signing_key_file=" + w.path("agent.key"), "security.key_id=agent-a"}
	overrides = append(overrides, w.diagnosticsOverrides()...) // vgpuctl diagnose (diagnostics_test.go)
	w.agentOverrides.Store(&overrides)
	load := func() (*conf.Values, error) {
		return agent.LoadConfig(conf.Source{Overrides: *w.agentOverrides.Load()})
	}
	v, err := load()
	testsvc.Must(t, err, "agent config")
	logFile, err := os.OpenFile(w.path("agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	testsvc.Must(t, err, "agent log file")
	t.Cleanup(func() { logFile.Close() })
	log := slog.New(slog.NewJSONHandler(io.MultiWriter(w.agentLog, logFile), &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() {
		done <- agent.RunWith(ctx, v, log, agent.RunOptions{FakeHostDir: w.fake, Now: w.clk.now, LoadConfig: load})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("agent did not stop")
		}
	})
}

// fleet creates the compute node in Placement as Nova's libvirt driver
// would (root provider, two T4 children with VGPU and the type trait),
// the instances as consumers, and the fake host with those instances.
func (w *world) fleet() {
	t, ctx := w.t, w.ctx
	c, err := placement.NewClient(ctx, placement.ClientConfig{Endpoint: testsvc.PlacementURL(t), Token: "admin"})
	testsvc.Must(t, err, "placement client")
	sc := c.ServiceClient()
	testsvc.Must(t, traits.Create(ctx, sc, t4qTrait).ExtractErr(), "trait")
	root := uuid.NewString()
	_, err = resourceproviders.Create(ctx, sc, resourceproviders.CreateOpts{Name: w.node, UUID: root}).Extract()
	testsvc.Must(t, err, "root provider")
	var providers, consumers []string
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, c := range consumers {
			if err := allocations.Delete(ctx, sc, c).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
				t.Logf("cleanup: allocations of %s: %v", c, err)
			}
		}
		for _, p := range append(providers, root) {
			if err := resourceproviders.Delete(ctx, sc, p).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
				t.Logf("cleanup: provider %s: %v", p, err)
			}
		}
	})
	_, err = resourceproviders.UpdateInventories(ctx, sc, root, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
		"VCPU":      {Total: 64, MinUnit: 1, MaxUnit: 64, StepSize: 1, AllocationRatio: 4},
		"MEMORY_MB": {Total: 262144, MinUnit: 1, MaxUnit: 262144, StepSize: 1, AllocationRatio: 1},
	}}).Extract()
	testsvc.Must(t, err, "root inventory")
	for _, pci := range []string{"0000:3b:00.0", "0000:d8:00.0"} {
		id := uuid.NewString()
		name := testsvc.GPUProviderName(w.node, pci)
		_, err := resourceproviders.Create(ctx, sc, resourceproviders.CreateOpts{Name: name, UUID: id, ParentProviderUUID: root}).Extract()
		testsvc.Must(t, err, "GPU provider")
		providers = append(providers, id)
		r, err := resourceproviders.UpdateInventories(ctx, sc, id, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
			"VGPU": {Total: 4, MinUnit: 1, MaxUnit: 4, StepSize: 1, AllocationRatio: 1}}}).Extract()
		testsvc.Must(t, err, "GPU inventory")
		_, err = resourceproviders.UpdateTraits(ctx, sc, id, resourceproviders.UpdateTraitsOpts{
			ResourceProviderGeneration: r.ResourceProviderGeneration, Traits: []string{t4qTrait}}).Extract()
		testsvc.Must(t, err, "GPU traits")
	}
	spec := fakehost.DefaultSpec()
	spec.Host = w.host
	for i := range spec.Domains {
		spec.Domains[i].UUID = uuid.NewString()
	}
	for i := 4; i <= 7; i++ {
		d := fakehost.Domain{Name: fmt.Sprintf("instance-%08d", i), UUID: uuid.NewString(), Running: true}
		spec.Domains = append(spec.Domains, d)
		w.vms = append(w.vms, d.UUID)
	}
	project, user := strings.ReplaceAll(uuid.NewString(), "-", ""), strings.ReplaceAll(uuid.NewString(), "-", "")
	for i, d := range spec.Domains {
		res := map[string]allocations.ProviderAllocationsOpts{root: {Resources: map[string]int{"VCPU": 2, "MEMORY_MB": 2048}}}
		if i == 0 { // instance-00000001 holds Nova's own T4-4Q mdev on the first GPU
			res[providers[0]] = allocations.ProviderAllocationsOpts{Resources: map[string]int{"VGPU": 1}}
		}
		err := allocations.Update(ctx, sc, d.UUID, allocations.UpdateOpts{ProjectID: project, UserID: user, ConsumerType: "INSTANCE",
			Allocations: res}).ExtractErr()
		testsvc.Must(t, err, "instance allocations")
		consumers = append(consumers, d.UUID)
	}
	w.fake = filepath.Join(w.dir, "fake")
	_, err = fakehost.Build(w.fake, spec)
	testsvc.Must(t, err, "fake host")
	w.instancesProject = project
}

// addInstances records the test's instances in the bridge's database, as
// Nova's notifications would (the bridge has migrated it by now).
func (w *world) addInstances() {
	for _, vm := range w.vms {
		_, err := w.d.Pool.Exec(w.ctx, `INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, power_state)
			VALUES ($1, $2, 'u', $3, $4, 'active', 'running') ON CONFLICT DO NOTHING`, vm, w.instancesProject, w.host, w.node)
		testsvc.Must(w.t, err, "instance row")
	}
}

func (w *world) deleteQueues() {
	c, err := amqp.Dial(testsvc.RabbitURL(w.t))
	if err != nil {
		return
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return
	}
	_, _ = ch.QueueDelete(protocol.AgentQueue(w.host), false, false, false)
	for _, o := range w.overrides {
		if k, v, _ := strings.Cut(o, "="); strings.HasSuffix(k, "_queue") || k == "notifications.queue" {
			_, _ = ch.QueueDelete(v, false, false, false)
		}
	}
}

func (w *world) eventually(within time.Duration, what string, ok func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// answer is an HTTP answer.
type answer struct {
	status int
	body   []byte
}

func (a answer) field(name string) string {
	var m map[string]any
	_ = json.Unmarshal(a.body, &m)
	s, _ := m[name].(string)
	return s
}

// do sends a request with c (nil: a new client) to the API.
func (w *world) do(c *http.Client, method, path string, body []byte, hdr map[string]string) answer {
	w.t.Helper()
	if c == nil {
		c = &http.Client{Timeout: 15 * time.Second}
	}
	req, err := http.NewRequestWithContext(w.ctx, method, w.apiURL+path, bytes.NewReader(body))
	testsvc.Must(w.t, err, "request")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	testsvc.Must(w.t, err, method+" "+path)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, b}
}

func requestBody(vm string) []byte {
	return []byte(`{"type":"GPU_REQUEST","vm_id":"` + vm + `","workload":"vdi","vgpu_profile":"T4-4Q","count":1}`)
}

// hub posts body to source signed with X-Hub-Signature-256 under key.
func (w *world) hub(c *http.Client, source string, key, body []byte) answer {
	return w.do(c, http.MethodPost, "/v1/webhooks/"+source, body, map[string]string{
		webhook.HeaderHubSignature: webhook.HubSignature(key, body), webhook.HeaderIdempotencyKey: uuid.NewString()})
}

// waitRequest follows a request through the API until it is final.
func (w *world) waitRequest(id string, within time.Duration) answer {
	w.t.Helper()
	var a answer
	w.eventually(within, "request "+id+" final", func() bool {
		a = w.do(nil, http.MethodGet, "/v1/requests/"+id, nil, map[string]string{"X-Auth-Token": w.readerToken})
		switch a.field("state") {
		case "succeeded", "failed", "rejected":
			return true
		}
		return false
	})
	return a
}
