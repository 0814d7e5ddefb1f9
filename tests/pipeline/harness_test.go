// Package pipeline_test runs the bridge's pipeline and dispatcher end to
// end against the real Postgres, RabbitMQ and Placement, with an
// in-process vgpu-agent on a fake host: webhook request → policy →
// Placement claim → outbox → agent → result → request state.
package pipeline_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/direct"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const (
	t4q      = "nvidia-232"
	t4qTrait = "CUSTOM_NVIDIA_232"
	gpuA     = "0000:3b:00.0" // holds Nova's T4-4Q mdev of instance-00000001
	gpuB     = "0000:d8:00.0" // empty
)

var testPolicy = testsvc.DirectPolicy(testsvc.RuleReleaseOnRequest, testsvc.RuleReleaseOnDelete)

func logger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

// world is what every scenario shares: one database, one fleet host in
// Placement, its fake host, and the bridge's queues.
type world struct {
	t     *testing.T
	ctx   context.Context
	pool  *pgxpool.Pool
	txw   *txWatch // the transactions of the test's pools (outsideTx)
	dbURL string
	host  string // compute service host = fake host name
	node  string // Placement root provider name
	fake  string // fake host directory
	// drv are the fake host's drivers, shared by its agent (every run of
	// it) and the code that plays Nova's libvirt driver on the host: the
	// libvirt test driver keeps its domains in one connection.
	drv      *agent.Drivers
	holder   *policy.Holder
	sc       *gophercloud.ServiceClient
	root     string
	gpus     map[string]string // PCI address → GPU provider uuid
	project  string
	user     string
	results  string
	reports  string
	amqpURL  string
	domains  []fakehost.Domain
	created  []string // consumers to clean up
	requests *requests.Store
	opts     worldOpts
}

func newWorld(t *testing.T) *world { return newWorldWith(t, testPolicy) }

// newWorldWith is newWorld with other policy rules.
// worldOpts change the world newWorldWith builds.
type worldOpts struct {
	moreDomains int            // running domains added on the fake host (w.domains[len-n:])
	gpuBTrait   string         // gpuB's type trait in Placement (default: T4-4Q's)
	gpuBTotal   int            // and its VGPU total (default 4)
	gpuBForeign string         // an mdev of this type on gpuB that Placement does not know of
	projects    map[int]string // the project of w.domains[i], in Placement and the bridge (default w.project)
	vfHetero    bool           // the VF GPU in the driver's heterogeneous (mixed-size) mode
	secondVF    bool           // a second, empty VF GPU (vfPF2)
}

type worldOpt func(*worldOpts)

func withDomains(n int) worldOpt { return func(o *worldOpts) { o.moreDomains = n } }

// withVFHetero puts the fake host's VF GPU in heterogeneous mode.
func withVFHetero() worldOpt { return func(o *worldOpts) { o.vfHetero = true } }

// withSecondVFGPU adds a second H200-like VF GPU, vfPF2, none of its VFs
// typed.
func withSecondVFGPU() worldOpt { return func(o *worldOpts) { o.secondVF = true } }

// withProjects puts w.domains[i] in project projects[i] (Placement's
// consumer and the bridge's instance row).
func withProjects(projects map[int]string) worldOpt {
	return func(o *worldOpts) { o.projects = projects }
}

// withGPUB types gpuB in Placement with trait (total VGPUs), and, when
// foreign is set, puts an mdev of that type on it in the fake host.
func withGPUB(trait string, total int, foreign string) worldOpt {
	return func(o *worldOpts) { o.gpuBTrait, o.gpuBTotal, o.gpuBForeign = trait, total, foreign }
}

