// Command rss measures the resident memory of the vgpu-bridge binary with
// a fleet of 10,000 hosts × 8 GPUs mirrored (make bench; target ≤ 100 MB),
// beside a baseline measured in the same run: the same binary with the
// same configuration on an empty mirror.
//
// The fleet is written straight into a scratch database, through the
// placement mirror's own Store.Put in batches of 500, as a full sync
// writes it: for each host the compute node's root provider (VCPU,
// MEMORY_MB and DISK_GB inventory, Nova's libvirt traits, an aggregate)
// and one child provider per GPU, named as Nova names them
// (<node>_pci_0000_3b_00_0), with VGPU inventory and one type trait. Half
// the hosts hold T4s, a quarter A16s, a quarter L4s; each GPU serves one
// of its model's Q profiles (T4: nvidia-230/231/232, the seed catalog's
// type ids; the A16 and L4 ids are illustrative, they depend on the
// driver). Two GPUs in three are in use, each used unit one instance's
// allocation, so the mirror holds the allocations and usages a sync of
// such a fleet would (-idle: none). The placement_sync_state row records
// a finished full sync. Each host also has its hosts row, as its agent's
// reports leave it: the compute service host ↔ node mapping and the last
// report (its GPUs, the one type each offers, its active vGPUs with their
// load), which the bridge reads into the index (the types agents report)
// at start and every sync interval. Loading 80,000 GPU providers through
// the real Placement and syncing them would take tens of minutes, and
// nothing of Placement is measured here; the bridge never calls it.
//
// The bridge replica that holds the mirror's advisory sync lock runs the
// Placement sync, and a full sync would remove what Placement does not
// list. So this program takes the lock on each scratch database (the
// mirror's own Store.Lock) before it starts the bridge and holds it to
// the end: the bridge is a follower replica, which loads the mirror into
// its index at start and then follows the mirror's notifications, as a
// second replica does in production; it is ready (/readyz) once the
// mirror holds a full sync.
//
// Each of -runs rounds starts a fresh bridge process on the empty
// database, then one on the fleet's (the empty one first, so that a bridge
// that does not start fails the run before the fleet is written); for
// each it waits until /readyz answers 200, lets it settle (-settle, 30 s:
// the Go runtime hands the memory of the mirror's load back to the OS over
// tens of seconds), samples VmRSS from /proc/PID/status -samples times a
// second apart and reads VmHWM (the peak resident set, which includes the
// load of the mirror at start) and the Go heap's figures from /metrics (in
// use, idle and not yet returned to the OS, the next GC's goal). Then,
// after the samples (the answer, 80,000 GPUs, is large), it checks through
// GET /v1/gpus that the index really holds every GPU written, on every
// host, with its usage and named by its compute service host (none for the
// empty mirror), and stops the process; a mismatch fails the run. It
// prints each round and the medians over the rounds: the fleet's RSS (the
// median of its samples) and peak, the empty mirror's, the difference per
// GPU, the ratio, and the target. MB are 10^6 bytes.
//
// With -heapprofile FILE it then loads the fleet's mirror in this process
// the way the bridge's placement service does as a follower (the same
// code: placement.Service.Run), prints the Go heap that stays in use, and
// writes its heap profile, to see what the figure is made of (the bridge
// serves no pprof).
//
// The bridge runs as configured by default, with the test services: the
// local Postgres (VGPU_TEST_POSTGRES_URL), RabbitMQ (VGPU_TEST_RABBIT_URL;
// a virtual host of its own, made with rabbitmqctl or
// VGPU_TEST_RABBITMQCTL, so that no other test's messages reach it; when
// that fails, the shared one, with a notifications exchange and queues of
// this run) and the Placement endpoint (VGPU_TEST_PLACEMENT_URL,
// configured but not called). Everything it makes (the binary and the
// configuration in a temporary directory, the two databases, the virtual
// host or the queues, the processes) is removed at the end, also on error
// or Ctrl-C. About 6 minutes on a 2-core machine: 40 s to write the fleet,
// then each process's settling.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/placement/mirror"
	"github.com/vgpu-bridge/vgpu-bridge/tests/bench/benchkit"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
)

const (
	targetMB  = 100.0
	batchSize = 500 // providers per mirror write, as the sync's default
	replica   = "vgpu-bench-rss"
)

