// Command e2e is the end-to-end load harness of the direct path (make
// bench): signed GPU_REQUEST webhooks → request and inbox row → policy →
// Placement claim → outbox → RabbitMQ → vgpu-agent on a fake host
// (attach_vgpu: create the mdev, attach it to the libvirt test driver's domain) →
// results → request succeeded. The bridge's webhook endpoint, pipeline
// (default [pipeline] settings but 8 workers), relay and consumers run in this process
// against the local Postgres, RabbitMQ and Placement; 100 simulated
// compute hosts, each a real vgpu-agent on its own fake host, run in a
// second process (this program again, -agents-child), so that the CPU of
// the bridge and of the agents are counted apart. Each host has two T4 in
// Placement: one set to T4-1Q (16 per GPU), which the requests attach,
// one to T4-2Q (8 per GPU), which profile changes move to.
//
// Each of 3 runs measures
//
//  1. latency: one request at a time, from the webhook POST to the
//     request's finished_at (the transaction that records the last agent
//     result), p50 and p99; and per attach, the SQL the bridge's pools
//     sent (a pgx tracer on them: statements, BEGIN/COMMIT/ROLLBACK apart,
//     transactions, explicit or implicit, statement preparations and the
//     pools' pings) and the CPU of the bridge, of its Postgres backends, of
//     the agents and of Placement; before it, 3 s with nothing sent measure
//     what the bridge's background (its pollers, the agents' periodic
//     reports) and Placement's other clients cost meanwhile, which the
//     figures include, shown at the phase's pace;
//  2. profile change: for each instance the latency phase attached, one at
//     a time, a signed GPU_RESIZE to T4-2Q (break before make: detach_vgpu
//     and remove_mdev of the T4-1Q, then attach_vgpu of a T4-2Q claimed on
//     the host's other T4), from the webhook POST to finished_at, p50 and
//     p99, and its ratio to the attach p50 of the same run;
//  3. throughput: requests for instances spread over the 100 hosts sent
//     at once by 64 clients; completed requests per second from the first
//     POST to the last success;
//
// and baselines on the same machine in the same run: the raw broker
// round trip (a persistent, confirmed publish to a queue, consumed and
// answered on another: what one agent command costs at the least; the
// direct path needs one), one Placement claim (PUT /allocations) alone
// (its latency, and Placement's CPU per claim),
// Placement alone taking as many concurrent claims as the throughput
// phase sends, and the rate of a bare handler on the same HTTP stack
// answering 202 at once. It prints each run and the medians, with the
// ratios e2e p50 / broker round trip, e2e p50 / (claim + 2 round trips +
// the agent's own attach), completed/s over Placement's own rate and over
// bare 202/s, and the CPU per request of this process (the bridge, and
// the harness's webhook clients and polls), the agents' process, the
// bridge's Postgres backends and Placement (uwsgi and its Postgres), with
// the rate their sum allows on this machine's cores; for the latency
// phase, SQL and CPU per attach as above, and the ratio of the bridge's
// and its Postgres's CPU per attach to Placement's per claim. Last, a
// check: the transactions Postgres counted in the database over the runs
// (pg_stat_database, 11 s after the last to let every backend report)
// against the tracers' (the bridge's and the harness's own). The bridge's
// connections and the harness's (polls, set-up, statistics) are apart
// (application_name), so that neither the statements nor the Postgres CPU
// counted as the bridge's include the harness's; this process's CPU
// still includes the harness's webhook clients and waits, which look at
// the database once an agent's result is applied and every 250 ms besides.
// -sql lists the statements of the first latency phase by text;
// -latency-cpuprofile writes a CPU profile of that phase (this process:
// the bridge and the harness's clients), -cpuprofile one of the first
// throughput phase.
//
// Then the fleet phase (-fleet, default 1,000; 0 skips it) sets up afresh
// as many hosts, each with its agent (all in the agents' process, each
// with its own RabbitMQ connection), and after a warm-up of one request per 10
// hosts sends one request for an instance on each host, all at once by
// the same 64 clients. Every request must succeed and no GPU may be
// overbooked (Placement's usage over its total), or the command fails; it
// prints completed/s from the first POST to the last success and the CPU
// per request as the throughput phase does. Its agents scan their hosts
// for the periodic reports every 2 minutes instead of every 10 s (on real
// hosts each scans its own; 1,000 on one machine would take most of 2
// cores); what a command changes is still reported at once. -runs 0 runs
// the fleet phase alone.
//
// Each set-up starts its agents at most 16 at a time not yet reported,
// and first checks, when the broker runs on this machine, that it takes
// one more connection per agent (rabbitmqctl status, else its beam.smp's
// open-file limit): RabbitMQ takes sockets out of its open-file limit,
// 1024 where Debian's broker is started without systemd (make services
// starts it, or restarts it once, with up to 65536, as Debian's unit
// sets), and a broker out of sockets resets everyone's connections.
//
// The instances are as Nova leaves them: each has its VCPU and MEMORY_MB
// allocation, and an instance.create.end in the inbox, which the pipeline
// takes (reading the consumer) before the runs.
//
// Each set-up makes a database of its own (VGPU_TEST_POSTGRES_URL, default
// postgres://postgres@127.0.0.1:5432/postgres) and providers, consumers and
// queues of its own (its tables ANALYZEd once set up, as autovacuum
// would: a Postgres run with it off has no statistics), and removes them
// when its phase ends (also on an error, on Ctrl-C and on -timeout, which
// bounds each phase). On a busy
// 2-core machine the runs take about 3 minutes and the fleet phase about
// 10: 5 of set-up (Placement providers and allocations, fake hosts, the
// bridge's first full sync, the agents), 2 for the 1,000 requests, 1 of
// cleanup.
package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/direct"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
	"github.com/vgpu-bridge/vgpu-bridge/tests/bench/benchkit"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
)

const (
	typeID  = "nvidia-230" // GRID T4-1Q, 16 per T4
	trait   = "CUSTOM_NVIDIA_230"
	profile = "T4-1Q"
	gpuPCI  = "0000:3b:00.0"
	// The second T4 of each host, the profile changes' target.
	traitB   = "CUSTOM_NVIDIA_231" // nvidia-231, GRID T4-2Q, 8 per T4
	profileB = "T4-2Q"
	totalB   = 8
	gpuPCIB  = "0000:d8:00.0"
)

var secret = []byte("bench-e2e-secret-0123456789abcdef")

// The application_name of the bridge's connections and of the harness's
// own (its polls, its set-up, the statistics it reads): the CPU and the
// statements counted as the bridge's are those of appBridge's.
const (
	appBridge  = "vgpu-bench-bridge"
	appHarness = "vgpu-bench-harness"
)

// resultHook passes the agents' results on to the pipeline and, once one
// is applied, wakes a sequential wait (waitAll) so that it need not poll
// the database every few milliseconds.
type resultHook struct {
	dispatch.ResultHandler
	landed chan<- struct{}
}

func (r resultHook) HandleResult(ctx context.Context, res protocol.Result) error {
	err := r.ResultHandler.HandleResult(ctx, res)
	if err == nil {
		select {
		case r.landed <- struct{}{}:
		default:
		}
	}
	return err
}

const benchPolicy = `version: 1
defaults:
  attach_mode: direct-live
  quota: {max_vgpus: 100000, max_vgpus_per_vm: 4}
rules:
  - name: attach-on-request
    on: [webhook.GPU_REQUEST]
    when: preferred != ""
    then: ['attach(preferred, 1)']
  - name: resize-on-request
    on: [webhook.GPU_RESIZE]
    when: event.profile != ""
    then: ['resize(event.profile)']
  - name: release-on-request
    on: [webhook.GPU_RELEASE]
    then: ['release()']
`

