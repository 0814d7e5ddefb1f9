// Package ingest_test runs the Nova notification consumer against the real
// RabbitMQ and Postgres: corpus samples published raw, oslo.messaging's own
// Notifier, a consumer killed mid-burst and a broker connection cut
// mid-burst through a TCP proxy the test controls.
package ingest_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// rig is one test's private topology: a unique exchange and queue on the
// shared broker, and a fresh migrated database.
type rig struct {
	t        *testing.T
	amqpURL  string
	exchange string
	queue    string
	pool     *pgxpool.Pool
	pub      *amqp.Channel
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{t: t, amqpURL: testsvc.RabbitURL(t), exchange: testsvc.Name("nova-test"), queue: testsvc.Name("vgpu-bridge-test")}
	r.pool = testsvc.Pool(t, testsvc.MigratedPostgres(t))
	conn, err := amqp.Dial(r.amqpURL)
	testsvc.Must(t, err, "dial broker")
	ch, err := conn.Channel()
	testsvc.Must(t, err, "channel")
	testsvc.Must(t, ch.Confirm(false), "confirm mode")
	r.pub = ch
	t.Cleanup(func() {
		if c, err := conn.Channel(); err == nil {
			c.QueueDelete(r.queue, false, false, false) //nolint:errcheck
			c.ExchangeDelete(r.exchange, false, false)  //nolint:errcheck
		}
		conn.Close()
	})
	return r
}

func (r *rig) config(url string) ingest.Config {
	cfg := ingest.DefaultConfig()
	cfg.URLs = []string{url}
	cfg.Exchange, cfg.Queue = r.exchange, r.queue
	cfg.ReconnectMin, cfg.ReconnectMax = 50*time.Millisecond, 500*time.Millisecond
	cfg.SilenceWarning = 0
	return cfg
}

// declare lets a consumer create the topology once, so messages published
// before it runs are routed to its queue.
func (r *rig) declare(cfg ingest.Config) {
	r.t.Helper()
	c, err := ingest.New(cfg, r.pool, nil, nil)
	testsvc.Must(r.t, err, "new consumer")
	testsvc.Must(r.t, c.CheckTopology(context.Background()), "declare topology")
}

// publish sends bodies persistently with publisher confirms.
func (r *rig) publish(key string, bodies ...[]byte) {
	r.t.Helper()
	ctx := context.Background()
	var confs []*amqp.DeferredConfirmation
	for _, b := range bodies {
		dc, err := r.pub.PublishWithDeferredConfirmWithContext(ctx, r.exchange, key, false, false, amqp.Publishing{
			ContentType: "application/json", ContentEncoding: "utf-8", DeliveryMode: amqp.Persistent, Body: b,
		})
		testsvc.Must(r.t, err, "publish")
		confs = append(confs, dc)
		if len(confs) >= 500 {
			r.waitConfirms(confs)
			confs = confs[:0]
		}
	}
	r.waitConfirms(confs)
}

func (r *rig) waitConfirms(confs []*amqp.DeferredConfirmation) {
	for _, dc := range confs {
		if ok, err := dc.WaitContext(context.Background()); err != nil || !ok {
			r.t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

// running is a consumer running in the background.
type running struct {
	c      *ingest.Consumer
	cancel context.CancelFunc
	done   chan error
	reg    *prometheus.Registry
	once   sync.Once
}

func (r *rig) start(cfg ingest.Config) *running {
	r.t.Helper()
	reg := prometheus.NewRegistry()
	c, err := ingest.New(cfg, r.pool, reg, testLogger(r.t))
	testsvc.Must(r.t, err, "new consumer")
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{c: c, cancel: cancel, done: make(chan error, 1), reg: reg}
	go func() { run.done <- c.Run(ctx) }()
	r.t.Cleanup(run.stop)
	return run
}

func (run *running) stop() {
	run.once.Do(func() {
		run.cancel()
		select {
		case <-run.done:
		case <-time.After(30 * time.Second):
			panic("consumer did not stop within 30s")
		}
	})
}

func (run *running) metric(name string) float64 {
	mfs, err := run.reg.Gather()
	if err != nil {
		panic(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

func (r *rig) count(q string, args ...any) int {
	r.t.Helper()
	var n int
	testsvc.Must(r.t, r.pool.QueryRow(context.Background(), q, args...).Scan(&n), q)
	return n
}

// waitCount waits until the query counts want rows.
func (r *rig) waitCount(want int, timeout time.Duration, q string, args ...any) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	n := -1
	for time.Now().Before(deadline) {
		if n = r.count(q, args...); n >= want {
			if n > want {
				r.t.Fatalf("%s: %d rows, want %d", q, n, want)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatalf("%s: %d rows after %v, want %d", q, n, timeout, want)
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("VGPU_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// samples loads the nova package's copy of Nova's notification samples.
func samples(t *testing.T) []novatest.Sample {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	s, err := novatest.Samples(filepath.Join(root, novatest.SamplesDir))
	testsvc.Must(t, err, "load samples")
	return s
}

// proxy is a TCP proxy the test controls: Cut closes every connection
// through it (the listener stays up, so clients can reconnect).
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cuts   int
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	testsvc.Must(t, err, "proxy listen")
	p := &proxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.Cut() })
	return p
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		go func() { io.Copy(u, c); u.Close(); c.Close() }() //nolint:errcheck
		go func() { io.Copy(c, u); u.Close(); c.Close() }() //nolint:errcheck
	}
}

// Cut drops every connection through the proxy, like a network failure.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) //nolint:errcheck // RST, not FIN
		}
		c.Close()
	}
	p.conns = nil
	p.cuts++
}

// proxiedURL rewrites an amqp URL's host to the proxy.
func proxiedURL(amqpURL, addr string) string {
	u, err := amqp.ParseURI(amqpURL)
	if err != nil {
		panic(err)
	}
	h, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf("amqp://%s:%s@%s:%s/%s", u.Username, u.Password, h, port, trimSlash(u.Vhost))
}

func trimSlash(v string) string {
	if v == "/" {
		return ""
	}
	return v
}

// appliedLog makes a table the OnApplied hook writes to in the batch
// transaction, so a test can prove each event had its effect exactly once.
func (r *rig) appliedLog() func(ctx context.Context, tx pgx.Tx, ev ingest.Event) error {
	_, err := r.pool.Exec(context.Background(), `CREATE TABLE applied_log (message_id text NOT NULL)`)
	testsvc.Must(r.t, err, "create applied_log")
	return func(ctx context.Context, tx pgx.Tx, ev ingest.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied_log VALUES ($1)`, ev.Message.MessageID)
		return err
	}
}