func main() {
	hosts := flag.Int("hosts", 10000, "compute hosts mirrored")
	gpus := flag.Int("gpus", 8, "GPUs per host (at most 8)")
	runs := flag.Int("runs", 3, "rounds, each a fresh process on the fleet and one on the empty mirror (medians are printed)")
	settle := flag.Duration("settle", 30*time.Second, "wait after /readyz answers 200 before sampling (the Go runtime returns the memory of the mirror's load to the OS over tens of seconds)")
	samples := flag.Int("samples", 10, "VmRSS samples per process, a second apart (their median is its figure)")
	idle := flag.Bool("idle", false, "mirror an idle fleet: no allocations, no active vGPUs in the reports")
	heapProfile := flag.String("heapprofile", "", "after the runs, load the fleet's mirror in this process as the bridge's placement service does (a follower replica) and write its heap profile to this file")
	verbose := flag.Bool("v", false, "log the harness's steps to stderr")
	timeout := flag.Duration("timeout", 20*time.Minute, "give up after this long (what the run made is removed)")
	flag.Parse()
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if *gpus < 1 || *gpus > len(pciSlots) || *hosts < 1 || *runs < 1 || *samples < 1 {
		fmt.Fprintf(os.Stderr, "bench rss: -hosts and -runs and -samples must be ≥ 1, -gpus within 1..%d\n", len(pciSlots))
		os.Exit(2)
	}
	// Ctrl-C or a timeout's SIGTERM ends the run; what it made is removed.
	sctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(sctx, *timeout)
	defer cancel()
	h := &harness{log: log, hosts: *hosts, gpus: *gpus, settle: *settle, samples: *samples, idle: *idle, heapProfile: *heapProfile}
	err := h.run(ctx, *runs)
	h.cleanup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench rss:", err)
		os.Exit(1)
	}
}

type harness struct {
	log                *slog.Logger
	hosts, gpus        int
	settle             time.Duration
	samples            int
	idle               bool
	heapProfile        string
	id                 string
	dir                string // temporary: binary, configuration, keys, logs
	bin                string
	token              string // the operator API's admin token
	fleetConf, nilConf string // configuration files of the two databases
	cleanups           []func()
}

func (h *harness) cleanup() {
	for i := len(h.cleanups) - 1; i >= 0; i-- {
		h.cleanups[i]()
	}
	h.cleanups = nil
}

// measurement is one bridge process's figures.
type measurement struct {
	ready       time.Duration // start → /readyz 200
	rss         float64       // MB, median of the samples
	rssLo, rssH float64       // MB, lowest and highest sample
	peak        float64       // MB, VmHWM after the samples
	heap        float64       // MB, go_memstats_heap_inuse_bytes
	idle        float64       // MB, heap idle and not yet returned to the OS
	nextGC      float64       // MB, go_memstats_next_gc_bytes
	gpus, nodes int           // in the index (GET /v1/gpus)
}

// round is one fleet process and one empty-mirror process.
type round struct{ fleet, empty measurement }