func main() {
	hosts := flag.Int("hosts", 100, "simulated compute hosts of the runs; each agent holds a RabbitMQ connection")
	runs := flag.Int("runs", 3, "runs with -hosts hosts (medians are printed); 0: only the fleet phase")
	latN := flag.Int("latency-requests", 20, "sequential requests per run for the latency")
	burst := flag.Int("burst", 100, "requests per run for the throughput")
	clients := flag.Int("clients", 64, "concurrent webhook clients in the throughput phases")
	fleet := flag.Int("fleet", 1000, "after the runs, set up this many hosts afresh and send one request for an instance on each, all at once (a RabbitMQ connection each: `make services` raises the broker's open-file limit); 0: skip")
	verbose := flag.Bool("v", false, "log the bridge and agents to stderr")
	timeout := flag.Duration("timeout", 12*time.Minute, "give up on the runs, and on the fleet phase, after this long each (what it made is removed)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the first throughput phase (the fleet's with -runs 0: bridge and harness; the agents run in a process of their own) to this file")
	latProfile := flag.String("latency-cpuprofile", "", "write a CPU profile of the first run's latency phase (bridge and harness, as -cpuprofile) to this file; raise -latency-requests for more samples")
	sqlTexts := flag.Bool("sql", false, "print the statements the bridge sent per attach in the first run's latency phase, by text, most frequent first (stderr)")
	child := flag.Bool("agents-child", false, "(internal) run the agents described on stdin, one JSON object a line, until stdin ends")
	flag.Parse()
	if *child {
		if err := agentsChild(*verbose); err != nil {
			fail(err)
		}
		return
	}
	switch {
	case *runs < 0 || *fleet < 0:
		fail(errors.New("-runs and -fleet must not be negative"))
	case *runs > 0 && (*hosts < 1 || *latN < 1 || *burst < 1):
		fail(errors.New("-hosts, -latency-requests and -burst must be at least 1 when -runs is"))
	case *runs == 0 && *fleet == 0:
		fail(errors.New("nothing to do: -runs 0 and -fleet 0"))
	}
	// Ctrl-C or a timeout's SIGTERM ends the run; what it made is removed
	// (further signals are ignored until then).
	sctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	lg := slog.New(slog.DiscardHandler)
	if *verbose {
		lg = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	// Each phase has a set-up of its own, removed before the next begins.
	phase := func(nHosts int, fn func(*harness, context.Context) error) error {
		ctx, cancel := context.WithTimeout(sctx, *timeout)
		defer cancel()
		h := &harness{nHosts: nHosts, clients: *clients, log: lg, cpuProfile: *cpuProfile, latProfile: *latProfile, sqlTexts: *sqlTexts, landed: make(chan struct{}, 1)}
		*cpuProfile, *latProfile = "", "" // the first phase's
		err := fn(h, ctx)
		h.cleanup()
		switch {
		case err == nil:
		case sctx.Err() != nil:
			err = errors.New("interrupted; what the run made is removed")
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			err = fmt.Errorf("gave up after %s (-timeout); what the run made is removed: %w", *timeout, err)
		}
		return err
	}
	var err error
	if *runs > 0 {
		err = phase(*hosts, func(h *harness, ctx context.Context) error { return h.run(ctx, *runs, *latN, *burst) })
	}
	if err == nil && *fleet > 0 {
		err = phase(*fleet, (*harness).fleet)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench e2e:", err)
	os.Exit(1)
}

type host struct {
	name, node, dir string
	root, gpu       string
	gpuB            string // the T4-2Q GPU
	instances       []string
}

type harness struct {
	nHosts  int
	clients int
	log     *slog.Logger
	id      string

	dbURL                 string
	pool                  *pgxpool.Pool // the harness's own (application_name appHarness)
	bpool                 *pgxpool.Pool // the bridge's webhook endpoint and Placement service (appBridge)
	bridgeSQL, harnessSQL benchkit.SQLCount
	sqlTexts              bool          // -sql
	landed                chan struct{} // an agent's result was applied (one pending wake at most)
	sc                    *gophercloud.ServiceClient
	amqpURL, transportURL string
	hosts                 []*host
	next                  atomic.Int64 // next free instance (across hosts, round robin)
	results, reports      string
	mu                    sync.Mutex
	claimed               []string // consumers that got a claim
	perHost               int      // instances per host
	cleanups              []func()
	hc                    *http.Client
	url                   string
	seq                   atomic.Int64
	rs                    *requests.Store
	keys                  *testkeys.Ring // signed commands, results and reports, as by default
	cpuProfile            string
	latProfile            string // -latency-cpuprofile: the first latency phase's
	profiling             bool
	agentsPID             int // the agents' process
	setupTook             time.Duration
	agentOpts             []string // more agent options (DEFAULT.x=y)
	vf                    bool     // the runs' bridge-owned VF GPU case (vf.go)
	svc                   *placement.Service
}

func (h *harness) cleanup() {
	for i := len(h.cleanups) - 1; i >= 0; i-- {
		h.cleanups[i]()
	}
}

func env(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// setup makes the database, the hosts (providers, instances, fake hosts),
// the bridge and the agents, with perHost instances on each host, and
// waits until the bridge has taken the instances' instance.create.end.
func (h *harness) setup(ctx context.Context, perHost int) error {
	b := make([]byte, 4)
	rand.Read(b)
	h.id = hex.EncodeToString(b)
	start := time.Now()
	h.amqpURL = env("VGPU_TEST_RABBIT_URL", "amqp://guest:guest@127.0.0.1:5672/")
	h.transportURL = "rabbit://" + strings.TrimPrefix(h.amqpURL, "amqp://")
	// Before anything is made: a broker out of sockets resets connections.
	if err := brokerRoom(ctx, h.amqpURL, h.nHosts); err != nil {
		return err
	}
	if err := h.database(ctx); err != nil {
		return err
	}
	phase := func(what string, t0 time.Time) {
		fmt.Fprintf(os.Stderr, "  setup: %s in %s\n", what, time.Since(t0).Round(time.Millisecond))
	}
	t0 := time.Now()
	if err := h.placementFleet(ctx); err != nil {
		return err
	}
	phase("Placement providers", t0)
	t0 = time.Now()
	h.perHost = perHost
	if err := h.instances(ctx); err != nil {
		return err
	}
	phase("instances and fake hosts", t0)
	t0 = time.Now()
	stop, err := h.bridge(ctx)
	if err != nil {
		return err
	}
	h.cleanups = append(h.cleanups, stop)
	phase("bridge (first full Placement sync)", t0)
	t0 = time.Now()
	if err := h.agents(ctx); err != nil {
		return err
	}
	phase("agents' first reports", t0)
	t0 = time.Now()
	if err := h.inboxDrained(ctx); err != nil {
		return err
	}
	phase("instances' instance.create.end taken", t0)
	t0 = time.Now()
	av, err := h.analyze(ctx)
	if err != nil {
		return err
	}
	phase("statistics (ANALYZE; autovacuum "+av+")", t0)
	h.setupTook = time.Since(start)
	fmt.Printf("e2e direct path: %d hosts (vgpu-agent on a fake host each, two T4: T4-1Q and T4-2Q), %d instances, set up in %s\n",
		h.nHosts, h.nHosts*h.perHost, h.setupTook.Round(time.Second))
	return nil
}

func (h *harness) run(ctx context.Context, runs, latN, burst int) error {
	h.vf = true
	if err := h.setup(ctx, perHost(runs, latN, burst, h.nHosts)); err != nil {
		return err
	}

	// Warm up: one request per 10 hosts.
	if _, err := h.burst(ctx, max(h.nHosts/10, 1)); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	vfLat, vfErr := h.vfLatency(ctx, latN)
	if vfErr != nil {
		return vfErr
	}
	type result struct {
		p50, p99, rtt      time.Duration
		agent              time.Duration // attach_vgpu, published → answered (one broker round trip and the agent's work)
		chP50, chP99       time.Duration // profile change
		claim              time.Duration
		rate, bare         float64
		placementRate      float64 // Placement alone: 100 concurrent PUT /allocations, completed/s
		cpu                burstCPU
		completed, changes int
		claimCPU           time.Duration // Placement's CPU per claim PUT alone
		claimIdle          time.Duration // of which Placement's background at the claims' pace
		cost               attachCost    // the latency phase's, per attach
	}
	// Postgres's own count of the transactions in the database, over the
	// runs, against the tracers' (checked at the end): a backend reports
	// its counts at most once a second, and one gone idle within 10 s.
	const settle = 11 * time.Second
	if err := sleep(ctx, settle); err != nil {
		return err
	}
	bx0, hx0 := h.bridgeSQL.Counts(), h.harnessSQL.Counts()
	x0, err := benchkit.DBTransactions(ctx, h.pool)
	if err != nil {
		return err
	}
	av0, err := benchkit.AutovacuumRuns(ctx, h.pool)
	if err != nil {
		return err
	}
	var rs []result
	for i := 0; i < runs; i++ {
		var r result
		// The bridge's background (pollers, the agents' periodic reports)
		// with nothing to do, then the latency phase.
		const idleFor = 3 * time.Second
		idleSQL0, idleCPU0, it0 := h.bridgeSQL.Counts(), h.sampleCPU(ctx), time.Now()
		if err := sleep(ctx, idleFor); err != nil {
			return err
		}
		idleSQL, idleCPU, idleWall := h.bridgeSQL.Counts().Sub(idleSQL0), h.sampleCPU(ctx).since(idleCPU0, 1), time.Since(it0)
		texts := i == 0 && h.sqlTexts
		if texts {
			h.bridgeSQL.Texts()
			h.bridgeSQL.KeepTexts(true)
		}
		stopLat := h.latencyProfile()
		sql0, lcpu0, t0 := h.bridgeSQL.Counts(), h.sampleCPU(ctx), time.Now()
		lat, attached, err := h.latency(ctx, latN)
		if err != nil {
			stopLat()
			return err
		}
		wall := time.Since(t0)
		stopLat()
		pace := float64(wall) / float64(idleWall) // the idle window's counts at the phase's length
		r.cost = attachCost{n: latN, wall: wall, sql: perAttach(h.bridgeSQL.Counts().Sub(sql0), 1, latN), cpu: h.sampleCPU(ctx).since(lcpu0, latN),
			idleSQL: perAttach(idleSQL, pace, latN), idleCPU: idleCPU.scaled(burstCPU{}, pace, float64(latN))}
		if texts {
			h.bridgeSQL.KeepTexts(false)
			fmt.Fprintf(os.Stderr, "  statements the bridge sent per attach, run 1's latency phase (%d attaches one at a time, with the background meanwhile), by text, with the mean time of a call (round trip, server, rows read; a batch's statements untimed):\n", latN)
			texts, times := h.bridgeSQL.TextsTimed()
			for _, l := range benchkit.TopTextsTimed(texts, times, latN) {
				fmt.Fprintf(os.Stderr, "    %s\n", l)
			}
		}
		r.p50, r.p99 = pct(lat, 50), pct(lat, 99)
		r.agent = h.agentAttach(ctx, attached)
		ch, err := h.change(ctx, attached)
		if err != nil {
			return err
		}
		r.chP50, r.chP99, r.changes = pct(ch, 50), pct(ch, 99), len(ch)
		if r.rtt, err = h.brokerRTT(ctx, 100); err != nil {
			return err
		}
		var claimWall time.Duration
		if r.claim, r.claimCPU, claimWall, err = h.placementClaim(ctx, 20); err != nil {
			return err
		}
		// Placement serves others too: its CPU in the idle window, at the
		// claims' length, is what they (and the bridge's background) cost.
		r.claimIdle = time.Duration(float64(idleCPU.placement) * float64(claimWall) / float64(idleWall) / 20)
		if r.placementRate, err = h.placementBurst(ctx, burst); err != nil {
			return err
		}
		cpu0 := h.sampleCPU(ctx)
		h.startProfile()
		if r.rate, err = h.burst(ctx, burst); err != nil {
			return err
		}
		r.cpu = h.sampleCPU(ctx).since(cpu0, burst)
		h.stopProfile()
		r.completed = burst
		r.bare = h.bare(ctx, 2*time.Second)
		fmt.Printf("run %d: webhook→attached p50 %.1f ms p99 %.1f ms (%d sequential; agent attach_vgpu published→answered p50 %.1f ms) | profile change %s→%s p50 %.1f ms p99 %.1f ms (%d sequential), change/attach p50 %.2f× | broker round trip p50 %.2f ms | Placement claim PUT p50 %.1f ms | %d requests on %d hosts: %.1f completed/s (CPU per request: %s) | Placement alone, %d concurrent PUTs: %.1f/s | bare 202: %.0f req/s\n",
			i+1, ms(r.p50), ms(r.p99), latN, ms(r.agent), profile, profileB, ms(r.chP50), ms(r.chP99), r.changes, ms(r.chP50)/ms(r.p50),
			ms(r.rtt), ms(r.claim), burst, h.nHosts, r.rate, r.cpu, burst, r.placementRate, r.bare)
		fmt.Printf("run %d, latency phase, per attach (%d one at a time in %.1f s): %s | CPU: %s | of these, the idle background at the same pace: %s; CPU: %s | Placement CPU per claim PUT alone %.1f ms, of which its background at the same pace %.1f ms\n",
			i+1, latN, wall.Seconds(), r.cost.sql, r.cost.cpu, r.cost.idleSQL, r.cost.idleCPU, ms(r.claimCPU), ms(r.claimIdle))
		rs = append(rs, r)
	}
	med := func(f func(result) float64) float64 { return benchkit.Median(rs, f) }
	p50 := med(func(r result) float64 { return ms(r.p50) })
	p99 := med(func(r result) float64 { return ms(r.p99) })
	chP50 := med(func(r result) float64 { return ms(r.chP50) })
	chP99 := med(func(r result) float64 { return ms(r.chP99) })
	rtt := med(func(r result) float64 { return ms(r.rtt) })
	claim := med(func(r result) float64 { return ms(r.claim) })
	rate := med(func(r result) float64 { return r.rate })
	bare := med(func(r result) float64 { return r.bare })
	fmt.Printf("median of %d runs: webhook→vGPU attached p50 %.1f ms, p99 %.1f ms; raw broker round trip p50 %.2f ms; ratio p50/round trip %.0f×\n",
		len(rs), p50, p99, rtt, p50/rtt)
	printVF(vfLat, len(rs), p50)
	fmt.Printf("median of %d runs: profile change (GPU_RESIZE %s → %s, detach + remove + attach) p50 %.1f ms, p99 %.1f ms; ratio change p50 / attach p50 %.2f×\n",
		len(rs), profile, profileB, chP50, chP99, chP50/p50)
	fmt.Printf("median of %d runs: one Placement claim (PUT /allocations) p50 %.1f ms; ratio webhook→attached p50 / claim %.1f×\n", len(rs), claim, p50/claim)
	fmt.Printf("median of %d runs: %.1f requests completed/s with %d hosts; bare webhook 202 %.0f req/s; ratio completed/bare %.4f\n",
		len(rs), rate, h.nHosts, bare, rate/bare)
	// The targets: an attach costs a claim, two broker round trips and the
	// agent's own work at the least; a burst is bounded by Placement's own
	// rate of concurrent claims.
	agent := med(func(r result) float64 { return ms(r.agent) })
	own := max(agent-rtt, 0) // published → answered, less the round trip it contains
	floor := claim + 2*rtt + own
	pRate := med(func(r result) float64 { return r.placementRate })
	fmt.Printf("median of %d runs: webhook→attached p50 %.1f ms against claim PUT %.1f + 2 × broker round trip %.2f + agent's own attach %.1f = %.1f ms; ratio %.2f× (target ≤ 1.5×)\n",
		len(rs), p50, claim, rtt, own, floor, p50/floor)
	cpu := burstCPU{bridge: medD(rs, func(r result) time.Duration { return r.cpu.bridge }), agents: medD(rs, func(r result) time.Duration { return r.cpu.agents }),
		postgres: medD(rs, func(r result) time.Duration { return r.cpu.postgres }), placement: medD(rs, func(r result) time.Duration { return r.cpu.placement })}
	fmt.Printf("median of %d runs: %d requests on %d hosts %.1f completed/s against Placement alone %.1f concurrent PUTs/s; ratio %.2f× (target ≥ 0.8×); CPU per request: %s; %s\n",
		len(rs), burst, h.nHosts, rate, pRate, rate/pRate, cpu, cpu.bound())
	// The latency phase's cost per attach.
	medF := func(f func(sqlPer) float64) float64 { return med(func(r result) float64 { return f(r.cost.sql) }) }
	medI := func(f func(sqlPer) float64) float64 { return med(func(r result) float64 { return f(r.cost.idleSQL) }) }
	lc := burstCPU{bridge: medD(rs, func(r result) time.Duration { return r.cost.cpu.bridge }), agents: medD(rs, func(r result) time.Duration { return r.cost.cpu.agents }),
		postgres: medD(rs, func(r result) time.Duration { return r.cost.cpu.postgres }), placement: medD(rs, func(r result) time.Duration { return r.cost.cpu.placement })}
	ic := burstCPU{bridge: medD(rs, func(r result) time.Duration { return r.cost.idleCPU.bridge }), agents: medD(rs, func(r result) time.Duration { return r.cost.idleCPU.agents }),
		postgres: medD(rs, func(r result) time.Duration { return r.cost.idleCPU.postgres }), placement: medD(rs, func(r result) time.Duration { return r.cost.idleCPU.placement })}
	claimCPU := medD(rs, func(r result) time.Duration { return r.claimCPU })
	claimIdle := medD(rs, func(r result) time.Duration { return r.claimIdle })
	fmt.Printf("median of %d runs: latency phase (%d attaches one at a time), SQL per attach from the bridge's pools (pgx tracer): %.1f statements (BEGIN/COMMIT/ROLLBACK not among them: %.1f more), %.1f transactions (BEGINs and statements or batches outside one), %.1f preparations, %.1f pool pings; of these the idle background at the same pace %.1f statements, %.1f transactions\n",
		len(rs), latN, medF(func(p sqlPer) float64 { return p.stmts }), medF(func(p sqlPer) float64 { return p.ctl }), medF(func(p sqlPer) float64 { return p.txs }),
		medF(func(p sqlPer) float64 { return p.prepares }), medF(func(p sqlPer) float64 { return p.pings }),
		medI(func(p sqlPer) float64 { return p.stmts }), medI(func(p sqlPer) float64 { return p.txs }))
	fmt.Printf("median of %d runs: latency phase, CPU per attach: bridge process %.1f ms (with the harness's webhook client and waits), its Postgres backends %.1f ms, together %.1f ms; Placement (uwsgi + its Postgres) %.1f ms per attach, %.1f ms per claim PUT alone; ratio (bridge + its Postgres) / Placement's claim %.2f× (target ≤ 0.5×); agents %.1f ms; of these the idle background at the same pace: bridge %.1f ms, its Postgres %.1f ms, Placement %.1f ms per attach, %.1f ms per claim (Placement serves others too: where that is not small, the Placement figures are not the bridge's alone)\n",
		len(rs), ms(lc.bridge), ms(lc.postgres), ms(lc.bridge+lc.postgres), ms(lc.placement), ms(claimCPU), ms(lc.bridge+lc.postgres)/ms(max(claimCPU, time.Microsecond)), ms(lc.agents),
		ms(ic.bridge), ms(ic.postgres), ms(ic.placement), ms(claimIdle))
	if err := sleep(ctx, settle); err != nil {
		return err
	}
	bx, hx := h.bridgeSQL.Counts().Sub(bx0), h.harnessSQL.Counts().Sub(hx0)
	x1, err := benchkit.DBTransactions(ctx, h.pool)
	if err != nil {
		return err
	}
	av1, err := benchkit.AutovacuumRuns(ctx, h.pool)
	if err != nil {
		return err
	}
	counted := bx.Transactions + bx.Pings + bx.IdlePrepares + bx.Connects + hx.Transactions + hx.Pings + hx.IdlePrepares + hx.Connects
	fmt.Printf("check: Postgres counted %d transactions in the database over the runs (pg_stat_database xact_commit + xact_rollback, %s settled at each end); the tracers %d: the bridge's %d, its pings %d, preparations outside a transaction %d and new connections %d, the harness's %d (%d, %d, %d); Postgres/tracers %.3f (Postgres also counts the transactions of autovacuum, which vacuumed or analyzed %d tables meanwhile)\n",
		x1-x0, settle, counted, bx.Transactions, bx.Pings, bx.IdlePrepares, bx.Connects, hx.Transactions+hx.Pings+hx.IdlePrepares+hx.Connects, hx.Pings, hx.IdlePrepares, hx.Connects, float64(x1-x0)/float64(max(counted, 1)), av1-av0)
	over, err := h.overbooked(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("overbooked GPUs after the runs: %d of %d (Placement's usages against each GPU's total)\n", over, 2*len(h.hosts))
	if over > 0 {
		return fmt.Errorf("%d GPU(s) overbooked after the runs", over)
	}
	return nil
}

// fleet is the fleet phase: after a warm-up (one request per 10 hosts),
// one request for an instance on each host, all sent at once by h.clients
// clients; every one must succeed and no GPU may be overbooked.
func (h *harness) fleet(ctx context.Context) error {
	n := h.nHosts
	warm := max(n/10, 1)
	// Every agent scans its host for its reports, every 10 s for a change
	// and every minute in full: 1,000 agents in one process would spend
	// most of 2 cores on it (on real hosts each scans its own). Every 2
	// minutes keeps the reports well within the bridge's stale_report_age
	// (5 minutes); what a command changes is still reported at once.
	h.agentOpts = []string{"DEFAULT.report_interval=2m", "DEFAULT.report_check_interval=2m"}
	// Enough instances for the warm-up and one request per host (each
	// instance is an allocation to make, and to delete).
	if err := h.setup(ctx, (warm+n+n-1)/n); err != nil {
		return err
	}
	if _, err := h.burst(ctx, warm); err != nil {
		return fmt.Errorf("fleet warm-up: %w", err)
	}
	// The instances are taken round robin over the hosts: n in a row are
	// on n distinct hosts.
	cpu0 := h.sampleCPU(ctx)
	h.startProfile()
	t0 := time.Now()
	rate, err := h.burst(ctx, n)
	if err != nil {
		return fmt.Errorf("fleet: %d requests on %d hosts: %w", n, n, err)
	}
	took := time.Since(t0)
	cpu := h.sampleCPU(ctx).since(cpu0, n)
	h.stopProfile()
	over, err := h.overbooked(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("fleet: %d requests on %d hosts (one each, sent at once by %d clients): %d of %d succeeded, %.1f completed/s (all done in %s); CPU per request: %s; %s; overbooked GPUs: %d of %d; set up in %s\n",
		n, n, h.clients, n, n, rate, took.Round(time.Millisecond), cpu, cpu.bound(), over, 2*n, h.setupTook.Round(time.Second))
	if over > 0 {
		return fmt.Errorf("fleet: %d of %d GPUs overbooked", over, 2*n)
	}
	return nil
}

// brokerRoom fails when the broker, if it runs on this machine and its
// limits can be read, would not take n more AMQP connections (n agents and
// the bridge's few): RabbitMQ takes sockets out of its open-file limit,
// and one out of them resets connections, the harness's and everyone
// else's.
func brokerRoom(ctx context.Context, amqpURL string, n int) error {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return fmt.Errorf("VGPU_TEST_RABBIT_URL: %w", err)
	}
	if ip := net.ParseIP(u.Hostname()); u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil // another machine's: its limits cannot be read from here
	}
	limit, used, from := brokerSockets(ctx)
	if limit == 0 {
		fmt.Fprintf(os.Stderr, "  setup: could not read the local RabbitMQ's limits (neither `rabbitmqctl status` nor /proc): %d connections unchecked\n", n)
		return nil
	}
	const spare = 50 // the bridge's connections, the harness's and other clients'
	fmt.Fprintf(os.Stderr, "  setup: RabbitMQ takes %d more connections (%s); %d hosts need %d\n", limit-used, from, n, n+spare)
	if limit-used < n+spare {
		return fmt.Errorf("RabbitMQ at %s takes %d more connections (%s), too few for %d agents (one connection each) and the bridge: "+
			"raise its open-file limit first (`make services` restarts a broker it started without systemd with up to 65536; "+
			"under systemd, Debian's unit sets LimitNOFILE=65536), or use fewer hosts", u.Host, limit-used, from, n)
	}
	return nil
}

// brokerSockets returns how many sockets the local RabbitMQ takes and how
// many it uses, and where that was read: `rabbitmqctl status` knows (it
// needs the Erlang cookie: root or the rabbitmq user); else the soft
// open-file limit of its Erlang VM (/proc/PID/limits is readable by all),
// of which RabbitMQ 3 gives sockets about 90% of what is left after 100.
func brokerSockets(ctx context.Context) (limit, used int, from string) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(cctx, "rabbitmqctl", "status", "--formatter", "json").Output(); err == nil {
		var st struct {
			FD struct {
				SocketsLimit int `json:"sockets_limit"`
				SocketsUsed  int `json:"sockets_used"`
				TotalLimit   int `json:"total_limit"`
				TotalUsed    int `json:"total_used"`
			} `json:"file_descriptors"`
		}
		if json.Unmarshal(out, &st) == nil {
			if st.FD.SocketsLimit > 0 {
				return st.FD.SocketsLimit, st.FD.SocketsUsed, "rabbitmqctl status: file_descriptors.sockets_limit"
			}
			if st.FD.TotalLimit > 0 { // RabbitMQ 4: no separate socket limit
				return st.FD.TotalLimit, st.FD.TotalUsed, "rabbitmqctl status: file_descriptors.total_limit"
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.HasSuffix(args[0], "/beam.smp") || !strings.Contains(string(b), "\x00rabbit\x00") {
			continue
		}
		lim, err := os.ReadFile(filepath.Join(filepath.Dir(p), "limits"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(lim), "\n") {
			var soft int
			if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
				if _, err := fmt.Sscan(rest, &soft); err == nil {
					return max((soft-100)*9/10, 1), 0, fmt.Sprintf("open-file limit %d of beam.smp pid %s", soft, filepath.Base(filepath.Dir(p)))
				}
			}
		}
	}
	return 0, 0, ""
}

func perHost(runs, latN, burst, hosts int) int {
	need := max(hosts/10, 1) + runs*(latN+burst)
	return min((need+hosts-1)/hosts+1, 15)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func pct(v []time.Duration, p int) time.Duration {
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	i := (len(v)*p + 99) / 100
	return v[min(max(i-1, 0), len(v)-1)]
}

func (h *harness) database(ctx context.Context) error {
	url, drop, err := benchkit.ScratchDB(ctx, benchkit.AdminURL(), "e2e_")
	if err != nil {
		return err
	}
	h.dbURL = url
	h.cleanups = append(h.cleanups, drop)
	h.pool, err = benchkit.TracedPool(ctx, h.dbURL, appHarness, 8, &h.harnessSQL)
	if err != nil {
		return err
	}
	h.cleanups = append(h.cleanups, h.pool.Close)
	_, err = store.Migrate(ctx, h.pool, nil)
	return err
}

// parallel runs fn for 0..n-1 on k goroutines and returns the first error.
func parallel(n, k int, fn func(i int) error) error {
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// placementFleet creates what Nova's libvirt driver would for each host:
// the compute node's root provider and two T4 children with VGPU inventory
// and their type's trait (T4-1Q, T4-2Q).
func (h *harness) placementFleet(ctx context.Context) error {
	url := env("VGPU_TEST_PLACEMENT_URL", "http://127.0.0.1:8778")
	c, err := placement.NewClient(ctx, placement.ClientConfig{Endpoint: url, Token: "admin"})
	if err != nil {
		return err
	}
	h.sc = c.ServiceClient()
	for _, tr := range []string{trait, traitB} {
		if err := traits.Create(ctx, h.sc, tr).ExtractErr(); err != nil {
			return fmt.Errorf("placement at %s: %w (start it with `make services`)", url, err)
		}
	}
	for i := range h.nHosts {
		name := fmt.Sprintf("bench-%s-h%03d", h.id, i)
		h.hosts = append(h.hosts, &host{name: name, node: name + ".nodes.test", root: uuid.NewString(), gpu: uuid.NewString(), gpuB: uuid.NewString()})
	}
	h.cleanups = append(h.cleanups, func() {
		// About 8 Placement calls per host, 8 at a time.
		cctx, cancel := context.WithTimeout(context.Background(), max(2*time.Minute, time.Duration(len(h.hosts))*300*time.Millisecond))
		defer cancel()
		t0 := time.Now()
		h.mu.Lock()
		claimed := h.claimed
		h.mu.Unlock()
		parallel(len(claimed), 8, func(i int) error { //nolint:errcheck
			allocations.Delete(cctx, h.sc, claimed[i]).ExtractErr() //nolint:errcheck
			return nil
		})
		var left atomic.Int64
		parallel(len(h.hosts), 8, func(i int) error { //nolint:errcheck
			for _, rp := range []string{h.hosts[i].gpu, h.hosts[i].gpuB, h.hosts[i].root} { // the root last
				err := resourceproviders.Delete(cctx, h.sc, rp).ExtractErr()
				if err != nil && !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
					left.Add(1)
				}
			}
			return nil
		})
		if n := left.Load(); n > 0 {
			fmt.Fprintf(os.Stderr, "bench e2e: %d Placement providers not deleted (names bench-%s-h*)\n", n, h.id)
		} else {
			fmt.Fprintf(os.Stderr, "  cleanup: %d consumers' allocations and %d providers deleted in %s\n", len(claimed), 3*len(h.hosts), time.Since(t0).Round(time.Millisecond))
		}
	})
	return parallel(len(h.hosts), 8, func(i int) error {
		hs := h.hosts[i]
		if _, err := resourceproviders.Create(ctx, h.sc, resourceproviders.CreateOpts{Name: hs.node, UUID: hs.root}).Extract(); err != nil {
			return fmt.Errorf("root provider: %w", err)
		}
		if _, err := resourceproviders.UpdateInventories(ctx, h.sc, hs.root, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
			"VCPU":      {Total: 256, MinUnit: 1, MaxUnit: 256, StepSize: 1, AllocationRatio: 1},
			"MEMORY_MB": {Total: 1 << 20, MinUnit: 1, MaxUnit: 1 << 20, StepSize: 1, AllocationRatio: 1},
		}}).Extract(); err != nil {
			return fmt.Errorf("root inventory: %w", err)
		}
		for _, g := range []struct {
			uuid, pci, trait string
			total            int
		}{{hs.gpu, gpuPCI, trait, 16}, {hs.gpuB, gpuPCIB, traitB, totalB}} {
			name := hs.node + "_pci_" + strings.NewReplacer(":", "_", ".", "_").Replace(g.pci)
			if _, err := resourceproviders.Create(ctx, h.sc, resourceproviders.CreateOpts{Name: name, UUID: g.uuid, ParentProviderUUID: hs.root}).Extract(); err != nil {
				return fmt.Errorf("GPU provider: %w", err)
			}
			r, err := resourceproviders.UpdateInventories(ctx, h.sc, g.uuid, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
				"VGPU": {Total: g.total, MinUnit: 1, MaxUnit: g.total, StepSize: 1, AllocationRatio: 1},
			}}).Extract()
			if err != nil {
				return fmt.Errorf("GPU inventory: %w", err)
			}
			if _, err = resourceproviders.UpdateTraits(ctx, h.sc, g.uuid, resourceproviders.UpdateTraitsOpts{ResourceProviderGeneration: r.ResourceProviderGeneration,
				Traits: []string{g.trait}}).Extract(); err != nil {
				return fmt.Errorf("GPU traits: %w", err)
			}
		}
		return nil
	})
}

// instances records the instances the bridge knows (as Nova's
// notifications would have) and builds each host's fake host with them as
// running domains.
func (h *harness) instances(ctx context.Context) error {
	n := h.perHost
	dir, err := os.MkdirTemp("", "vgpu-bench-e2e-")
	if err != nil {
		return err
	}
	h.cleanups = append(h.cleanups, func() { os.RemoveAll(dir) })
	project, user := strings.ReplaceAll(uuid.NewString(), "-", ""), strings.ReplaceAll(uuid.NewString(), "-", "")
	// Four at a time: a fake host is a few hundred files.
	if err := parallel(len(h.hosts), 4, func(hi int) error {
		hs := h.hosts[hi]
		spec := fakehost.DefaultSpec()
		spec.Host = hs.name
		spec.VFIOGPUs = nil
		spec.MdevGPUs = spec.MdevGPUs[:2]
		spec.MdevGPUs[0].Addr = pci.MustParse(gpuPCI)
		spec.MdevGPUs[1].Addr = pci.MustParse(gpuPCIB)
		for g := range spec.MdevGPUs {
			spec.MdevGPUs[g].Mdevs = nil
		}
		if h.vfExtra(hi) > 0 {
			vfSpec(&spec)
		}
		spec.Domains = nil
		for j := range n + h.vfExtra(hi) {
			id := uuid.NewString()
			hs.instances = append(hs.instances, id)
			spec.Domains = append(spec.Domains, fakehost.Domain{Name: fmt.Sprintf("instance-%08x", hi*100+j+1), UUID: id, Running: true})
		}
		if _, err := h.pool.Exec(ctx, `INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, power_state)
			SELECT u::uuid, $2, $3, $4, $5, 'active', 'running' FROM unnest($1::text[]) AS u`, hs.instances, project, user, hs.name, hs.node); err != nil {
			return err
		}
		hs.dir = filepath.Join(dir, hs.name)
		_, err := fakehost.Build(hs.dir, spec)
		return err
	}); err != nil {
		return err
	}
	return h.novaCreated(ctx, project, user)
}

// novaCreated does what Nova did when it created the instances: each has
// its allocation on its host (VCPU, MEMORY_MB; the consumer a claim adds
// its vGPU to) and an instance.create.end in the bridge's inbox, which the
// pipeline takes before the runs begin (the bridge reads a consumer's
// allocations when Nova says they changed).
func (h *harness) novaCreated(ctx context.Context, project, user string) error {
	type inst struct{ id, host, node, root string }
	var all []inst
	for _, hs := range h.hosts {
		for _, id := range hs.instances {
			all = append(all, inst{id, hs.name, hs.node, hs.root})
		}
	}
	h.mu.Lock()
	for _, in := range all {
		h.claimed = append(h.claimed, in.id)
	}
	h.mu.Unlock()
	if err := parallel(len(all), 8, func(i int) error {
		return allocations.Update(ctx, h.sc, all[i].id, allocations.UpdateOpts{Allocations: map[string]allocations.ProviderAllocationsOpts{
			all[i].root: {Resources: map[string]int{"VCPU": 1, "MEMORY_MB": 512}}}, ProjectID: project, UserID: user, ConsumerType: "INSTANCE"}).ExtractErr()
	}); err != nil {
		return fmt.Errorf("instances' allocations: %w", err)
	}
	ids, msgs, payloads := make([]string, len(all)), make([]string, len(all)), make([]string, len(all))
	for i, in := range all {
		p, err := json.Marshal(map[string]any{"nova_object.name": "InstanceActionPayload", "nova_object.namespace": "nova", "nova_object.version": "1.8",
			"nova_object.data": map[string]any{"uuid": in.id, "tenant_id": project, "user_id": user, "host": in.host, "node": in.node,
				"state": "active", "power_state": "running", "display_name": "bench", "host_name": "bench",
				"flavor": map[string]any{"nova_object.name": "FlavorPayload", "nova_object.namespace": "nova", "nova_object.version": "1.4",
					"nova_object.data": map[string]any{"flavorid": "bench", "name": "bench", "vcpus": 1, "memory_mb": 512, "extra_specs": map[string]string{}}}}})
		if err != nil {
			return err
		}
		ids[i], msgs[i], payloads[i] = in.id, uuid.NewString(), string(p)
	}
	_, err := h.pool.Exec(ctx, `INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload)
		SELECT 'nova', m, 'instance.create.end', u::uuid, now(), p::jsonb FROM unnest($1::text[], $2::text[], $3::text[]) AS x(u, m, p)`,
		ids, msgs, payloads)
	return err
}

// analyze gathers the planner's statistics of the set-up's database once
// its instances, hosts and providers are in, as autovacuum does a minute
// after such a bulk load in any deployment. A Postgres run with
// autovacuum off (a developer's or CI's) would otherwise never have any:
// the planner takes the project's 300 instances for one row and scans
// vgpu_attachments once per instance in each quota read, which no
// deployment sees. It returns the server's autovacuum setting.
func (h *harness) analyze(ctx context.Context) (string, error) {
	var av string
	if err := h.pool.QueryRow(ctx, `SELECT current_setting('autovacuum')`).Scan(&av); err != nil {
		return "", err
	}
	if _, err := h.pool.Exec(ctx, `ANALYZE`); err != nil {
		return "", fmt.Errorf("analyze: %w", err)
	}
	return av, nil
}

// inboxDrained waits until the pipeline has taken every inbox event (the
// instances' instance.create.end).
func (h *harness) inboxDrained(ctx context.Context) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var n int
		if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE processed_at IS NULL`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d Nova notifications still unprocessed after 5 minutes", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// bridge starts the bridge's parts in this process: placement service
// (first full sync), pipeline, dispatcher and the webhook endpoint.
func (h *harness) bridge(ctx context.Context) (func(), error) {
	dir, err := os.MkdirTemp("", "vgpu-bench-e2e-policy-")
	if err != nil {
		return nil, err
	}
	h.cleanups = append(h.cleanups, func() { os.RemoveAll(dir) })
	if h.keys, err = testkeys.New(dir); err != nil {
		return nil, err
	}
	// Every host is enrolled before the dispatcher reads the agents' keys,
	// as an operator does before starting agents: a report under a key the
	// dispatcher lacks while more hosts are being enrolled (it re-reads the
	// file at most once a second) would be dropped, and the agent report
	// again only report_interval (a minute) later.
	for _, hs := range h.hosts {
		if _, err := h.keys.Enrol(hs.name); err != nil {
			return nil, err
		}
	}
	rules := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(rules, []byte(benchPolicy), 0o644); err != nil {
		return nil, err
	}
	holder, err := policy.NewHolder(policy.Config{RulesFile: rules, ProfilesFile: filepath.Join(repoRoot(), "etc", "vgpu-bridge", "profiles.yaml")}, nil)
	if err != nil {
		return nil, err
	}
	// The bridge's pools, as store.Open makes them, with the statement
	// counter installed and their backends named for the CPU count.
	if h.bpool, err = benchkit.TracedPool(ctx, h.dbURL, appBridge, 24, &h.bridgeSQL); err != nil {
		return nil, err
	}
	h.cleanups = append(h.cleanups, h.bpool.Close)
	svc, err := placement.New(ctx, placement.Config{Client: placement.ClientConfig{Endpoint: env("VGPU_TEST_PLACEMENT_URL", "http://127.0.0.1:8778"), Token: "admin"},
		SyncConcurrency: 8, Replica: "bench", OwnedGPUs: h.ownedVF()}, h.bpool, holder.Catalog(), h.log)
	if err != nil {
		return nil, err
	}
	h.svc = svc
	if _, err := svc.SyncNow(ctx, true, nil); err != nil && !errors.Is(err, placement.ErrSyncBusy) {
		return nil, fmt.Errorf("placement sync: %w", err)
	}
	pipePool, err := benchkit.TracedPool(ctx, h.dbURL, appBridge, 12, &h.bridgeSQL)
	if err != nil {
		return nil, err
	}
	h.cleanups = append(h.cleanups, pipePool.Close)
	var disp *dispatch.Dispatcher
	proc, err := pipeline.New(pipeline.Config{Replica: "bench", Workers: 8},
		pipeline.Deps{Pool: pipePool, Requests: requests.NewStore(pipePool, "vgpu-bridge/bench"), Policy: holder,
			Placement: pipeline.ServiceAdapter{S: svc}, Catalog: holder.Catalog(), Log: h.log, OnOutbox: func() { disp.Kick() }})
	if err != nil {
		return nil, err
	}
	directPath := direct.Wire(proc) // results, failures and deadlines of the direct path
	h.results, h.reports = "vgpu-bench-"+h.id+".results", "vgpu-bench-"+h.id+".reports"
	// The queues go last, after the bridge and the agents have stopped
	// (cleanups run in reverse): the dispatcher's, and each host's, which
	// the agent or the relay declares.
	h.cleanups = append(h.cleanups, func() {
		qs := []string{h.results, h.reports}
		for _, hs := range h.hosts {
			qs = append(qs, protocol.AgentQueue(hs.name))
		}
		t0 := time.Now()
		if left := deleteQueues(h.amqpURL, qs); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "bench e2e: %d of %d queues not deleted, e.g. %s (rabbitmqctl delete_queue NAME)\n", len(left), len(qs), left[0])
		} else {
			fmt.Fprintf(os.Stderr, "  cleanup: %d queues deleted in %s\n", len(qs), time.Since(t0).Round(time.Millisecond))
		}
	})
	ring, err := h.keys.Keyring()
	if err != nil {
		return nil, err
	}
	dc := dispatch.Config{URLs: []string{h.amqpURL}, ResultsQueue: h.results, ReportsQueue: h.reports, Replica: "bench",
		Signer: h.keys.Signer(), Keyring: ring, KeyringFile: h.keys.AgentKeysFile(), RequireSigned: true}
	for _, hs := range h.hosts {
		dc.ResultsBindings = append(dc.ResultsBindings, protocol.ResultRoutingKey(hs.name))
		dc.ReportsBindings = append(dc.ReportsBindings, protocol.ReportRoutingKey(hs.name))
	}
	// The queues and their bindings (two per host) before any agent
	// starts, as the dispatcher declares them: an agent's first report
	// must not go out while its binding is still to come (it would send it
	// again only after a backoff).
	if err := declare(h.amqpURL, dc); err != nil {
		return nil, err
	}
	// The reports feed the catalog the pipeline places with, as in the
	// bridge: a report must never rename T4-1Q's trait mid-run.
	disp, err = dispatch.New(dc, dispatch.Deps{Pool: pipePool, Requests: requests.NewStore(pipePool, "vgpu-bridge/bench"), Results: resultHook{proc, h.landed},
		Phase: flow.PhaseOf, Catalog: holder.Catalog(), Log: h.log})
	if err != nil {
		return nil, err
	}
	h.rs = requests.NewStore(h.bpool, "bench")
	ep, err := webhook.New(webhook.Config{
		Sources: []webhook.Source{{Name: "bench", Auth: webhook.AuthHMAC, Secrets: [][]byte{secret}, Rate: 1e6, Burst: 1e6, MaxBodyBytes: 65536}},
		Store:   h.rs, Pool: h.bpool, Logger: h.log,
		OnCommitted: proc.Wake, // as bridge.Run wires it
	})
	if err != nil {
		return nil, err
	}
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Logger: h.log})
	ep.Register(srv)
	srv.Handle(http.MethodPost, "/bare", api.Custom, func(c echo.Context) error {
		io.Copy(io.Discard, c.Request().Body) //nolint:errcheck
		return c.JSONBlob(http.StatusAccepted, []byte(`{"request_id":"00000000-0000-0000-0000-000000000000","status_url":"/x","skipped":[]}`))
	})
	if err := srv.Start(); err != nil {
		return nil, err
	}
	h.url = "http://" + srv.Addr()
	h.hc = &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}

	rctx, rcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{proc.Run, directPath.Run, disp.Run, func(ctx context.Context) error { ep.Run(ctx); return nil }} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(rctx); err != nil && rctx.Err() == nil {
				fmt.Fprintln(os.Stderr, "bench e2e: bridge part stopped:", err)
			}
		}()
	}
	return func() {
		srv.Shutdown() //nolint:errcheck
		rcancel()
		wg.Wait()
	}, nil
}

// deleteQueues deletes the queues on 4 connections and returns those it
// could not. A failed delete closes its channel (and a broker short of
// sockets may reset the connection): each is tried 3 times, on a new
// channel, or connection, as needed. A queue that is not there counts as
// deleted.
func deleteQueues(amqpURL string, queues []string) []string {
	const conns = 4
	var mu sync.Mutex
	var left []string
	var wg sync.WaitGroup
	for k := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var conn *amqp.Connection
			var ch *amqp.Channel
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			for i := k; i < len(queues); i += conns {
				var err error
				for try := range 3 {
					if try > 0 {
						time.Sleep(time.Duration(try) * 500 * time.Millisecond)
					}
					if conn == nil || conn.IsClosed() {
						if conn, err = amqp.Dial(amqpURL); err != nil {
							conn = nil
							continue
						}
						ch = nil
					}
					if ch == nil || ch.IsClosed() {
						if ch, err = conn.Channel(); err != nil {
							ch = nil
							continue
						}
					}
					if _, err = ch.QueueDelete(queues[i], false, false, false); err == nil {
						break
					}
				}
				if err != nil {
					mu.Lock()
					left = append(left, queues[i])
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return left
}

// declare declares the exchange, and the dispatcher's queues with their
// bindings, as the dispatcher does.
func declare(amqpURL string, dc dispatch.Config) error {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return dispatch.Declare(ch, dc)
}

// agents starts one vgpu-agent per host, on its fake host, and waits for
// every host's first report. They start in a window: at most
// agentWindow started and not yet reported. Started all at once, 1,000
// agents share the CPU until none has finished starting, and their
// connections' handshakes and heartbeats time out meanwhile.
func (h *harness) agents(ctx context.Context) error {
	const agentWindow = 16
	actx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	h.cleanups = append(h.cleanups, func() { cancel(); wg.Wait() })
	errc := make(chan error, 1)
	// The agents run in a process of their own (this program again, with
	// -agents-child), so that the CPU of the bridge, of the agents and of
	// Postgres are counted apart; on a real cloud each agent has a host.
	self, err := os.Executable()
	if err != nil {
		cancel()
		return err
	}
	cmd := exec.CommandContext(actx, self, "-agents-child", fmt.Sprintf("-v=%t", h.log.Enabled(context.Background(), slog.LevelInfo)))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		cancel()
		return err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return fmt.Errorf("start the agents' process: %w", err)
	}
	h.agentsPID = cmd.Process.Pid
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := cmd.Wait(); err != nil && actx.Err() == nil {
			errc <- fmt.Errorf("the agents' process ended: %w", err)
		}
	}()
	// Closing stdin stops the agents; cancel (after a grace) kills them.
	h.cleanups = append(h.cleanups, func() {
		in.Close()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cancel()
		}
	})
	enc := json.NewEncoder(in)
	start := func(hs *host) error {
		sec, err := h.keys.Enrol(hs.name) // done in bridge: the host's options
		if err != nil {
			return err
		}
		return enc.Encode(childAgent{Dir: hs.dir, Overrides: append([]string{"DEFAULT.host=" + hs.name, "DEFAULT.node=" + hs.node,
			"DEFAULT.transport_url=" + h.transportURL, "DEFAULT.state_path=" + filepath.Join(hs.dir, "state"), "DEFAULT.listen=127.0.0.1:0",
			"DEFAULT.reconnect_max_backoff=2s", "DEFAULT.shutdown_timeout=5s"}, append(h.agentOpts, sec...)...)})
	}
	within := max(2*time.Minute, time.Duration(len(h.hosts))*250*time.Millisecond)
	deadline := time.Now().Add(within)
	started := 0
	for {
		var n int
		if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM hosts WHERE report IS NOT NULL`).Scan(&n); err != nil {
			return err
		}
		if n >= len(h.hosts) {
			return nil
		}
		for ; started < len(h.hosts) && started-n < agentWindow; started++ {
			if err := start(h.hosts[started]); err != nil {
				return err
			}
		}
		select {
		case err := <-errc:
			return err
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d agents reported within %s (%d started)", n, len(h.hosts), within, started)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// instance returns the next instance without a vGPU, round robin over
// the hosts.
func (h *harness) instance() (string, error) {
	i := int(h.next.Add(1) - 1)
	hs := h.hosts[i%len(h.hosts)]
	j := i / len(h.hosts)
	if j >= min(len(hs.instances), h.perHost) { // (the VF case's are apart)
		return "", errors.New("out of instances; raise perHost")
	}
	return hs.instances[j], nil
}

// post sends one signed GPU_REQUEST and returns the request id.
func (h *harness) post(ctx context.Context, instance string) (uuid.UUID, error) {
	id, err := h.send(ctx, []byte(`{"type":"GPU_REQUEST","vm_id":"`+instance+`","workload":"inference","vgpu_profile":"`+profile+`","count":1}`))
	if err != nil {
		return uuid.Nil, err
	}
	h.mu.Lock()
	h.claimed = append(h.claimed, instance)
	h.mu.Unlock()
	return id, nil
}

// send posts one signed webhook body and returns the request id.
func (h *harness) send(ctx context.Context, body []byte) (uuid.UUID, error) {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.url+"/v1/webhooks/bench", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(m.Sum(nil)))
	req.Header.Set("Idempotency-Key", fmt.Sprintf("e2e-%s-%d", h.id, h.seq.Add(1)))
	resp, err := h.hc.Do(req)
	if err != nil {
		return uuid.Nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		return uuid.Nil, fmt.Errorf("webhook answered %d: %s", resp.StatusCode, b)
	}
	var ans struct {
		RequestID uuid.UUID `json:"request_id"`
	}
	if err := json.Unmarshal(b, &ans); err != nil {
		return uuid.Nil, err
	}
	return ans.RequestID, nil
}

