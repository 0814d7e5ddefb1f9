// Package bridge is the vgpu-bridge daemon: it ingests Nova notifications
// and webhooks, decides with the policy and placement engines, dispatches
// to agents and serves the operator API. Run wires the parts together.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requestid"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ui"
	"github.com/vgpu-bridge/vgpu-bridge/internal/amqpconn"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/internal/gmr"
	"github.com/vgpu-bridge/vgpu-bridge/internal/version"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// Build information (package internal/version).
var (
	Version = version.Version()
	Commit  = version.Commit()
)

// ErrSchemaBehind is returned by Run when migrations are pending and
// [database] auto_migrate is off.
var ErrSchemaBehind = errors.New("database schema is behind this binary")

// Daemon is a running bridge, for tests that embed it.
type Daemon struct {
	API  *api.Server
	Pool *pgxpool.Pool

	reload   *reloader     // secrets swapped on SIGHUP (reload.go)
	sections []gmr.Section // of the SIGUSR2 report (operations.go)
}

// wiring is what every part of the bridge is built from: made once in Run
// and handed to each setup function (conf_*.go), which adds what is its
// own.
type wiring struct {
	v       *conf.Values
	replica string
	pool    *pgxpool.Pool
	srv     *api.Server
	reg     *prometheus.Registry
	log     *slog.Logger
	rl      *reloader // secrets swapped on SIGHUP
	tu      *conf.TransportURL
	ctl     *controls.Store // operators' pause, observe-only and drains
	wake    waker
	disp    *dispatch.Dispatcher // set by setupPipeline
	reqAPI  *requests.Handler    // the request routes (setupWebhooks); setupPipeline gives it the direct path's Cancel
	nova    *computeapi.Client   // Nova's one client (nil: not configured), for the Nova path and the server listing
	lookup  *ingest.Lookup       // servers looked up in Nova on demand (nil: Nova not configured)
}

// waker wakes the pipeline when events are stored. The pipeline is built
// after the parts that store events, so its Wake is set last; until then
// Wake does nothing (the pipeline's poll is the safety net).
type waker struct{ fn atomic.Pointer[func()] }

func (w *waker) set(fn func()) { w.fn.Store(&fn) }

// Wake wakes the pipeline, if there is one yet.
func (w *waker) Wake() {
	if fn := w.fn.Load(); fn != nil {
		(*fn)()
	}
}

// component is a part with a loop of its own; Run blocks until ctx ends.
type component struct {
	name string
	run  func(ctx context.Context) error
}