func (h *harness) run(ctx context.Context, runs int) error {
	b := make([]byte, 4)
	rand.Read(b)
	h.id = hex.EncodeToString(b)
	dir, err := os.MkdirTemp("", "vgpu-bench-rss-")
	if err != nil {
		return err
	}
	h.dir = dir
	h.cleanups = append(h.cleanups, func() { os.RemoveAll(dir) })
	t0 := time.Now()
	if err := h.build(ctx); err != nil {
		return err
	}
	h.log.Info("built vgpu-bridge", "in", time.Since(t0).Round(time.Millisecond))

	// The two databases, migrated, each with the sync lock held here from
	// the start: the bridges started on them are followers.
	fleetDB, fleetPool, err := h.database(ctx, "rss_fleet_")
	if err != nil {
		return err
	}
	emptyDB, emptyPool, err := h.database(ctx, "rss_empty_")
	if err != nil {
		return err
	}
	if err := mirror.New(emptyPool, nil, "").MarkSynced(ctx, true, 0, replica); err != nil {
		return err
	}
	transport, err := h.broker(ctx)
	if err != nil {
		return err
	}
	if err := h.configure(transport, fleetDB, emptyDB); err != nil {
		return err
	}

	var rs []round
	var f *fleet
	for i := range runs {
		var r round
		// The empty mirror first: a bridge that does not start, or whose
		// index is not what was written, fails the run before the fleet is
		// written.
		if r.empty, err = h.measure(ctx, fmt.Sprintf("empty-%d", i+1), h.nilConf, 0, 0, 0); err != nil {
			return fmt.Errorf("run %d, empty mirror: %w", i+1, err)
		}
		if f == nil {
			t0 := time.Now()
			f = buildFleet(h.hosts, h.gpus, h.idle)
			if err := f.write(ctx, fleetPool); err != nil {
				return fmt.Errorf("write the fleet: %w", err)
			}
			f.release()
			fmt.Printf("bridge RSS: %d hosts × %d GPUs mirrored (%d providers: %d GPUs, %d T4 / %d A16 / %d L4 hosts; %d vGPUs allocated; host reports %.1f MB of JSON), written in %s, against an empty mirror\n",
				h.hosts, h.gpus, f.nGPUs+h.hosts, f.nGPUs, f.models[0], f.models[1], f.models[2], f.vgpus, float64(f.reportBytes)/1e6, time.Since(t0).Round(time.Second))
		}
		if r.fleet, err = h.measure(ctx, fmt.Sprintf("fleet-%d", i+1), h.fleetConf, f.nGPUs, h.hosts, f.vgpus); err != nil {
			return fmt.Errorf("run %d, fleet: %w", i+1, err)
		}
		d := r.fleet.rss - r.empty.rss
		fmt.Printf("run %d: fleet ready in %.1f s, RSS %.1f MB (%d samples %.1f–%.1f), peak %.1f MB; Go heap: in use %.1f MB, idle not returned %.1f MB, next GC at %.1f MB; index %d GPUs on %d hosts | empty mirror ready in %.1f s, RSS %.1f MB, peak %.1f MB; Go heap in use %.1f MB | difference %.1f MB ≈ %.0f bytes per GPU\n",
			i+1, r.fleet.ready.Seconds(), r.fleet.rss, h.samples, r.fleet.rssLo, r.fleet.rssH, r.fleet.peak, r.fleet.heap, r.fleet.idle, r.fleet.nextGC,
			r.fleet.gpus, r.fleet.nodes, r.empty.ready.Seconds(), r.empty.rss, r.empty.peak, r.empty.heap, d, d*1e6/float64(f.nGPUs))
		rs = append(rs, r)
	}
	med := func(get func(round) float64) float64 { return benchkit.Median(rs, get) }
	x, y := med(func(r round) float64 { return r.fleet.rss }), med(func(r round) float64 { return r.fleet.peak })
	z, zp := med(func(r round) float64 { return r.empty.rss }), med(func(r round) float64 { return r.empty.peak })
	d := med(func(r round) float64 { return r.fleet.rss - r.empty.rss })
	mark := "ok"
	if x > targetMB {
		mark = "MISSED"
	}
	fmt.Printf("median of %d runs: bridge RSS with %d hosts × %d GPUs mirrored: median %.1f MB (peak %.1f MB); empty mirror: %.1f MB (peak %.1f MB); difference %.1f MB (≈ %.0f bytes per GPU); ratio %.2f×; target ≤ %.0f MB: %s\n",
		len(rs), h.hosts, h.gpus, x, y, z, zp, d, d*1e6/float64(f.nGPUs), x/z, targetMB, mark)
	if h.heapProfile != "" {
		return h.profile(ctx, fleetDB, f.nGPUs)
	}
	return nil
}