// newWorldWith is newWorld with rulesYAML as the policy (PROJECT_ID in it
// stands for the world's project) and opts.
func newWorldWith(t *testing.T, rulesYAML string, opts ...worldOpt) *world {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	o := worldOpts{gpuBTrait: t4qTrait, gpuBTotal: 4}
	for _, fn := range opts {
		fn(&o)
	}
	w := &world{t: t, ctx: ctx, host: testsvc.Name("pipe-host"), project: strings.ReplaceAll(uuid.NewString(), "-", ""),
		user: strings.ReplaceAll(uuid.NewString(), "-", ""), gpus: map[string]string{}, opts: o}
	w.node = w.host + ".nodes.test"
	w.results, w.reports = testsvc.Name("pipe-results"), testsvc.Name("pipe-reports")
	w.amqpURL = testsvc.RabbitURL(t)
	w.dbURL = testsvc.MigratedPostgres(t)
	w.txw = newTxWatch()
	pool, err := store.Open(ctx, store.Config{URL: w.dbURL, Tracer: w.txw})
	testsvc.Must(t, err, "pool")
	t.Cleanup(pool.Close)
	w.pool = pool
	w.requests = requests.NewStore(w.pool, "test")

	dir := t.TempDir()
	rules := filepath.Join(dir, "policy.yaml")
	rulesYAML = strings.ReplaceAll(rulesYAML, "PROJECT_ID", w.project)
	testsvc.Must(t, os.WriteFile(rules, []byte(rulesYAML), 0o644), "policy file")
	h, err := policy.NewHolder(policy.Config{RulesFile: rules, ProfilesFile: "../../etc/vgpu-bridge/profiles.yaml",
		CompatFile: "../../etc/vgpu-bridge/driver-compat.yaml"}, nil)
	testsvc.Must(t, err, "policy")
	w.holder = h

	// The fake host: the default spec with instance uuids of this test
	// (Placement's consumers are shared by every test) and two running
	// domains without a vGPU for the scenarios.
	spec := fakehost.DefaultSpec()
	spec.Host = w.host
	for i := range spec.Domains {
		spec.Domains[i].UUID = uuid.NewString()
	}
	spec.VFIOGPUs[0].Heterogeneous = o.vfHetero
	if o.secondVF {
		g := spec.VFIOGPUs[0]
		g.Addr, g.IOMMUGroup, g.Current = pci.MustParse(vfPF2), 140, nil
		spec.VFIOGPUs = append(spec.VFIOGPUs, g)
	}
	if o.gpuBForeign != "" {
		spec.MdevGPUs[1].Mdevs = append(spec.MdevGPUs[1].Mdevs, fakehost.Mdev{UUID: uuid.NewString(), Type: o.gpuBForeign})
	}
	for i := 4; i <= 7+o.moreDomains; i++ {
		spec.Domains = append(spec.Domains, fakehost.Domain{Name: fmt.Sprintf("instance-%08d", i), UUID: uuid.NewString(), Running: true})
	}
	w.domains = spec.Domains
	w.fake = filepath.Join(dir, "fake")
	_, err = fakehost.Build(w.fake, spec)
	testsvc.Must(t, err, "fake host")

	w.placementFleet()
	t.Cleanup(func() {
		c, err := amqp.Dial(w.amqpURL)
		if err != nil {
			return
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			return
		}
		for _, q := range []string{w.results, w.reports, protocol.AgentQueue(w.host)} {
			ch.QueueDelete(q, false, false, false)
		}
	})
	return w
}

// placementFleet creates what Nova's libvirt driver would: the compute
// node's root provider (VCPU, MEMORY_MB) named like the agent's node, one
// child per T4 with VGPU inventory and the type trait, Nova's own vGPU
// consumer (instance-00000001 on GPU A), and every test instance as a
// consumer holding VCPU and MEMORY_MB.
func (w *world) placementFleet() {
	t, ctx := w.t, w.ctx
	url := testsvc.PlacementURL(t)
	c, err := placement.NewClient(ctx, placement.ClientConfig{Endpoint: url, Token: "admin"})
	testsvc.Must(t, err, "placement client")
	w.sc = c.ServiceClient()
	testsvc.Must(t, traits.Create(ctx, w.sc, t4qTrait).ExtractErr(), "create trait")
	testsvc.Must(t, traits.Create(ctx, w.sc, w.opts.gpuBTrait).ExtractErr(), "create trait")
	w.root = uuid.NewString()
	_, err = resourceproviders.Create(ctx, w.sc, resourceproviders.CreateOpts{Name: w.node, UUID: w.root}).Extract()
	testsvc.Must(t, err, "create root provider")
	t.Cleanup(w.cleanupPlacement)
	w.computeNode(w.root, w.node, w.gpus)
	for i, d := range w.domains {
		res := map[string]allocations.ProviderAllocationsOpts{w.root: {Resources: map[string]int{"VCPU": 2, "MEMORY_MB": 2048}}}
		if i == 0 { // Nova's vGPU instance
			res[w.gpus[gpuA]] = allocations.ProviderAllocationsOpts{Resources: map[string]int{"VGPU": 1}}
		}
		project := cmp.Or(w.opts.projects[i], w.project)
		err := allocations.Update(ctx, w.sc, d.UUID, allocations.UpdateOpts{Allocations: res, ProjectID: project, UserID: w.user,
			ConsumerType: "INSTANCE"}).ExtractErr()
		testsvc.Must(t, err, "instance allocations")
		w.created = append(w.created, d.UUID)
		_, err = w.pool.Exec(ctx, `INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, power_state)
			VALUES ($1, $2, $3, $4, $5, 'active', 'running')`, d.UUID, project, w.user, w.host, w.node)
		testsvc.Must(t, err, "instance row")
	}
}