// Run runs the bridge until ctx ends. started, when non-nil, is called
// once the API listens (and the schema was checked): the bridge serves.
func Run(ctx context.Context, v *conf.Values, log *slog.Logger, started func(*Daemon)) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	replica := optHost.Get(v)
	if replica == "" {
		replica, _ = os.Hostname()
	}
	log = slog.New(requestid.Handler(log.Handler())).With("replica", replica) // + global_request_id of context logs
	for _, w := range v.Warnings {
		log.Warn("configuration", "warning", w)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vgpu_bridge_build_info", Help: "Version of the running bridge."}, []string{"version", "commit"})
	buildInfo.WithLabelValues(Version, Commit).Set(1)
	reg.MustRegister(buildInfo)

	sc, err := StoreConfig(v)
	if err != nil {
		return err
	}
	pool, err := store.Open(ctx, sc)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkSchema(ctx, pool, optDBAutoMigrate.Get(v), log); err != nil {
		return err
	}

	tu, err := TransportURL(v)
	if err != nil {
		return fmt.Errorf("[DEFAULT] transport_url: %w", err)
	}
	ntu, ownNotifBroker, err := NotificationsTransportURL(v)
	if err != nil {
		return fmt.Errorf("[notifications] transport_url: %w", err)
	}
	otu, err := OutTransportURL(v, ntu)
	if err != nil {
		return fmt.Errorf("[oslo_messaging_notifications] transport_url: %w", err)
	}
	// One TLS configuration for every broker connection, built when any of
	// them uses TLS ([notifications] ssl_* files).
	brokerTLS, err := BrokerTLS(v, tu, ntu, otu)
	if err != nil {
		return err
	}

	ac, err := APIConfig(v)
	if err != nil {
		return err
	}
	ac.Logger, ac.Registry, ac.Version = log.With("component", "api"), reg, Version
	ac.ShutdownGrace = optShutdownTimeout.Get(v)
	// Keystone auth (bridge/keystoneauth) logs Keystone outages with the API's logger
	// and exports its validation metrics.
	if la, ok := ac.Auth.(interface{ SetLogger(*slog.Logger) }); ok {
		la.SetLogger(ac.Logger)
	}
	if mc, ok := ac.Auth.(interface{ Collectors() []prometheus.Collector }); ok {
		reg.MustRegister(mc.Collectors()...)
	}
	// Secrets rotation: SIGHUP swaps tokens, certificates, webhook secrets and keys.
	rl := newReloader(v, reg, log)
	rl.api(v, &ac)
	srv := api.New(ac)
	srv.AddCheck("database", func(ctx context.Context) error { return pool.Ping(ctx) })
	if ownNotifBroker {
		srv.AddCheck("notifications_broker", brokerCheck(ntu, nil))
	}

	var comps []component
	// Features register here: routes with srv, loops in comps.
	// (wiring: features)
	w := &wiring{v: v, replica: replica, pool: pool, srv: srv, reg: reg, log: log, rl: rl, tu: tu,
		ctl: controls.NewStore(pool, reg, log.With("component", "controls"))}
	if w.nova, err = novaClient(ctx, v); err != nil {
		return fmt.Errorf("nova: %w", err)
	}
	w.lookup = setupLookup(w)
	// The broker is ready when this replica's own session to it (the
	// dispatcher's, set by setupPipeline before the server starts) is up.
	srv.AddCheck("broker", brokerCheck(tu, func() api.Checker {
		if w.disp == nil {
			return nil
		}
		return w.disp.Ready
	}))
	// Policy: the rules, their reload loop, POST /v1/policy/explain.
	pol, polComp, err := setupPolicy(w, nil, nil, nil)
	if err != nil {
		return err
	}
	comps = append(comps, polComp)
	// Operator controls: pause, observe-only, drains; read by placement and the pipeline.
	// Placement: mirror, sync loop, engine, claims, /v1/placements, /v1/gpus, /v1/hosts.
	pl, plComp, err := setupPlacement(ctx, w, pol)
	if err != nil {
		return err
	}
	comps = append(comps, plComp)
	srv.AddCheck("placement", pl.Ready) // not ready before the first full inventory sync
	comps = append(comps, component{"memory", func(ctx context.Context) error { return returnLoadMemory(ctx, pl.Loaded()) }})
	// Webhooks and the request store: /v1/webhooks/{source}, /v1/requests, callbacks.
	whComps, err := setupWebhooks(w, ac)
	if err != nil {
		return err
	}
	comps = append(comps, whComps...)
	// Nova notifications: consumer loop + /v1/instances, /v1/events, /v1/dead-letters.
	notifCfg, err := NotificationsConfig(v, ntu)
	if err != nil {
		return err
	}
	notifCfg.OnCommitted = w.wake.Wake // new events are decided at once, not at the next poll
	notif, err := ingest.New(notifCfg, pool, reg, log.With("component", "notifications"))
	if err != nil {
		return err
	}
	notif.Register(srv)
	srv.AddCheck("notifications", notif.Ready) // commits to Postgres failing for [notifications] stall_after
	comps = append(comps, component{"notifications", notif.Run})
	// Nova's servers listed into the instances: all at first start, then the changes since (catch-up).
	if c := setupServerSync(w, notifCfg.ClockSkewTolerance); c != nil {
		comps = append(comps, *c)
	}
	// Pipeline and dispatch: inbox → policy → Placement claim → outbox → agents; results, reports, deadlines.
	pipeComps, err := setupPipeline(ctx, w, brokerTLS, pol, pl)
	if err != nil {
		return err
	}
	comps = append(comps, pipeComps...)
	// Accounting: GET /v1/usage, audit periods (vgpu.exists), the relay of the bridge's own notifications.
	acctComps, err := setupAccounting(w, otu, brokerTLS)
	if err != nil {
		return err
	}
	comps = append(comps, acctComps...)
	// Operator controls: /v1/controls, drains, /v1/audit, /v1/profiles, dead-letter replay; retention purge.
	comps = append(comps, setupControls(w, pl, pol, notif)...)
	// Drift reconciler: Placement ↔ agents' reports ↔ bridge records; GET /v1/drift, repairs.
	driftComp, err := setupDrift(w, pl)
	if err != nil {
		return err
	}
	comps = append(comps, driftComp)
	// Dashboard: /ui (embedded page over /v1) and GET /v1/status (ingest lag, agent reports).
	ui.New(ui.Config{Pool: pool, StaleReportAge: placement.StaleReportAge(v), Version: Version}).Register(srv)

	if err := srv.Start(); err != nil {
		return err
	}
	if started != nil {
		started(&Daemon{API: srv, Pool: pool, reload: rl, sections: reportSections(pool, srv, tu, ntu)})
	}
	log.Info("vgpu-bridge started", "version", Version, "api", srv.Addr(), "broker", tu.Redacted(),
		"notifications_broker", ntu.Redacted())

	var wg sync.WaitGroup
	errc := make(chan error, len(comps))
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, c := range comps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.run(cctx); err != nil && !errors.Is(err, context.Canceled) {
				errc <- fmt.Errorf("%s: %w", c.name, err)
			}
		}()
	}
	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case runErr = <-errc:
		log.Error("component failed; shutting down", "err", runErr)
	}
	cancel()
	shutErr := srv.Shutdown()
	wg.Wait()
	return errors.Join(runErr, shutErr)
}