// profile does in this process what the bridge's placement service does
// as a follower replica: it loads the fleet's mirror into its index (the
// sync lock is held here, on another connection) and reads the hosts
// table; then it writes the heap profile of what stays in use, and prints
// how much that is.
func (h *harness) profile(ctx context.Context, db string, gpus int) error {
	pool, err := store.Open(ctx, store.Config{URL: db, MaxConns: 4})
	if err != nil {
		return err
	}
	defer pool.Close()
	cat, err := catalog.LoadFile(filepath.Join(repoRoot(), "etc", "vgpu-bridge", "profiles.yaml"))
	if err != nil {
		return err
	}
	svc, err := placement.New(ctx, placement.Config{Client: placement.ClientConfig{
		Endpoint: cmp.Or(os.Getenv("VGPU_TEST_PLACEMENT_URL"), "http://127.0.0.1:8778"), Token: "admin"}}, pool, cat, h.log)
	if err != nil {
		return err
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(cctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Minute)
	for svc.Ready(ctx) != nil {
		if time.Now().After(deadline) {
			return errors.New("in-process placement service: not ready within 5m")
		}
		if err := sleep(ctx, nil, 50*time.Millisecond); err != nil {
			return err
		}
	}
	// Ready follows the first load; the service's loop reads the hosts
	// table once more at once: let that pass too.
	if err := sleep(ctx, nil, 5*time.Second); err != nil {
		return err
	}
	if n := svc.Index().Len(); n != gpus {
		return fmt.Errorf("in-process placement service: the index holds %d GPUs, not %d", n, gpus)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	f, err := os.Create(h.heapProfile)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		return err
	}
	held := float64(after.HeapAlloc-before.HeapAlloc) / 1e6
	fmt.Printf("in-process placement service, follower, %d GPUs loaded: %.1f MB of Go heap in use after GC (%.0f bytes per GPU); heap profile in %s (go tool pprof -sample_index=inuse_space -top %s)\n",
		gpus, held, held*1e6/float64(gpus), h.heapProfile, h.heapProfile)
	return nil
}

// build compiles the bridge binary of this checkout.
func (h *harness) build(ctx context.Context) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	h.bin = filepath.Join(h.dir, "vgpu-bridge")
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", h.bin, "./cmd/vgpu-bridge")
	cmd.Dir = repoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/vgpu-bridge: %w\n%s", err, out)
	}
	return nil
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// database makes a migrated scratch database, and a pool on it kept open
// to the end, one of whose connections holds the mirror's sync lock.
func (h *harness) database(ctx context.Context, prefix string) (string, *pgxpool.Pool, error) {
	u, drop, err := benchkit.ScratchDB(ctx, benchkit.AdminURL(), prefix)
	if err != nil {
		return "", nil, err
	}
	h.cleanups = append(h.cleanups, drop)
	pool, err := store.Open(ctx, store.Config{URL: u, MaxConns: 4})
	if err != nil {
		return "", nil, err
	}
	h.cleanups = append(h.cleanups, pool.Close)
	if _, err := store.Migrate(ctx, pool, nil); err != nil {
		return "", nil, fmt.Errorf("migrate: %w", err)
	}
	release, ok, err := mirror.New(pool, nil, "").Lock(ctx)
	if err != nil {
		return "", nil, err
	}
	if !ok {
		return "", nil, errors.New("the mirror's sync lock of a new scratch database is held by another session")
	}
	h.cleanups = append(h.cleanups, release)
	return u, pool, nil
}

