// Command ingest is the load harness of the Nova notification consumer
// (`make bench`). It publishes real-shaped persistent notifications (Nova's
// samples in oslo's 2.0 envelope, with message_id, timestamp, _unique_id and
// _context_*, over 1,000 instances), then measures in one run:
//
//	(a) baseline: a bare amqp091 consumer that only acks (multiple=true per
//	    batch), no decoding, no database;
//	(b) the bridge: consume → decode → dedupe → commit → ack, in a child
//	    process so that its peak RSS is the consumer's alone.
//
// It prints both rates, their ratio and the bridge's peak RSS (medians over
// -runs), against the targets ≥ 5,000/s, ratio ≥ 0.5, RSS ≤ 100 MB, and the
// CPU time per message of the bridge and of its Postgres backends, which
// move far less than the rates with the load of a shared machine.
//
// BENCH_DEBUG=1 also prints the time the child spent in batch commits;
// BENCH_CPUPROFILE=FILE writes the child's CPU profile.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
	"github.com/vgpu-bridge/vgpu-bridge/tests/bench/benchkit"
)

var (
	flagN        = flag.Int("n", 50000, "notifications per measurement")
	flagRuns     = flag.Int("runs", 1, "measurements of each kind; medians are printed")
	flagRabbit   = flag.String("rabbit", envOr("VGPU_TEST_RABBIT_URL", "amqp://guest:guest@127.0.0.1:5672/"), "AMQP URL")
	flagPostgres = flag.String("postgres", envOr("VGPU_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "Postgres admin URL (a scratch database is created on it)")
	flagSamples  = flag.String("samples", "", "notification samples folder (default: nova/testdata/notification_samples of this module)")
	flagBatch    = flag.Int("batch", 0, "bridge batch size (0: the default)")
	flagPrefetch = flag.Int("prefetch", 0, "bridge and baseline prefetch (0: the bridge's default)")
	flagCommit   = flag.Int("committers", 0, "bridge concurrent committers (0: the default)")

	// child mode: run the bridge's consumer only.
	flagChild    = flag.Bool("child", false, "internal: run the bridge consumer")
	flagDB       = flag.String("db", "", "internal: database URL")
	flagExchange = flag.String("exchange", "", "internal")
	flagQueue    = flag.String("queue", "", "internal")
)

const (
	targetRate  = 5000.0
	targetRatio = 0.5
	targetRSSMB = 100.0
	routingKey  = "versioned_notifications.info"
)

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func main() {
	flag.Parse()
	var err error
	if *flagChild {
		err = child()
	} else {
		err = parent()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench ingest:", err)
		os.Exit(1)
	}
}

// childResult is what the child prints.
type childResult struct {
	Seconds float64 `json:"seconds"`
	Applied int     `json:"applied"`
	// PGCPU is the CPU time of the Postgres backends that served the
	// child (read from /proc: Postgres runs on this machine).
	PGCPU float64 `json:"pg_cpu_seconds"`
}

func child() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := store.Open(ctx, store.Config{URL: *flagDB, MaxConns: 4})
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := ingest.DefaultConfig()
	cfg.URLs = []string{*flagRabbit}
	cfg.Exchange, cfg.Queue = *flagExchange, *flagQueue
	cfg.SilenceWarning = 0
	if *flagBatch > 0 {
		cfg.BatchSize = *flagBatch
	}
	if *flagPrefetch > 0 {
		cfg.Prefetch = *flagPrefetch
	}
	if *flagCommit > 0 {
		cfg.Committers = *flagCommit
	}
	reg := prometheus.NewRegistry()
	c, err := ingest.New(cfg, pool, reg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return err
	}
	if f := os.Getenv("BENCH_CPUPROFILE"); f != "" {
		out, err := os.Create(f)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(out); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(cctx) }()
	for {
		n := counter(reg, "vgpu_bridge_notifications_applied_total", "vgpu_bridge_notifications_duplicates_total")
		if int(n) >= *flagN {
			el := time.Since(start)
			cancel()
			<-done
			if os.Getenv("BENCH_DEBUG") != "" {
				fmt.Fprintf(os.Stderr, "child: %.2fs total, %.2fs in batch commits\n", el.Seconds(), histSum(reg, "vgpu_bridge_notifications_batch_commit_seconds"))
			}
			return json.NewEncoder(os.Stdout).Encode(childResult{Seconds: el.Seconds(), Applied: int(n), PGCPU: benchkit.BackendCPU(ctx, pool).Seconds()})
		}
		select {
		case err := <-done:
			return fmt.Errorf("consumer stopped: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// counter sums the counters names, gathered once (the child's CPU time
// counts this polling).
func counter(reg *prometheus.Registry, names ...string) float64 {
	mfs, _ := reg.Gather()
	s := 0.0
	for _, mf := range mfs {
		for _, name := range names {
			if mf.GetName() == name {
				for _, m := range mf.GetMetric() {
					s += m.GetCounter().GetValue()
				}
			}
		}
	}
	return s
}

func histSum(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleSum()
		}
	}
	return 0
}

type run struct {
	baseline, bridge float64 // messages/s
	rssMB            float64
	cpuUS, pgUS      float64 // CPU per message of the bridge and of its Postgres backends
}

func parent() error {
	ctx := context.Background()
	dir := *flagSamples
	if dir == "" {
		_, file, _, _ := runtime.Caller(0)
		dir = filepath.Join(filepath.Dir(file), "..", "..", "..", novatest.SamplesDir)
	}
	samples, err := novatest.Samples(dir)
	if err != nil {
		return err
	}
	conn, err := amqp.Dial(*flagRabbit)
	if err != nil {
		return fmt.Errorf("RabbitMQ: %w (start it with `make services`)", err)
	}
	defer conn.Close()

	var runs []run
	for r := 0; r < *flagRuns; r++ {
		var res run
		suffix := fmt.Sprintf("%08x", rand.Uint32())
		// (a) baseline.
		ex, q := "bench-nova-"+suffix, "bench-raw-"+suffix
		if err := declareRaw(conn, ex, q); err != nil {
			return err
		}
		pubSecs, err := publish(conn, ex, samples, *flagN, "a"+suffix)
		if err != nil {
			return err
		}
		fmt.Printf("published %d persistent notifications in %.1fs (%.0f/s)\n", *flagN, pubSecs, float64(*flagN)/pubSecs)
		secs, err := consumeRaw(conn, q, *flagN)
		if err != nil {
			return err
		}
		res.baseline = float64(*flagN) / secs
		cleanup(conn, ex, q)

		// (b) the bridge, in a child process.
		db, drop, err := scratchDB(ctx)
		if err != nil {
			return err
		}
		ex, q = "bench-nova-b"+suffix, "bench-bridge-"+suffix
		if err := declareBridge(ctx, db, ex, q); err != nil {
			drop()
			return err
		}
		if _, err := publish(conn, ex, samples, *flagN, "b"+suffix); err != nil {
			drop()
			return err
		}
		cr, rss, cpu, err := runChild(db, ex, q)
		cleanup(conn, ex, q)
		drop()
		if err != nil {
			return err
		}
		res.bridge = float64(cr.Applied) / cr.Seconds
		res.rssMB = rss
		res.cpuUS, res.pgUS = cpu.Seconds()*1e6/float64(cr.Applied), cr.PGCPU*1e6/float64(cr.Applied)
		fmt.Printf("run %d: baseline %.0f/s, bridge %.0f/s, ratio %.2f, bridge peak RSS %.1f MB, CPU per message %.0f us in the bridge, %.0f us in its Postgres backends\n",
			r+1, res.baseline, res.bridge, res.bridge/res.baseline, res.rssMB, res.cpuUS, res.pgUS)
		runs = append(runs, res)
	}
	med := func(f func(run) float64) float64 { return benchkit.Median(runs, f) }
	base, br, rss := med(func(r run) float64 { return r.baseline }), med(func(r run) float64 { return r.bridge }), med(func(r run) float64 { return r.rssMB })
	ratio := br / base
	mark := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "BELOW TARGET"
	}
	fmt.Printf("\nNova notifications, %d per run, median of %d run(s):\n", *flagN, len(runs))
	fmt.Printf("  (a) raw amqp091 consume+ack      %8.0f msg/s\n", base)
	fmt.Printf("  (b) bridge durable (commit+ack)  %8.0f msg/s   target >= %.0f   %s\n", br, targetRate, mark(br >= targetRate))
	fmt.Printf("  ratio (b)/(a)                    %8.2f         target >= %.2f   %s\n", ratio, targetRatio, mark(ratio >= targetRatio))
	fmt.Printf("  bridge peak RSS                  %8.1f MB      target <= %.0f    %s\n", rss, targetRSSMB, mark(rss <= targetRSSMB))
	fmt.Printf("  CPU per message: %.0f us in the bridge, %.0f us in its Postgres backends (steadier than msg/s on a shared machine)\n",
		med(func(r run) float64 { return r.cpuUS }), med(func(r run) float64 { return r.pgUS }))
	return nil
}

// uuids are the instances the messages are spread over.
var uuids = func() []string {
	out := make([]string, 1000)
	for i := range out {
		out[i] = fmt.Sprintf("%08x-8f85-4257-88b6-%012x", i, i)
	}
	return out
}()

// publish sends n persistent notifications with publisher confirms,
// cycling through the samples; each gets its own message_id, timestamp and
// instance uuid.
func publish(conn *amqp.Connection, exchange string, samples []novatest.Sample, n int, idPrefix string) (float64, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	ctx := context.Background()
	start := time.Now()
	base := time.Now().UTC()
	var pending []*amqp.DeferredConfirmation
	for i := 0; i < n; i++ {
		s := samples[i%len(samples)]
		js := strings.ReplaceAll(string(s.JSON), "178b0921-8f85-4257-88b6-2e743b5a975c", uuids[i%len(uuids)])
		body := novatest.Sample{Name: s.Name, JSON: []byte(js)}.Wire(fmt.Sprintf("%s-%07d", idPrefix, i), base.Add(time.Duration(i)*time.Microsecond))
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, routingKey, false, false, amqp.Publishing{
			ContentType: "application/json", ContentEncoding: "utf-8", DeliveryMode: amqp.Persistent, Priority: 0, Body: body,
		})
		if err != nil {
			return 0, err
		}
		pending = append(pending, dc)
		if len(pending) == 2000 {
			if err := waitAll(ctx, pending); err != nil {
				return 0, err
			}
			pending = pending[:0]
		}
	}
	if err := waitAll(ctx, pending); err != nil {
		return 0, err
	}
	return time.Since(start).Seconds(), nil
}

func waitAll(ctx context.Context, dcs []*amqp.DeferredConfirmation) error {
	for _, dc := range dcs {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("publish nacked")
		}
	}
	return nil
}