func (w *world) cleanupPlacement() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range w.created {
		if err := allocations.Delete(ctx, w.sc, c).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
			w.t.Logf("cleanup: allocations of %s: %v", c, err)
		}
	}
	for _, id := range w.gpus {
		if err := resourceproviders.Delete(ctx, w.sc, id).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
			w.t.Logf("cleanup: provider %s: %v", id, err)
		}
	}
	if err := resourceproviders.Delete(ctx, w.sc, w.root).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
		w.t.Logf("cleanup: provider %s: %v", w.root, err)
	}
}

// bridge is one bridge replica: placement service, pipeline, dispatcher.
type bridgeReplica struct {
	svc  *placement.Service
	proc *pipeline.Processor
	// direct is the processor's direct path (its results, failures and
	// deadlines).
	direct *direct.Path
	disp   *dispatch.Dispatcher
	// stop ends the replica's pipeline and dispatcher (as at the test's
	// end); what they committed stays in Postgres.
	stop func()
}

type replicaOpts struct {
	name           string
	requestTimeout time.Duration
	noRun          bool
	// dispatch adjusts the dispatcher's config ([security] keys).
	dispatch func(*dispatch.Config)
	// registry, when set, takes the dispatcher's metrics.
	registry prometheus.Registerer
	// loadInterval turns the load evaluator on (off when 0).
	loadInterval time.Duration
	// tracer, when set, sees the statements of the pipeline's pool.
	tracer pgx.QueryTracer
	// claimErr, when set, is what every Placement claim answers.
	claimErr error
	// lookup, when set, looks up the instances a request names that the
	// bridge does not know (pipeline.Deps.Lookup).
	lookup pipeline.InstanceLookup
	// releaseDelay, when set, is how long every Placement release waits
	// before it is made.
	releaseDelay time.Duration
	// maxAttempts bounds the attempts at an event (the default when 0).
	maxAttempts int
	// owned are the bridge-owned GPUs ([placement] bridge_owned_gpus).
	owned []placement.OwnedDecl
	// retypeOnDemand is [placement] retype_on_demand.
	retypeOnDemand bool
	// retypeHook, when set, sees each step of the re-types of the
	// replica's placement service (placement.Config.RetypeStepHook).
	retypeHook func(step string) error
	// syncInterval is the placement service's (its Run is the test's to start).
	syncInterval time.Duration
	// limits, when set, are the projects' unified limits ([quota]
	// driver = unified_limits).
	limits pipeline.LimitSource
	// novaVFAliases are Nova's PCI aliases of Nova-owned VF GPUs
	// ([placement] nova_vf_aliases).
	novaVFAliases map[string]placement.NovaVFAlias
	// faults, when set, marks the GPUs the agent reports faulted, as the
	// bridge does (controls Store.GPUFaults), and has the placement
	// service read the drains again, as the bridge's listener on the
	// gpus table does.
	faults *controls.Store
	// audit has the placement service audit its changes in Placement
	// (placement.Config.Auditor), as the bridge does.
	audit bool
}