// broker returns the transport URL of a virtual host of this run's own on
// the test RabbitMQ (made with rabbitmqctl, deleted at the end), or, when
// rabbitmqctl fails, of the test broker's own virtual host.
func (h *harness) broker(ctx context.Context) (string, error) {
	base := cmp.Or(os.Getenv("VGPU_TEST_RABBIT_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	conn, err := amqp.DialConfig(base, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return "", fmt.Errorf("RabbitMQ at %s: %w (start it with `make services`)", base, err)
	}
	conn.Close()
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	ctl := strings.Fields(cmp.Or(os.Getenv("VGPU_TEST_RABBITMQCTL"), "rabbitmqctl"))
	rmq := func(args ...string) error {
		out, err := exec.CommandContext(ctx, ctl[0], append(ctl[1:], args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %w: %s", strings.Join(ctl, " "), strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	vhost := "vgpu-bench-rss-" + h.id
	if err := rmq("add_vhost", vhost); err != nil {
		h.log.Warn("no virtual host of its own; the bridge uses the test broker's, with queues of its own", "err", err)
		return "rabbit://" + strings.TrimPrefix(base, "amqp://"), nil
	}
	h.cleanups = append(h.cleanups, func() {
		exec.Command(ctl[0], append(ctl[1:], "delete_vhost", vhost)...).Run() //nolint:errcheck
	})
	if err := rmq("set_permissions", "-p", vhost, u.User.Username(), ".*", ".*", ".*"); err != nil {
		return "", err
	}
	u.Path, u.RawPath = "/"+vhost, ""
	u.Scheme = "rabbit"
	return u.String(), nil
}

// configure writes the bridge's configuration files, one per database:
// the shipped policy, signed commands (keys of this run), a token file for
// the operator API, and queue names of this run (removed at the end).
func (h *harness) configure(transport, fleetDB, emptyDB string) error {
	if err := os.Mkdir(filepath.Join(h.dir, "keys"), 0o700); err != nil {
		return err
	}
	keys, err := testkeys.New(filepath.Join(h.dir, "keys"))
	if err != nil {
		return err
	}
	b := make([]byte, 16)
	rand.Read(b)
	h.token = hex.EncodeToString(b)
	tokens, placementToken := filepath.Join(h.dir, "api-tokens"), filepath.Join(h.dir, "placement-token")
	if err := os.WriteFile(tokens, []byte(h.token+" admin bench\n"), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(placementToken, []byte("admin\n"), 0o600); err != nil {
		return err
	}
	etc := filepath.Join(repoRoot(), "etc", "vgpu-bridge")
	sec := map[string]string{}
	for _, s := range keys.Bridge() { // security.signing_key_file=…
		k, v, _ := strings.Cut(strings.TrimPrefix(s, "security."), "=")
		sec[k] = v
	}
	q := "vgpu-bench-rss-" + h.id
	h.cleanups = append(h.cleanups, func() { deleteQueues(transport, q+".nova", q+".notifications", q+".results", q+".reports") })
	write := func(db string) (string, error) {
		var c strings.Builder
		fmt.Fprintf(&c, "[DEFAULT]\nhost = %s\nlog_format = text\ntransport_url = %s\n\n", replica, transport)
		fmt.Fprintf(&c, "[database]\nconnection = %s\nauto_migrate = true\n\n", db)
		fmt.Fprintf(&c, "[api]\ntoken_file = %s\n\n", tokens) // listen: --set per process
		fmt.Fprintf(&c, "[notifications]\nexchange = %s.nova\nqueue = %s.notifications\n\n", q, q)
		fmt.Fprintf(&c, "[dispatch]\nresults_queue = %s.results\nreports_queue = %s.reports\n\n", q, q)
		fmt.Fprintf(&c, "[placement]\nendpoint_override = %s\ntoken_file = %s\n\n",
			cmp.Or(os.Getenv("VGPU_TEST_PLACEMENT_URL"), "http://127.0.0.1:8778"), placementToken)
		fmt.Fprintf(&c, "[policy]\nrules_file = %s\nprofiles_file = %s\ndriver_compat_file = %s\n\n",
			filepath.Join(etc, "rules.yaml"), filepath.Join(etc, "profiles.yaml"), filepath.Join(etc, "driver-compat.yaml"))
		fmt.Fprintf(&c, "[security]\nsigning_key_file = %s\nkey_id = %s\nagent_keys_file = %s\n",
			sec["signing_key_file"], sec["key_id"], sec["agent_keys_file"])
		f, err := os.CreateTemp(h.dir, "bridge-*.conf")
		if err != nil {
			return "", err
		}
		defer f.Close()
		_, err = f.WriteString(c.String())
		return f.Name(), err
	}
	if h.fleetConf, err = write(fleetDB); err != nil {
		return err
	}
	h.nilConf, err = write(emptyDB)
	return err
}

// deleteQueues removes the bridge's exchange (the first name) and queues
// of this run (on the shared virtual host; a virtual host of its own goes
// as a whole).
func deleteQueues(transport, exchange string, names ...string) {
	conn, err := amqp.DialConfig("amqp://"+strings.TrimPrefix(transport, "rabbit://"), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return
	}
	defer conn.Close()
	for i, n := range append([]string{exchange}, names...) {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		// An absent one is a channel error, hence one channel each.
		if i == 0 {
			ch.ExchangeDelete(n, false, false) //nolint:errcheck
		} else {
			ch.QueueDelete(n, false, false, false) //nolint:errcheck
		}
		ch.Close()
	}
}

// measure starts a bridge on conf, waits until it is ready, samples its
// resident set, checks that its index holds gpus GPUs on nodes hosts with
// used units in use, and stops it.
func (h *harness) measure(ctx context.Context, name, conf string, gpus, nodes, used int) (measurement, error) {
	var m measurement
	addr, err := freeAddr()
	if err != nil {
		return m, err
	}
	logPath := filepath.Join(h.dir, "bridge-"+name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return m, err
	}
	cmd := exec.Command(h.bin, "serve", "--config", conf, "--set", "api.listen="+addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The configuration file is the whole configuration: no VGPU_BRIDGE_*
	// variable of this environment overrides it.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "VGPU_BRIDGE_") })
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return m, fmt.Errorf("start vgpu-bridge: %w", err)
	}
	logf.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() //nolint:errcheck
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) //nolint:errcheck
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
			<-done
		}
	}
	h.cleanups = append(h.cleanups, stop)
	fail := func(err error) (measurement, error) {
		b, _ := os.ReadFile(logPath)
		return m, fmt.Errorf("%w\nlast lines of the bridge's log:\n%s", err, lastLines(string(b), 30))
	}

	base := "http://" + addr
	if err := waitReady(ctx, base, done, 5*time.Minute); err != nil {
		return fail(err)
	}
	m.ready = time.Since(start)
	h.log.Info("bridge ready", "run", name, "in", m.ready.Round(time.Millisecond))
	if err := sleep(ctx, done, h.settle); err != nil {
		return fail(err)
	}
	var rss []float64
	for i := range h.samples {
		if i > 0 {
			if err := sleep(ctx, done, time.Second); err != nil {
				return fail(err)
			}
		}
		st, err := procStatus(cmd.Process.Pid)
		if err != nil {
			return fail(err)
		}
		rss = append(rss, st["VmRSS"])
	}
	st, err := procStatus(cmd.Process.Pid)
	if err != nil {
		return fail(err)
	}
	m.peak = st["VmHWM"]
	m.rss = benchkit.Median(rss, func(v float64) float64 { return v })
	m.rssLo, m.rssH = slices.Min(rss), slices.Max(rss)
	ms, err := metrics(ctx, base, "go_memstats_heap_inuse_bytes", "go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes", "go_memstats_next_gc_bytes")
	if err != nil {
		return fail(err)
	}
	m.heap, m.idle, m.nextGC = ms[0]/1e6, (ms[1]-ms[2])/1e6, ms[3]/1e6

	// Only now (the answer is large): the index holds what was written.
	c := apiclient.New(apiclient.Config{URL: base, Token: h.token, Timeout: 2 * time.Minute})
	// (apiclient.GPUs reads at most 32 MiB: 80,000 GPUs are more.)
	resp, err := c.Do(ctx, apiclient.Call{Method: http.MethodGet, Path: "/v1/gpus", MaxBytes: 1 << 30})
	if err != nil {
		return fail(fmt.Errorf("GET /v1/gpus: %w", err))
	}
	var list apiclient.GPUList
	if err := json.Unmarshal(resp.Body, &list); err != nil {
		return fail(fmt.Errorf("GET /v1/gpus: %w", err))
	}
	ns, mapped, sum := map[string]bool{}, 0, 0
	for _, g := range list.GPUs {
		ns[g.Node] = true
		sum += g.Used
		if g.Host != g.Node {
			mapped++ // named by its compute service host: the hosts table is read
		}
	}
	m.gpus, m.nodes = len(list.GPUs), len(ns)
	if m.gpus != gpus || m.nodes != nodes || sum != used || mapped != gpus {
		return fail(fmt.Errorf("the index holds %d GPUs on %d hosts with %d vGPUs in use, %d named by their compute service host; %d GPUs on %d hosts with %d in use were written: the figures are void",
			m.gpus, m.nodes, sum, mapped, gpus, nodes, used))
	}
	stop()
	if st := cmd.ProcessState; st != nil && !st.Success() {
		h.log.Warn("vgpu-bridge did not stop cleanly on SIGTERM", "run", name, "state", st.String(), "log", logPath)
	}
	return m, nil
}

// waitReady polls /readyz until it answers 200.
func waitReady(ctx context.Context, base string, done <-chan struct{}, within time.Duration) error {
	deadline := time.Now().Add(within)
	hc := &http.Client{Timeout: 5 * time.Second}
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		if resp, err := hc.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, b)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("/readyz did not answer 200 within %s: %s", within, last)
		}
		if err := sleep(ctx, done, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// sleep waits d, and fails when ctx ends or the process exits first.
func sleep(ctx context.Context, done <-chan struct{}, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-done:
		return errors.New("vgpu-bridge exited")
	case <-time.After(d):
		return nil
	}
}

// procStatus reads the memory lines (kB) of /proc/PID/status, in MB.
func procStatus(pid int) (map[string]float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, fmt.Errorf("read the bridge's status: %w", err)
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(k, "Vm") {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err == nil {
			out[k] = kb * 1024 / 1e6
		}
	}
	if out["VmRSS"] == 0 || out["VmHWM"] == 0 {
		return nil, fmt.Errorf("no VmRSS or VmHWM in /proc/%d/status", pid)
	}
	return out, nil
}

// metrics reads unlabelled samples of the bridge's /metrics.
func metrics(ctx context.Context, base string, names ...string) ([]float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	out := make([]float64, len(names))
	for i, name := range names {
		found := false
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				if out[i], err = strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil {
					return nil, fmt.Errorf("GET /metrics: %s: %w", name, err)
				}
				found = true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("GET /metrics: no %s", name)
		}
	}
	return out, nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(len(l)-n, 0):], "\n")
}