// returnLoadMemory hands the memory of the index's first load back to the
// OS once it is over. Loading the mirror of a large fleet at start (or
// this replica's first full sync) is a one-off burst: with 10,000 hosts ×
// 8 GPUs it allocates about twice what the index keeps, and the heap
// grows to that peak. The Go runtime would give the difference back only
// over minutes (its background scavenger is paced to a small share of
// CPU), and the process would look that large meanwhile; a long-running
// daemon can well afford one forced collection and release (tens of ms)
// after a one-off load. Later loads (a replica that starts leading, a
// "reload everything" notification) are rarer and left to the runtime.
func returnLoadMemory(ctx context.Context, loaded <-chan struct{}) error {
	select {
	case <-ctx.Done():
	case <-loaded:
		debug.FreeOSMemory()
	}
	return nil
}

func checkSchema(ctx context.Context, pool *pgxpool.Pool, auto bool, log *slog.Logger) error {
	if auto {
		if _, err := store.Migrate(ctx, pool, log); err != nil {
			return err
		}
		return nil
	}
	n, err := store.Pending(ctx, pool)
	if err != nil {
		return fmt.Errorf("check schema: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("%w: %d migration(s) pending; run `vgpu-bridge migrate up` (or set [database] auto_migrate = true)", ErrSchemaBehind, n)
	}
	return nil
}

// brokerCheck reports the broker's state. When own gives a check of this
// replica's own session (the dispatcher's connection), that decides, at
// once: a dispatcher reconnecting is not ready even while a new
// connection would succeed. Otherwise it dials the broker (AMQP handshake
// included) at most every few seconds and reports the last outcome.
func brokerCheck(tu *conf.TransportURL, own func() api.Checker) api.Checker {
	var mu sync.Mutex
	var last time.Time
	var lastErr error
	return func(ctx context.Context) error {
		if own != nil {
			if c := own(); c != nil {
				return c(ctx)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if time.Since(last) < 3*time.Second {
			return lastErr
		}
		lastErr = dialAny(ctx, tu)
		last = time.Now()
		return lastErr
	}
}

func dialAny(ctx context.Context, tu *conf.TransportURL) error {
	var errs []error
	for i, u := range tu.AMQPURLs() {
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(2 * time.Second)
		}
		conn, _, err := amqpconn.Dial(amqpconn.Config{URLs: []string{u}, Name: "vgpu-bridge readiness", Timeout: max(time.Until(deadline), time.Millisecond)}, 0)
		if err == nil {
			conn.Close()
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %s", tu.Brokers[i].Host, redactAMQP(err)))
	}
	return errors.Join(errs...)
}

func redactAMQP(err error) string {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return fmt.Sprintf("AMQP %d %s", ae.Code, ae.Reason)
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Err.Error()
	}
	return "connection failed"
}