func (w *world) startBridge(o replicaOpts) *bridgeReplica {
	t := w.t
	svc, err := placement.New(w.ctx, placement.Config{Client: placement.ClientConfig{Endpoint: testsvc.PlacementURL(t), Token: "admin"},
		SyncConcurrency: 4, Replica: o.name, OwnedGPUs: o.owned, SyncInterval: o.syncInterval,
		RetypeOnDemand: o.retypeOnDemand, RetypeStepHook: o.retypeHook, Auditor: o.auditor(w.pool)}, w.pool, w.holder.Catalog(), logger())
	testsvc.Must(t, err, "placement service")
	_, err = svc.SyncNow(w.ctx, true, nil)
	if err != nil && err != placement.ErrSyncBusy {
		t.Fatalf("placement sync: %v", err)
	}
	if err == placement.ErrSyncBusy { // the other replica syncs: load the mirror
		ps, err := svc.Store().Load(w.ctx)
		testsvc.Must(t, err, "load mirror")
		svc.Index().Load(ps)
	}
	r := &bridgeReplica{svc: svc}
	if o.requestTimeout == 0 {
		o.requestTimeout = 60 * time.Second
	}
	// The pipeline's own pool (pipeline.Deps.Pool).
	pipePool, err := store.Open(w.ctx, store.Config{URL: w.dbURL, MaxConns: 8, Tracer: tracers{w.txw, o.tracer}})
	testsvc.Must(t, err, "pipeline pool")
	t.Cleanup(pipePool.Close)
	var kick func()
	r.proc, err = pipeline.New(pipeline.Config{Replica: o.name, PollInterval: 50 * time.Millisecond, RequestTimeout: o.requestTimeout,
		WatchdogInterval: 200 * time.Millisecond, RetryMin: 200 * time.Millisecond, RetryMax: time.Second, HostsRefresh: 500 * time.Millisecond,
		LoadInterval: cmp.Or(o.loadInterval, -1), MaxAttempts: o.maxAttempts, NovaVFAliases: o.novaVFAliases},
		pipeline.Deps{Pool: pipePool, Requests: requests.NewStore(pipePool, "vgpu-bridge/"+o.name), Policy: w.holder,
			Placement: withReleaseDelay(withClaimErr(newOutsideTx(t, w.txw, svc), o.claimErr), o.releaseDelay), Catalog: w.holder.Catalog(), Log: logger(), OnOutbox: func() { kick() },
			Lookup: o.lookup, Limits: o.limits})
	testsvc.Must(t, err, "pipeline")
	r.direct = direct.Wire(r.proc)
	dc := dispatch.Config{URLs: []string{w.amqpURL}, ResultsQueue: w.results, ReportsQueue: w.reports,
		ResultsBindings: []string{protocol.ResultRoutingKey(w.host)}, ReportsBindings: []string{protocol.ReportRoutingKey(w.host)},
		RelayInterval: 100 * time.Millisecond, ReconnectMax: 2 * time.Second, Replica: o.name}
	// Signed both ways, as by default (the agents enrol in startAgent).
	keys := testkeys.For(t)
	ring, err := keys.Keyring()
	testsvc.Must(t, err, "agent keys")
	dc.Signer, dc.Keyring, dc.KeyringFile, dc.RequireSigned = keys.Signer(), ring, keys.AgentKeysFile(), true
	if o.dispatch != nil {
		o.dispatch(&dc)
	}
	dd := dispatch.Deps{Pool: w.pool, Requests: requests.NewStore(w.pool, "vgpu-bridge/"+o.name), Results: r.proc,
		Catalog: w.holder.Catalog(), Phase: flow.PhaseOf, Log: logger(), Registry: o.registry}
	if o.faults != nil {
		dd.Faults = func(ctx context.Context, host, node string, gpus []protocol.GPU) error {
			marked, err := o.faults.GPUFaults(ctx, host, node, gpus)
			if len(marked) > 0 {
				svc.RefreshHosts(ctx)
			}
			return err
		}
	}
	r.disp, err = dispatch.New(dc, dd)
	testsvc.Must(t, err, "dispatch")
	kick = r.disp.Kick
	if o.noRun {
		return r
	}
	// The bridge's queues and bindings exist before any agent starts, as
	// they do in a deployment: an agent's first report is published once,
	// and one sent before the binding exists is dropped until its next
	// full report (report_interval, a minute).
	declareTopology(t, w.amqpURL, dc)
	ctx, cancel := context.WithCancel(w.ctx)
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{r.proc.Run, r.direct.Run, r.disp.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				t.Errorf("%s: %v", o.name, err)
			}
		}()
	}
	var once sync.Once
	r.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(r.stop)
	return r
}