// The fleet.

// pciSlots are the GPUs' addresses in a host, as an 8-GPU server has them.
var pciSlots = []string{"0000:1b:00.0", "0000:1c:00.0", "0000:3d:00.0", "0000:3e:00.0",
	"0000:88:00.0", "0000:89:00.0", "0000:b1:00.0", "0000:b2:00.0"}

type vgpuType struct {
	id, name string // nvidia-230, GRID T4-1Q
	fbMiB    int
	max      int // instances per GPU
}

// models are the hosts' GPU models: half the hosts hold T4, a quarter
// A16, a quarter L4 (the A16 and L4 type ids are illustrative).
var models = []struct {
	name  string // as NVML names it
	fbMiB int
	types []vgpuType
}{
	{"Tesla T4", 15360, []vgpuType{{"nvidia-230", "GRID T4-1Q", 1024, 16}, {"nvidia-231", "GRID T4-2Q", 2048, 8}, {"nvidia-232", "GRID T4-4Q", 4096, 4}}},
	{"NVIDIA A16", 16384, []vgpuType{{"nvidia-473", "NVIDIA A16-1Q", 1024, 16}, {"nvidia-474", "NVIDIA A16-2Q", 2048, 8}, {"nvidia-475", "NVIDIA A16-4Q", 4096, 4}}},
	{"NVIDIA L4", 23034, []vgpuType{{"nvidia-820", "NVIDIA L4-2Q", 2048, 12}, {"nvidia-821", "NVIDIA L4-4Q", 4096, 6}, {"nvidia-823", "NVIDIA L4-8Q", 8192, 3}}},
}