// waitAll waits until every request is final; it fails on any that did
// not succeed, and returns each one's finished_at. For one request (the
// next one of a sequence goes out once it is done) it looks each time the
// pipeline has applied an agent's result, and every 20 ms besides; for
// more, every 50 ms at the requests still pending. The figures come from
// the rows' timestamps, not from when it sees them.
func (h *harness) waitAll(ctx context.Context, ids []uuid.UUID, within time.Duration) (map[uuid.UUID]time.Time, error) {
	deadline := time.Now().Add(within)
	// One request: an applied result wakes the wait (h.landed), and the
	// time taken is the request's finished_at, not when the wait saw it;
	// the poll is only for a request that ends without a result. Each
	// look costs this process (counted as the bridge's) a query.
	every := 250 * time.Millisecond
	if len(ids) > 1 {
		every = 50 * time.Millisecond
	}
	done := map[uuid.UUID]time.Time{}
	pending := ids
	for {
		rows, err := h.pool.Query(ctx, `SELECT id, state, coalesce(reason,''), finished_at FROM requests WHERE id = ANY($1)`, pending)
		if err != nil {
			return nil, err
		}
		var failed []string
		for rows.Next() {
			var id uuid.UUID
			var st, reason string
			var fin *time.Time
			if err := rows.Scan(&id, &st, &reason, &fin); err != nil {
				rows.Close()
				return nil, err
			}
			switch requests.State(st) {
			case requests.Succeeded:
				done[id] = *fin
			case requests.Failed, requests.Rejected:
				failed = append(failed, fmt.Sprintf("%s %s: %s", id, st, reason))
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if len(failed) > 0 {
			return nil, fmt.Errorf("%d request(s) did not succeed, e.g. %s", len(failed), failed[0])
		}
		if len(done) == len(ids) {
			return done, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d requests succeeded within %s", len(done), len(ids), within)
		}
		pending = pending[:0:0]
		for _, id := range ids {
			if _, ok := done[id]; !ok {
				pending = append(pending, id)
			}
		}
		if len(ids) == 1 {
			select {
			case <-h.landed:
			case <-time.After(every):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		}
		time.Sleep(every)
	}
}

// latency sends n requests one at a time and returns webhook POST →
// request finished (all agent commands answered) for each, and the
// instances that got their vGPU.
func (h *harness) latency(ctx context.Context, n int) ([]time.Duration, []string, error) {
	var out []time.Duration
	var insts []string
	for range n {
		inst, err := h.instance()
		if err != nil {
			return nil, nil, err
		}
		t0 := time.Now()
		id, err := h.post(ctx, inst)
		if err != nil {
			return nil, nil, err
		}
		fin, err := h.waitAll(ctx, []uuid.UUID{id}, time.Minute)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, fin[id].Sub(t0))
		insts = append(insts, inst)
	}
	return out, insts, nil
}

// change moves each instance's T4-1Q to a T4-2Q (GPU_RESIZE), one at a
// time, and returns webhook POST → request finished for each: the old
// vGPU detached and its mdev removed, the new one claimed on the host's
// other T4, created and attached, the old claim released.
func (h *harness) change(ctx context.Context, insts []string) ([]time.Duration, error) {
	var out []time.Duration
	var ids []uuid.UUID
	for _, inst := range insts {
		t0 := time.Now()
		id, err := h.send(ctx, []byte(`{"type":"GPU_RESIZE","vm_id":"`+inst+`","workload":"inference","vgpu_profile":"`+profileB+`"}`))
		if err != nil {
			return nil, fmt.Errorf("profile change: %w", err)
		}
		fin, err := h.waitAll(ctx, []uuid.UUID{id}, time.Minute)
		if err != nil {
			return nil, fmt.Errorf("profile change: %w", err)
		}
		out = append(out, fin[id].Sub(t0))
		ids = append(ids, id)
	}
	h.breakdown(ctx, "profile changes", ids)
	return out, nil
}

// burst sends n requests with h.clients clients and returns completed
// requests per second, first POST to last finished_at.
func (h *harness) burst(ctx context.Context, n int) (float64, error) {
	insts := make([]string, n)
	for i := range insts {
		var err error
		if insts[i], err = h.instance(); err != nil {
			return 0, err
		}
	}
	ids := make([]uuid.UUID, n)
	var mu sync.Mutex
	t0 := time.Now()
	err := parallel(n, h.clients, func(i int) error {
		id, err := h.post(ctx, insts[i])
		mu.Lock()
		ids[i] = id
		mu.Unlock()
		return err
	})
	if err != nil {
		return 0, err
	}
	fin, err := h.waitAll(ctx, ids, max(3*time.Minute, time.Duration(n)*200*time.Millisecond))
	if err != nil {
		return 0, err
	}
	h.breakdown(ctx, "", ids)
	var last time.Time
	for _, t := range fin {
		if t.After(last) {
			last = t
		}
	}
	return float64(n) / last.Sub(t0).Seconds(), nil
}

// breakdown prints where the requests' time went (medians, from the
// rows' timestamps): from the webhook's transaction to the decision
// (inbox poll, policy, Placement claim; decisions.created_at is taken when
// the decision is written), then for each action command, in order, from
// the previous step to the relay's publish (for the first command this
// includes the decision's commit) and on to the agent's answer. what, when
// set, names the requests in the line.
func (h *harness) breakdown(ctx context.Context, what string, ids []uuid.UUID) {
	var decide *float64
	if err := h.pool.QueryRow(ctx, `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM d.created_at - r.created_at)) * 1000
		FROM requests r JOIN decisions d ON d.request_id = r.id WHERE r.id = ANY($1)`, ids).Scan(&decide); err != nil || decide == nil {
		return
	}
	rows, err := h.pool.Query(ctx, `WITH c AS (
			SELECT c.seq, c.kind, c.sent_at - coalesce(lag(c.finished_at) OVER w, d.created_at) AS relay, c.finished_at - c.sent_at AS agent
			FROM commands c JOIN decisions d ON d.request_id = c.request_id
			WHERE c.request_id = ANY($1) AND c.purpose = 'action'
			WINDOW w AS (PARTITION BY c.request_id ORDER BY c.seq))
		SELECT seq, min(kind), percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM relay)) * 1000,
			percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM agent)) * 1000
		FROM c GROUP BY seq ORDER BY seq`, ids)
	if err != nil {
		return
	}
	defer rows.Close()
	line := fmt.Sprintf("to decision %.0f", *decide)
	for rows.Next() {
		var seq int
		var kind string
		var relay, agent *float64
		if rows.Scan(&seq, &kind, &relay, &agent) != nil || relay == nil || agent == nil {
			return
		}
		line += fmt.Sprintf(" | relay %s %.0f | agent %s %.0f", kind, *relay, kind, *agent)
	}
	if what != "" {
		what = ", " + what
	}
	fmt.Fprintf(os.Stderr, "  where the time went%s (medians, ms): %s\n", what, line)
}

// brokerRTT measures n sequential round trips through RabbitMQ: a
// persistent, confirmed publish to a queue, a consumer that answers on a
// second queue, the answer received.
func (h *harness) brokerRTT(ctx context.Context, n int) (time.Duration, error) {
	conn, err := amqp.Dial(h.amqpURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	pub, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	if err := pub.Confirm(false); err != nil {
		return 0, err
	}
	srv, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	if err := srv.Confirm(false); err != nil {
		return 0, err
	}
	qa, qb := "vgpu-bench-"+h.id+".rtt-a", "vgpu-bench-"+h.id+".rtt-b"
	for _, q := range []string{qa, qb} {
		if _, err := pub.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return 0, err
		}
		defer pub.QueueDelete(q, false, false, false) //nolint:errcheck
	}
	in, err := srv.Consume(qa, "", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	back, err := pub.Consume(qb, "", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	go func() {
		for d := range in {
			dc, err := srv.PublishWithDeferredConfirmWithContext(ctx, "", qb, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: d.Body})
			if err == nil {
				dc.WaitContext(ctx) //nolint:errcheck
			}
			d.Ack(false) //nolint:errcheck
		}
	}()
	var lat []time.Duration
	for range n {
		t0 := time.Now()
		dc, err := pub.PublishWithDeferredConfirmWithContext(ctx, "", qa, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(`{"v":1}`)})
		if err != nil {
			return 0, err
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return 0, fmt.Errorf("broker did not confirm: %v", err)
		}
		select {
		case d := <-back:
			d.Ack(false) //nolint:errcheck
		case <-time.After(10 * time.Second):
			return 0, errors.New("no answer through the broker within 10s")
		}
		lat = append(lat, time.Since(t0))
	}
	return pct(lat, 50), nil
}

// placementClaim measures n sequential claims of one VGPU unit for a new
// consumer (PUT /allocations/{consumer}, what the direct path's claim
// writes at the least), at most one per host's GPU held at a time, each
// deleted again after those. It returns the claims' p50 and Placement's
// CPU (uwsgi and its Postgres) per claim, over the claims alone, and how
// long the claims took in all.
func (h *harness) placementClaim(ctx context.Context, n int) (time.Duration, time.Duration, time.Duration, error) {
	var lat []time.Duration
	var cons []string
	var cpu, wall time.Duration
	cpu0, t0 := placementCPU(), time.Now()
	release := func() error {
		cpu += placementCPU() - cpu0
		wall += time.Since(t0)
		for _, c := range cons {
			if err := allocations.Delete(ctx, h.sc, c).ExtractErr(); err != nil {
				return err
			}
		}
		cons = cons[:0]
		cpu0, t0 = placementCPU(), time.Now()
		return nil
	}
	for i := range n {
		if len(cons) == len(h.hosts) {
			if err := release(); err != nil {
				return 0, 0, 0, err
			}
		}
		c := uuid.NewString()
		gpu := h.hosts[i%len(h.hosts)].gpu
		h.mu.Lock()
		h.claimed = append(h.claimed, c)
		h.mu.Unlock()
		t0 := time.Now()
		err := allocations.Update(ctx, h.sc, c, allocations.UpdateOpts{Allocations: map[string]allocations.ProviderAllocationsOpts{gpu: {Resources: map[string]int{"VGPU": 1}}},
			ProjectID: "bench", UserID: "bench", ConsumerType: "INSTANCE"}).ExtractErr()
		if err != nil {
			return 0, 0, 0, fmt.Errorf("placement claim: %w", err)
		}
		lat = append(lat, time.Since(t0))
		cons = append(cons, c)
	}
	if err := release(); err != nil {
		return 0, 0, 0, err
	}
	return pct(lat, 50), cpu / time.Duration(max(n, 1)), wall, nil
}

// placementBurst measures Placement alone with n concurrent claims: n new
// consumers' PUT /allocations of one VGPU unit, spread over the hosts'
// second GPUs, all sent at once; it returns completed/s, and deletes them.
func (h *harness) placementBurst(ctx context.Context, n int) (float64, error) {
	cons := make([]string, n)
	for i := range cons {
		cons[i] = uuid.NewString()
	}
	h.mu.Lock()
	h.claimed = append(h.claimed, cons...)
	h.mu.Unlock()
	t0 := time.Now()
	err := parallel(n, n, func(i int) error {
		gpu := h.hosts[i%len(h.hosts)].gpuB
		return allocations.Update(ctx, h.sc, cons[i], allocations.UpdateOpts{Allocations: map[string]allocations.ProviderAllocationsOpts{gpu: {Resources: map[string]int{"VGPU": 1}}},
			ProjectID: "bench", UserID: "bench", ConsumerType: "INSTANCE"}).ExtractErr()
	})
	rate := float64(n) / time.Since(t0).Seconds()
	if err != nil {
		return 0, fmt.Errorf("placement burst: %w", err)
	}
	return rate, parallel(n, 8, func(i int) error { return allocations.Delete(ctx, h.sc, cons[i]).ExtractErr() })
}

// startProfile starts the CPU profile of the first throughput phase
// (-cpuprofile).
func (h *harness) startProfile() {
	if h.cpuProfile == "" || h.profiling {
		return
	}
	f, err := os.Create(h.cpuProfile)
	if err == nil && pprof.StartCPUProfile(f) == nil {
		h.profiling = true
	}
}

// latencyProfile starts the CPU profile of -latency-cpuprofile, once,
// and returns what stops it; it does nothing while another profile runs.
func (h *harness) latencyProfile() (stop func()) {
	if h.latProfile == "" || h.profiling {
		return func() {}
	}
	path := h.latProfile
	h.latProfile = ""
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "  -latency-cpuprofile: %v\n", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		fmt.Fprintf(os.Stderr, "  -latency-cpuprofile: %v\n", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

func (h *harness) stopProfile() {
	if h.profiling {
		pprof.StopCPUProfile()
		h.cpuProfile = "" // one phase
	}
}

// overbooked counts the GPUs whose usage in Placement is over their total.
func (h *harness) overbooked(ctx context.Context) (int, error) {
	var n atomic.Int64
	err := parallel(len(h.hosts), 8, func(i int) error {
		for _, g := range []struct {
			uuid  string
			total int
		}{{h.hosts[i].gpu, 16}, {h.hosts[i].gpuB, totalB}} {
			u, err := resourceproviders.GetUsages(ctx, h.sc, g.uuid).Extract()
			if err != nil {
				return fmt.Errorf("usages of %s: %w", g.uuid, err)
			}
			if u.Usages["VGPU"] > g.total {
				n.Add(1)
			}
		}
		return nil
	})
	return int(n.Load()), err
}

// agentAttach is the median time from the relay's publish of attach_vgpu
// to the agent's answer, over the requests of insts' last attach.
func (h *harness) agentAttach(ctx context.Context, insts []string) time.Duration {
	var med *float64
	if err := h.pool.QueryRow(ctx, `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM c.finished_at - c.sent_at))
		FROM commands c WHERE c.kind = 'attach_vgpu' AND c.purpose = 'action' AND c.instance_uuid::text = ANY($1)`, insts).Scan(&med); err != nil || med == nil {
		return 0
	}
	return time.Duration(*med * float64(time.Second))
}

// childAgent is one agent the agents' process runs: its options and its
// fake host.
type childAgent struct {
	Dir       string   `json:"dir"`
	Overrides []string `json:"overrides"`
}

// agentsChild is the agents' process: it starts an agent for each line of
// stdin and stops them all when stdin ends.
func agentsChild(verbose bool) error {
	log := slog.New(slog.DiscardHandler)
	if verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	signal.Ignore(os.Interrupt) // the harness stops us (stdin ends) once it has cleaned up
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	dec := json.NewDecoder(os.Stdin)
	for {
		var a childAgent
		if err := dec.Decode(&a); err != nil {
			if !errors.Is(err, io.EOF) {
				return fmt.Errorf("agents: read: %w", err)
			}
			break
		}
		v, err := agent.LoadConfig(conf.Source{Overrides: a.Overrides})
		if err != nil {
			return fmt.Errorf("agent config: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := agent.RunWith(ctx, v, log, agent.RunOptions{FakeHostDir: a.Dir}); err != nil && ctx.Err() == nil {
				select {
				case errc <- fmt.Errorf("agent in %s: %w", a.Dir, err):
				default:
				}
			}
		}()
		select {
		case err := <-errc:
			return err
		default:
		}
	}
	cancel()
	wg.Wait()
	return nil
}

// burstCPU is CPU time per request: this process (the bridge, and the
// harness's webhook clients and polls), the agents' process, the Postgres
// backends of the bridge's connections (not those of the harness's own),
// and Placement (its uwsgi processes and their Postgres backends).
type burstCPU struct{ bridge, agents, postgres, placement time.Duration }

func (h *harness) sampleCPU(ctx context.Context) burstCPU {
	return burstCPU{bridge: benchkit.ProcessCPU(), agents: benchkit.PidCPU(h.agentsPID), postgres: benchkit.AppBackendCPU(ctx, h.pool, appBridge),
		placement: placementCPU()}
}

// placementCPU is the CPU time Placement's uwsgi processes and their
// Postgres backends used so far.
func placementCPU() time.Duration {
	return benchkit.ProcsCPU(func(cl string) bool {
		return strings.Contains(cl, "127.0.0.1:8778") || strings.HasPrefix(cl, "postgres: ") && strings.Contains(cl, " placement placement ")
	})
}

func (c burstCPU) since(c0 burstCPU, n int) burstCPU {
	return c.scaled(c0, 1, float64(max(n, 1)))
}

// scaled is (c − c0) × mul / div.
func (c burstCPU) scaled(c0 burstCPU, mul, div float64) burstCPU {
	f := func(a, b time.Duration) time.Duration { return time.Duration(float64(a-b) * mul / div) }
	return burstCPU{bridge: f(c.bridge, c0.bridge), agents: f(c.agents, c0.agents), postgres: f(c.postgres, c0.postgres), placement: f(c.placement, c0.placement)}
}

// bound is the rate this machine's cores allow at c's CPU per request,
// where every part's CPU is spent on the same cores.
func (c burstCPU) bound() string {
	total := c.bridge + c.agents + c.postgres + c.placement
	if total <= 0 {
		return "no CPU counted"
	}
	return fmt.Sprintf("in all %.1f ms, so %d cores allow at most %.1f/s (Placement's share alone %.1f/s)",
		ms(total), runtime.NumCPU(), float64(runtime.NumCPU())*float64(time.Second)/float64(total),
		float64(runtime.NumCPU())*float64(time.Second)/float64(max(c.placement, time.Microsecond)))
}

// attachCost is what the latency phase's attaches cost each: the SQL the
// bridge's pools sent and the CPU (burstCPU), and the part of it the
// bridge's background (its pollers, the agents' periodic reports) would
// cost over the phase's length with nothing to do, measured just before.
type attachCost struct {
	n            int
	wall         time.Duration
	sql, idleSQL sqlPer
	cpu, idleCPU burstCPU
}

// sqlPer is SQL per attach (benchkit.SQLCounts).
type sqlPer struct{ stmts, ctl, txs, prepares, pings float64 }

// perAttach is c × mul / n.
func perAttach(c benchkit.SQLCounts, mul float64, n int) sqlPer {
	f := func(v int64) float64 { return float64(v) * mul / float64(max(n, 1)) }
	return sqlPer{stmts: f(c.Statements), ctl: f(c.Control), txs: f(c.Transactions), prepares: f(c.Prepares), pings: f(c.Pings)}
}

func (p sqlPer) String() string {
	return fmt.Sprintf("%.1f statements (+%.1f BEGIN/COMMIT/ROLLBACK), %.1f transactions, %.1f preparations, %.1f pings", p.stmts, p.ctl, p.txs, p.prepares, p.pings)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// medD is the median of get over runs.
func medD[T any](runs []T, get func(T) time.Duration) time.Duration {
	return time.Duration(benchkit.Median(runs, func(r T) float64 { return float64(get(r)) }))
}

func (c burstCPU) String() string {
	return fmt.Sprintf("bridge %.1f ms, agents %.1f ms, its Postgres %.1f ms, Placement %.1f ms", ms(c.bridge), ms(c.agents), ms(c.postgres), ms(c.placement))
}

// bare is the closed-loop rate of a handler on the same server stack
// that answers 202 at once.
func (h *harness) bare(ctx context.Context, d time.Duration) float64 {
	var n atomic.Int64
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range h.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.url+"/bare", strings.NewReader(`{"type":"GPU_REQUEST"}`))
				req.Header.Set("Content-Type", "application/json")
				resp, err := h.hc.Do(req)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					continue // counted as not answered; the phase is bounded by d
				}
				io.Copy(io.Discard, resp.Body) //nolint:errcheck
				resp.Body.Close()
				if resp.StatusCode == http.StatusAccepted {
					n.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / d.Seconds()
}