// computeNode gives root (the provider of compute node node) what Nova's
// libvirt driver reports: VCPU and MEMORY_MB, and one child per GPU
// (gpuA, gpuB) with 4 VGPU and the T4-4Q trait, recorded in gpus.
func (w *world) computeNode(root, node string, gpus map[string]string) {
	t, ctx := w.t, w.ctx
	_, err := resourceproviders.UpdateInventories(ctx, w.sc, root, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
		"VCPU":      {Total: 64, MinUnit: 1, MaxUnit: 64, StepSize: 1, AllocationRatio: 4},
		"MEMORY_MB": {Total: 262144, MinUnit: 1, MaxUnit: 262144, StepSize: 1, AllocationRatio: 1},
	}}).Extract()
	testsvc.Must(t, err, "root inventory of "+node)
	for _, pci := range []string{gpuA, gpuB} {
		id := uuid.NewString()
		name := testsvc.GPUProviderName(node, pci)
		_, err := resourceproviders.Create(ctx, w.sc, resourceproviders.CreateOpts{Name: name, UUID: id, ParentProviderUUID: root}).Extract()
		testsvc.Must(t, err, "create GPU provider "+name)
		gpus[pci] = id
		total, trait := 4, t4qTrait
		if pci == gpuB && w.opts.gpuBTrait != "" {
			total, trait = w.opts.gpuBTotal, w.opts.gpuBTrait
		}
		r, err := resourceproviders.UpdateInventories(ctx, w.sc, id, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
			"VGPU": {Total: total, MinUnit: 1, MaxUnit: total, StepSize: 1, AllocationRatio: 1},
		}}).Extract()
		testsvc.Must(t, err, "GPU inventory of "+name)
		_, err = resourceproviders.UpdateTraits(ctx, w.sc, id, resourceproviders.UpdateTraitsOpts{ResourceProviderGeneration: r.ResourceProviderGeneration,
			Traits: []string{trait}}).Extract()
		testsvc.Must(t, err, "GPU traits of "+name)
	}
}

// declareTopology declares dc's exchange, queues and bindings now.
func declareTopology(t *testing.T, url string, dc dispatch.Config) {
	t.Helper()
	conn, err := amqp.Dial(url)
	testsvc.Must(t, err, "dial broker")
	defer conn.Close()
	ch, err := conn.Channel()
	testsvc.Must(t, err, "channel")
	testsvc.Must(t, dispatch.Declare(ch, dc), "declare the bridge's topology")
}

// startAgent runs vgpu-agent on the fake host in this process; extra
// are more option overrides (section.name=value).
func (w *world) startAgent(extra ...string) {
	t := w.t
	v, err := agent.LoadConfig(conf.Source{Overrides: append([]string{"DEFAULT.host=" + w.host, "DEFAULT.node=" + w.node,
		"DEFAULT.transport_url=" + testsvc.TransportURL(t), "DEFAULT.state_path=" + t.TempDir(), "DEFAULT.listen=127.0.0.1:0",
		"DEFAULT.report_check_interval=1s", "DEFAULT.reconnect_max_backoff=2s", "DEFAULT.shutdown_timeout=5s",
		// A first report sent before the bridge's queue exists is lost; the next comes soon.
		"DEFAULT.report_interval=5s"},
		append(testkeys.For(t).Agent(w.host), extra...)...)})
	testsvc.Must(t, err, "agent config")
	if w.drv == nil {
		w.drv, err = agent.OpenFakeHost(w.fake)
		testsvc.Must(t, err, "open the fake host")
		t.Cleanup(w.drv.Close) // after every agent run stopped (cleanups run last first)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() {
		done <- agent.RunWith(ctx, v, logger(), agent.RunOptions{FakeHostDir: w.fake, Drivers: w.drv})
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

// submit stores a webhook request and its inbox row the way the webhook
// endpoint does (one transaction) and returns the request id.
func (w *world) submit(typ, instance string, extra map[string]any) uuid.UUID {
	t := w.t
	id := uuid.New()
	inst := uuid.MustParse(instance)
	payload := map[string]any{"request_id": id, "source": "pipetest", "type": typ, "vm_id": instance}
	for k, v := range extra {
		payload[k] = v
	}
	body, _ := json.Marshal(payload)
	err := pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) error {
		if err := w.requests.Create(w.ctx, tx, requests.Request{ID: id, Source: "webhook:pipetest", Kind: typ, InstanceUUID: &inst, Body: body}); err != nil {
			return err
		}
		_, err := tx.Exec(w.ctx, `INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload, request_id)
			VALUES ('webhook:pipetest', $1, $2, $3, now(), $4, $1)`, id.String(), typ, instance, body)
		return err
	})
	testsvc.Must(t, err, "submit request")
	return id
}