// rootTraits are what Nova's libvirt driver sets on a compute node.
var rootTraits = []string{
	"COMPUTE_ACCELERATORS", "COMPUTE_DEVICE_TAGGING", "COMPUTE_GRAPHICS_MODEL_BOCHS", "COMPUTE_GRAPHICS_MODEL_CIRRUS",
	"COMPUTE_GRAPHICS_MODEL_VGA", "COMPUTE_GRAPHICS_MODEL_VIRTIO", "COMPUTE_IMAGE_TYPE_AMI", "COMPUTE_IMAGE_TYPE_ISO",
	"COMPUTE_IMAGE_TYPE_QCOW2", "COMPUTE_IMAGE_TYPE_RAW", "COMPUTE_NET_ATTACH_INTERFACE", "COMPUTE_NET_ATTACH_INTERFACE_WITH_TAG",
	"COMPUTE_NET_VIF_MODEL_E1000", "COMPUTE_NET_VIF_MODEL_VIRTIO", "COMPUTE_NODE", "COMPUTE_RESCUE_BFV",
	"COMPUTE_SECURITY_UEFI_SECURE_BOOT", "COMPUTE_STORAGE_BUS_SATA", "COMPUTE_STORAGE_BUS_SCSI", "COMPUTE_STORAGE_BUS_VIRTIO",
	"COMPUTE_TRUSTED_CERTS", "COMPUTE_VOLUME_ATTACH_WITH_TAG", "COMPUTE_VOLUME_EXTEND", "COMPUTE_VOLUME_MULTI_ATTACH",
	"HW_CPU_X86_AESNI", "HW_CPU_X86_AVX", "HW_CPU_X86_AVX2", "HW_CPU_X86_AVX512F", "HW_CPU_X86_BMI2", "HW_CPU_X86_FMA3",
	"HW_CPU_X86_SSE42", "HW_CPU_HYPERTHREADING",
}

// release drops what was written (the counts stay), so that this
// process's heap holds no copy of the fleet.
func (f *fleet) release() { f.providers, f.hostNames, f.nodes, f.reports = nil, nil, nil, nil }

type fleet struct {
	providers   []engine.Provider
	hostNames   []string
	nodes       []string
	reports     []string // JSON, one per host
	nGPUs       int
	vgpus       int    // allocated units, one instance each
	models      [3]int // hosts per model
	reportBytes int
}