func declareRaw(conn *amqp.Connection, ex, q string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(ex, "topic", false, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		return err
	}
	return ch.QueueBind(q, routingKey, ex, false, nil)
}

// consumeRaw is the baseline: consume and ack (multiple, every batch), no
// processing.
func consumeRaw(conn *amqp.Connection, q string, n int) (float64, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	d := ingest.DefaultConfig()
	prefetch := d.Prefetch
	if *flagPrefetch > 0 {
		prefetch = *flagPrefetch
	}
	batch := d.BatchSize
	if *flagBatch > 0 {
		batch = *flagBatch
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return 0, err
	}
	start := time.Now()
	msgs, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	for i := 1; i <= n; i++ {
		m, ok := <-msgs
		if !ok {
			return 0, fmt.Errorf("baseline consumer closed")
		}
		if i%batch == 0 || i == n {
			if err := m.Ack(true); err != nil {
				return 0, err
			}
		}
	}
	return time.Since(start).Seconds(), nil
}

func cleanup(conn *amqp.Connection, ex, q string) {
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	ch.QueueDelete(q, false, false, false) //nolint:errcheck
	ch.ExchangeDelete(ex, false, false)    //nolint:errcheck
}

func scratchDB(ctx context.Context) (string, func(), error) {
	u, pool, drop, err := benchkit.MigratedDB(ctx, *flagPostgres, "", 0)
	if err != nil {
		return "", nil, err
	}
	// The harness opens pools of its own on u: close this one, keep the database.
	pool.Close()
	return u, drop, nil
}