// wait polls the request until it is final or within runs out.
func (w *world) wait(id uuid.UUID, within time.Duration) requests.Request {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		r, err := w.requests.Get(w.ctx, id)
		testsvc.Must(w.t, err, "get request")
		if r.State.Final() {
			return r
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("request %s still %s (phase %q, reason %q) after %s", id, r.State, r.Phase, r.Reason, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// plannedReleases returns how many releases of instance's vGPUs are
// planned and not made yet.
func (w *world) plannedReleases(instance string) int {
	var n int
	testsvc.Must(w.t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM planned_releases WHERE instance_uuid::text = $1`, instance).Scan(&n), "planned releases")
	return n
}

// allocations returns a consumer's allocations: provider → class → amount.
func (w *world) allocations(consumer string) map[string]map[string]int {
	a, err := allocations.Get(w.ctx, w.sc, consumer).Extract()
	testsvc.Must(w.t, err, "get allocations")
	out := map[string]map[string]int{}
	for rp, pa := range a.Allocations {
		out[rp] = pa.Resources
	}
	return out
}

// vgpuUnits sums a consumer's VGPU over providers.
func vgpuUnits(al map[string]map[string]int) int {
	n := 0
	for _, res := range al {
		n += res["VGPU"]
	}
	return n
}

func (w *world) mdevExists(id string) bool {
	_, err := os.Lstat(filepath.Join(w.fake, "sys", "bus", "mdev", "devices", id))
	return err == nil
}

func (w *world) available(parent string) int {
	b, err := os.ReadFile(filepath.Join(w.fake, "sys", "class", "mdev_bus", parent, "mdev_supported_types", t4q, "available_instances"))
	testsvc.Must(w.t, err, "available_instances")
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	testsvc.Must(w.t, err, "available_instances")
	return n
}

type attachmentRow struct {
	id, provider, pci, state string
}

func (w *world) attachments(instance string) []attachmentRow {
	rows, err := w.pool.Query(w.ctx, `SELECT id::text, coalesce(provider_uuid::text,''), coalesce(pci_address,''), state
		FROM vgpu_attachments WHERE instance_uuid = $1 ORDER BY created_at`, instance)
	testsvc.Must(w.t, err, "attachments")
	defer rows.Close()
	var out []attachmentRow
	for rows.Next() {
		var a attachmentRow
		testsvc.Must(w.t, rows.Scan(&a.id, &a.provider, &a.pci, &a.state), "scan attachment")
		out = append(out, a)
	}
	return out
}

// reportedActive waits for the host's kept report to list (or, with
// want false, not to list) the mdev as attached to the instance.
func (w *world) reportedActive(mdev, instance string, want bool, within time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var raw []byte
		err := w.pool.QueryRow(w.ctx, `SELECT report FROM hosts WHERE name = $1`, w.host).Scan(&raw)
		if err == nil {
			var r protocol.Report
			testsvc.Must(w.t, json.Unmarshal(raw, &r), "report")
			found := false
			for _, g := range r.GPUs {
				for _, a := range g.Active {
					if a.MdevUUID == mdev && a.InstanceUUID == instance && a.Owner == protocol.OwnerAgent {
						found = true
					}
				}
			}
			if found == want {
				return
			}
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("the agent's report never showed mdev %s attached to %s = %v", mdev, instance, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (w *world) auditCount(reqID uuid.UUID, action string) int {
	var n int
	testsvc.Must(w.t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE request_id = $1 AND action = $2`, reqID.String(), action).Scan(&n), "audit")
	return n
}

// tracers passes each statement to every one of them that is set.
type tracers []pgx.QueryTracer

func (ts tracers) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	for _, t := range ts {
		if t != nil {
			ctx = t.TraceQueryStart(ctx, c, d)
		}
	}
	return ctx
}

func (ts tracers) TraceQueryEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryEndData) {
	for _, t := range ts {
		if t != nil {
			t.TraceQueryEnd(ctx, c, d)
		}
	}
}

// auditor is the placement service's auditor: the bridge's audit log
// when o.audit, else none.
func (o replicaOpts) auditor(pool *pgxpool.Pool) placement.Auditor {
	if !o.audit {
		return nil
	}
	return requests.Auditor{DB: pool, Actor: "vgpu-bridge/" + o.name}
}