// buildFleet makes the providers and reports of hosts hosts with gpus
// GPUs each; the same arguments give the same fleet.
func buildFleet(hosts, gpus int, idle bool) *fleet {
	rng := mrand.New(mrand.NewPCG(1, 2))
	ids := mrand.NewChaCha8([32]byte{'r', 's', 's'})
	newUUID := func() string { return uuid.Must(uuid.NewRandomFromReader(ids)).String() }
	aggregates := make([]string, 20) // availability zones and host aggregates
	for i := range aggregates {
		aggregates[i] = newUUID()
	}
	f := &fleet{providers: make([]engine.Provider, 0, hosts*(gpus+1))}
	now := time.Now().UTC()
	for n := range hosts {
		host := fmt.Sprintf("compute-%05d", n)
		node := host + ".example.org"
		mi := [4]int{0, 0, 1, 2}[n%4] // T4, T4, A16, L4
		model := models[mi]
		f.models[mi]++
		root := newUUID()
		f.providers = append(f.providers, engine.Provider{
			UUID: root, Name: node, RootUUID: root, Generation: 2 + rng.IntN(40), Traits: rootTraits,
			Aggregates: []string{aggregates[n%len(aggregates)]},
			Inventory: map[string]engine.Inventory{
				"VCPU":      {Total: 128, MinUnit: 1, MaxUnit: 128, StepSize: 1, AllocationRatio: 4},
				"MEMORY_MB": {Total: 1031891, Reserved: 8192, MinUnit: 1, MaxUnit: 1031891, StepSize: 1, AllocationRatio: 1},
				"DISK_GB":   {Total: 3490, MinUnit: 1, MaxUnit: 3490, StepSize: 1, AllocationRatio: 1},
			},
		})
		rep := protocol.Report{V: protocol.Version, Minor: protocol.Minor, Host: host, Node: node, AgentVersion: "1.4.0",
			DriverVersion: "550.90.05", CgroupVersion: 2, Hypervisor: "KVM (QEMU 8.2.2)", SentAt: now, Seq: uint64(1000 + n),
			GPUs: []protocol.GPU{}}
		for g := range gpus {
			ty := model.types[rng.IntN(len(model.types))]
			used := 0
			if !idle && rng.IntN(3) > 0 {
				used = rng.IntN(ty.max + 1)
			}
			p := engine.Provider{
				UUID: newUUID(), Name: node + "_pci_" + strings.NewReplacer(":", "_", ".", "_").Replace(pciSlots[g]),
				Generation: 3 + 2*used, ParentUUID: root, RootUUID: root,
				Traits:    []string{"CUSTOM_" + strings.ToUpper(strings.ReplaceAll(ty.id, "-", "_"))},
				Inventory: map[string]engine.Inventory{"VGPU": {Total: ty.max, MinUnit: 1, MaxUnit: ty.max, StepSize: 1, AllocationRatio: 1}},
				Usages:    map[string]int{},
			}
			util, memUsed, memTotal, temp, power := float64(rng.IntN(100)), uint64(used*ty.fbMiB), uint64(model.fbMiB), 30+rng.IntN(40), 20+float64(rng.IntN(50))
			rg := protocol.GPU{PCI: pciSlots[g], UUID: "GPU-" + newUUID(), Name: model.name, DriverVersion: rep.DriverVersion,
				Types:  []protocol.VGPUType{{ID: ty.id, Name: ty.name, FramebufferMiB: ty.fbMiB, MaxInstances: ty.max, AvailableInstances: ty.max - used}},
				Active: []protocol.VGPU{}, Health: protocol.HealthOK, UtilPercent: &util, MemoryUsedMiB: &memUsed, MemoryTotalMiB: &memTotal,
				TemperatureC: &temp, PowerW: &power}
			for range used {
				inst := newUUID()
				if p.Allocations == nil {
					p.Allocations = map[string]map[string]int{}
				}
				p.Allocations[inst] = map[string]int{"VGPU": 1}
				p.Usages["VGPU"]++
				vu, fb := float64(rng.IntN(100)), uint64(rng.IntN(ty.fbMiB))
				rg.Active = append(rg.Active, protocol.VGPU{MdevUUID: newUUID(), TypeID: ty.id, InstanceUUID: inst, Owner: protocol.OwnerNova,
					GuestDriver: "550.90.07", UtilPercent: &vu, FBUsedMiB: &fb})
			}
			f.vgpus += used
			f.nGPUs++
			f.providers = append(f.providers, p)
			rep.GPUs = append(rep.GPUs, rg)
		}
		b, _ := json.Marshal(rep) // plain data: cannot fail
		f.hostNames, f.nodes, f.reports = append(f.hostNames, host), append(f.nodes, node), append(f.reports, string(b))
		f.reportBytes += len(b)
	}
	return f
}

// write puts the fleet into pool's mirror as a full sync does (batches of
// Store.Put, roots before their GPUs, then the sync state), and the hosts
// rows as the agents' reports leave them.
func (f *fleet) write(ctx context.Context, pool *pgxpool.Pool) error {
	st := mirror.New(pool, nil, "")
	for i := 0; i < len(f.providers); i += batchSize {
		if err := st.Put(ctx, f.providers[i:min(i+batchSize, len(f.providers))], nil); err != nil {
			return err
		}
	}
	for i := 0; i < len(f.hostNames); i += batchSize {
		j := min(i+batchSize, len(f.hostNames))
		if _, err := pool.Exec(ctx, `INSERT INTO hosts (name, node, agent_version, driver_version, last_report_at, report)
			SELECT n, d, '1.4.0', '550.90.05', now(), r::jsonb FROM unnest($1::text[], $2::text[], $3::text[]) AS t(n, d, r)`,
			f.hostNames[i:j], f.nodes[i:j], f.reports[i:j]); err != nil {
			return fmt.Errorf("hosts: %w", err)
		}
	}
	return st.MarkSynced(ctx, true, len(f.providers), replica)
}