// declareBridge creates the bridge's topology before publishing, as a
// running bridge would have.
func declareBridge(ctx context.Context, db, ex, q string) error {
	pool, err := store.Open(ctx, store.Config{URL: db})
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := ingest.DefaultConfig()
	cfg.URLs = []string{*flagRabbit}
	cfg.Exchange, cfg.Queue = ex, q
	c, err := ingest.New(cfg, pool, nil, nil)
	if err != nil {
		return err
	}
	return c.CheckTopology(ctx)
}

func runChild(db, ex, q string) (childResult, float64, time.Duration, error) {
	self, err := os.Executable()
	if err != nil {
		return childResult{}, 0, 0, err
	}
	args := []string{"-child", "-db", db, "-exchange", ex, "-queue", q, "-rabbit", *flagRabbit, "-n", fmt.Sprint(*flagN)}
	if *flagBatch > 0 {
		args = append(args, "-batch", fmt.Sprint(*flagBatch))
	}
	if *flagPrefetch > 0 {
		args = append(args, "-prefetch", fmt.Sprint(*flagPrefetch))
	}
	if *flagCommit > 0 {
		args = append(args, "-committers", fmt.Sprint(*flagCommit))
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return childResult{}, 0, 0, fmt.Errorf("bridge child: %w", err)
	}
	var cr childResult
	if err := json.Unmarshal(out, &cr); err != nil {
		return cr, 0, 0, fmt.Errorf("bridge child output %q: %w", out, err)
	}
	rss, cpu := 0.0, time.Duration(0)
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rss = float64(ru.Maxrss) / 1024 // kilobytes on Linux
		cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return cr, rss, cpu, nil
}
