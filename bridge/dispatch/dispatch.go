// Package dispatch connects the bridge to its agents over RabbitMQ
// (package agent/protocol). The outbox relay publishes the commands rows the
// pipeline wrote, with publisher confirms, to exchange "vgpu" with routing
// key agent.<host>, and marks them sent; the commands of one request go
// out in order, each once its predecessor succeeded. Results (queue
// vgpu.bridge.results, bound result.#) go to a ResultHandler (the
// pipeline); reports (vgpu.bridge.reports, bound report.#) update the hosts
// and gpus tables: the host ↔ Placement node mapping and the last report
// time that keeps stale hosts out of placement.
//
// Every replica runs a relay and both consumers: rows are taken with FOR
// UPDATE SKIP LOCKED, so each command is published by one replica, and
// RabbitMQ hands each result and report to one consumer.
package dispatch

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/amqpconn"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

// Config configures a Dispatcher; zero fields take DefaultConfig's values.
type Config struct {
	// URLs are the brokers' amqp:// URLs, tried in order.
	URLs []string
	// TLS is used for amqps:// URLs.
	TLS *tls.Config
	// Exchange is the bridge↔agent topic exchange ("vgpu").
	Exchange string
	// ResultsQueue and ReportsQueue are the bridge's durable queues,
	// shared by every replica.
	ResultsQueue, ReportsQueue string
	// ResultsBindings and ReportsBindings are their routing keys
	// (result.#, report.#: host names contain dots).
	ResultsBindings, ReportsBindings []string
	// QuorumQueues declares the bridge's queues as quorum queues.
	QuorumQueues bool
	// DeclareAgentQueues declares vgpu.agent.<host> (as the agent does)
	// before the first command to a host, so commands wait for an agent
	// that is not up yet instead of being dropped as unroutable.
	DeclareAgentQueues bool
	// RelayInterval is how often the outbox is polled when nothing woke
	// the relay.
	RelayInterval time.Duration
	// RelayBatch is the most commands one relay round publishes.
	RelayBatch int
	// ConfirmTimeout bounds the wait for the broker's confirms.
	ConfirmTimeout time.Duration
	// Prefetch is the consumers' QoS.
	Prefetch int
	// ReconnectMin and ReconnectMax bound the reconnect backoff.
	ReconnectMin, ReconnectMax time.Duration
	// ConnectionName is shown in RabbitMQ's management UI.
	ConnectionName string
	// Replica names this process in logs and the audit.
	Replica string

	// Signer, when set, signs every command as the relay publishes it
	// (the signed body is also what the outbox row keeps).
	Signer *protocol.Signer
	// Keyring, when set, holds the agents' public keys (each with its
	// Host): a result or report whose signature does not verify with the
	// key of its host is dropped (acknowledged, never applied), logged
	// and counted.
	Keyring *protocol.Keyring
	// KeyringFile, when set, is the file Keyring was read from: a result
	// or report naming a key id Keyring lacks makes the dispatcher read
	// it again if it changed (a host enrolled since), at most once a
	// second.
	KeyringFile string
	// RequireSigned drops unsigned results and reports too; without it
	// they are accepted, logged and counted (switch-over only). It needs
	// Keyring.
	RequireSigned bool
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	if c.Exchange == "" {
		c.Exchange = d.Exchange
	}
	if c.ResultsQueue == "" {
		c.ResultsQueue = d.ResultsQueue
	}
	if c.ReportsQueue == "" {
		c.ReportsQueue = d.ReportsQueue
	}
	if len(c.ResultsBindings) == 0 {
		c.ResultsBindings = d.ResultsBindings
	}
	if len(c.ReportsBindings) == 0 {
		c.ReportsBindings = d.ReportsBindings
	}
	if c.RelayInterval <= 0 {
		c.RelayInterval = d.RelayInterval
	}
	if c.RelayBatch <= 0 {
		c.RelayBatch = d.RelayBatch
	}
	if c.ConfirmTimeout <= 0 {
		c.ConfirmTimeout = d.ConfirmTimeout
	}
	if c.Prefetch <= 0 {
		c.Prefetch = d.Prefetch
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = d.ReconnectMin
	}
	if c.ReconnectMax <= 0 {
		c.ReconnectMax = d.ReconnectMax
	}
	if c.ConnectionName == "" {
		c.ConnectionName = d.ConnectionName
	}
	if c.Replica == "" {
		c.Replica, _ = os.Hostname()
	}
}

// Validate reports impossible settings.
func (c *Config) Validate() error {
	var errs []error
	if len(c.URLs) == 0 {
		errs = append(errs, errors.New("no broker URL"))
	}
	if c.ResultsQueue == c.ReportsQueue {
		errs = append(errs, fmt.Errorf("results and reports share the queue %q", c.ResultsQueue))
	}
	if c.ReconnectMax < c.ReconnectMin {
		errs = append(errs, fmt.Errorf("reconnect max %v below min %v", c.ReconnectMax, c.ReconnectMin))
	}
	if c.RequireSigned && c.Keyring == nil {
		errs = append(errs, errors.New("signed results and reports are required but there is no keyring of agents' keys"))
	}
	return errors.Join(errs...)
}

// ResultHandler takes agents' results (the pipeline). An error leaves the
// result in the queue for a later attempt. A handler that queues commands
// in answer (the request's next command, a compensation) wakes the relay
// itself (Kick, the pipeline's OnOutbox); otherwise they go at the
// relay's next poll.
type ResultHandler interface {
	HandleResult(ctx context.Context, r protocol.Result) error
}

// CatalogObserver learns vGPU types from reports (catalog.Catalog).
type CatalogObserver interface {
	Observe(typeID, name string, maxInstances int) (catalog.Profile, error)
}

// Deps are the dispatcher's collaborators.
type Deps struct {
	Pool     *pgxpool.Pool
	Requests *requests.Store
	Results  ResultHandler
	Catalog  CatalogObserver // may be nil
	// Phase names a request's phase while a command kind runs (the
	// pipeline's PhaseOf); nil: the kind itself.
	Phase    func(protocol.Kind) string
	Log      *slog.Logger
	Registry prometheus.Registerer // may be nil
	// Hold, when set, is asked in each relay round's transaction whether
	// operators hold the outbox (paused or observe-only: bridge/controls
	// Store.Hold); held commands stay queued. Results are still applied.
	Hold func(ctx context.Context, tx pgx.Tx) (bool, error)
	// Faults, when set, gets each kept report's GPUs (host, node: its
	// Placement root provider name) to mark the faulted ones (bridge/
	// controls Store.GPUFaults); an error leaves the report to be
	// delivered again.
	Faults func(ctx context.Context, host, node string, gpus []protocol.GPU) error
}

// Dispatcher is the relay and the consumers.
type Dispatcher struct {
	cfg  Config
	d    Deps
	log  *slog.Logger
	kick wake.Waker
	m    *metrics
	// keyset starts as the Config's keys; SetKeys replaces it.
	keyset atomic.Pointer[Keys]
	ring   ringFile // KeyringFile re-read on an unknown key
	// conn is the state Ready reports: connected, or since when not and
	// why (a session that ended, a dial that failed).
	conn atomic.Pointer[connState]
}

type connState struct {
	up    bool
	since time.Time
	err   string
}

// New builds a dispatcher.
func New(cfg Config, d Deps) (*Dispatcher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Pool == nil || d.Results == nil {
		return nil, errors.New("dispatch: pool and result handler are required")
	}
	if d.Requests == nil {
		d.Requests = requests.NewStore(d.Pool, "vgpu-bridge")
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Phase == nil {
		d.Phase = func(k protocol.Kind) string { return string(k) }
	}
	x := &Dispatcher{cfg: cfg, d: d, log: d.Log, m: newMetrics(d.Registry)}
	x.keyset.Store(&Keys{Signer: cfg.Signer, Keyring: cfg.Keyring, KeyringFile: cfg.KeyringFile, RequireSigned: cfg.RequireSigned})
	x.conn.Store(&connState{since: time.Now(), err: "not connected yet"})
	return x, nil
}

// Ready fails while the dispatcher has no broker session (before the
// first, and from the moment one ends until the next is up, however long
// its reconnect backoff): commands cannot be sent nor results taken then,
// whether or not a fresh connection to the broker would succeed.
func (x *Dispatcher) Ready(context.Context) error {
	st := x.conn.Load()
	if st.up {
		return nil
	}
	return fmt.Errorf("dispatcher disconnected for %s: %s", time.Since(st.since).Round(time.Second), st.err)
}

func (x *Dispatcher) setDown(err error) {
	msg := "the session ended"
	if err != nil {
		msg = err.Error() // dial errors name their URL redacted
	}
	since := time.Now()
	if old := x.conn.Load(); !old.up {
		since = old.since
	}
	x.conn.Store(&connState{since: since, err: msg})
}

// Kick wakes the relay: new commands are in the outbox.
func (x *Dispatcher) Kick() { x.kick.Wake() }

// Run connects, declares the topology, relays and consumes until ctx
// ends, reconnecting with capped exponential backoff.
func (x *Dispatcher) Run(ctx context.Context) error {
	amqpconn.Loop{
		Backoff: backoff.Policy{Min: x.cfg.ReconnectMin, Max: x.cfg.ReconnectMax},
		Healthy: time.Minute,
		Ended: func(err error, wait time.Duration) {
			x.m.reconnects.Inc()
			x.log.Warn("dispatch: broker session ended; reconnecting", logkey.Err, err, "in", wait)
		},
	}.Run(ctx, func(ctx context.Context, n int) (bool, error) {
		err := x.session(ctx, n)
		x.setDown(err)
		return false, err
	})
	return nil
}

func (x *Dispatcher) dial(attempt int) (*amqp.Connection, error) {
	conn, _, err := amqpconn.Dial(amqpconn.Config{URLs: x.cfg.URLs, Name: x.cfg.ConnectionName + " " + x.cfg.Replica,
		TLS: amqpconn.StaticTLS(x.cfg.TLS)}, attempt)
	return conn, err
}

// Declare declares the exchange and the bridge's two queues with their
// bindings on ch.
func Declare(ch *amqp.Channel, cfg Config) error {
	cfg.setDefaults()
	if err := ch.ExchangeDeclare(cfg.Exchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", cfg.Exchange, err)
	}
	var args amqp.Table
	if cfg.QuorumQueues {
		args = amqp.Table{"x-queue-type": "quorum"}
	}
	for q, keys := range map[string][]string{cfg.ResultsQueue: cfg.ResultsBindings, cfg.ReportsQueue: cfg.ReportsBindings} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
			return fmt.Errorf("declare queue %s: %w", q, err)
		}
		for _, k := range keys {
			if err := ch.QueueBind(q, k, cfg.Exchange, false, nil); err != nil {
				return fmt.Errorf("bind queue %s to %s: %w", q, k, err)
			}
		}
	}
	return nil
}

// session is one connection's life: a confirm-mode channel for the relay
// and one channel per consumer.
func (x *Dispatcher) session(ctx context.Context, attempt int) error {
	conn, err := x.dial(attempt)
	if err != nil {
		return err
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := Declare(ch, x.cfg); err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	rch, err := conn.Channel()
	if err != nil {
		return err
	}
	pch, err := conn.Channel()
	if err != nil {
		return err
	}
	results, err := consume(rch, x.cfg.ResultsQueue, x.cfg.Prefetch, x.cfg.ConnectionName+" results "+x.cfg.Replica)
	if err != nil {
		return err
	}
	reports, err := consume(pch, x.cfg.ReportsQueue, x.cfg.Prefetch, x.cfg.ConnectionName+" reports "+x.cfg.Replica)
	if err != nil {
		return err
	}
	x.log.Info("dispatch: connected", logkey.Queue, x.cfg.ResultsQueue+","+x.cfg.ReportsQueue)
	x.conn.Store(&connState{up: true, since: time.Now()})
	defer x.setDown(nil) // at once, before the connection is closed; Run records why
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	go func() { errc <- x.relayLoop(sctx, ch) }()
	go func() { errc <- x.consumeLoop(sctx, results, x.handleResult) }()
	go func() { errc <- x.consumeLoop(sctx, reports, x.handleReport) }()
	var end error
	select {
	case <-ctx.Done():
	case e := <-closed:
		if e != nil {
			end = e
		} else {
			end = errors.New("connection closed")
		}
	case end = <-errc:
	}
	cancel()
	conn.Close()
	return end
}

func consume(ch *amqp.Channel, queue string, prefetch int, tag string) (<-chan amqp.Delivery, error) {
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return nil, err
	}
	d, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", queue, err)
	}
	return d, nil
}

// consumeLoop hands each delivery to h: acked when h succeeds or the
// message is broken for good, requeued after a pause when h fails.
func (x *Dispatcher) consumeLoop(ctx context.Context, ds <-chan amqp.Delivery, h func(context.Context, amqp.Delivery) (retry bool, err error)) error {
	policy := backoff.Policy{Min: 100 * time.Millisecond, Max: 10 * time.Second}
	pause := policy.New()
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-ds:
			if !ok {
				return errors.New("consumer channel closed")
			}
			retry, err := h(ctx, d)
			if err != nil && retry {
				x.log.Warn("dispatch: message not handled; requeued", logkey.Err, err, "routing_key", d.RoutingKey)
				_ = backoff.Wait(ctx, pause) // ends early only with ctx
				if err := d.Nack(false, true); err != nil {
					return err
				}
				continue
			}
			pause = policy.New()
			if err != nil {
				x.log.Warn("dispatch: broken message dropped", logkey.Err, err, "routing_key", d.RoutingKey)
			}
			if err := d.Ack(false); err != nil {
				return err
			}
		}
	}
}

func (x *Dispatcher) handleResult(ctx context.Context, d amqp.Delivery) (bool, error) {
	if !x.verified(protocol.TypeResult, d) {
		return false, nil
	}
	r, err := protocol.DecodeResultMax(d.Body, protocol.MaxBundleMessageBytes)
	if err == nil && len(d.Body) > protocol.MaxMessageBytes && !HasBundle(r) {
		err = fmt.Errorf("%w: result is %d bytes, more than %d, and carries no diagnostics bundle",
			protocol.ErrInvalid, len(d.Body), protocol.MaxMessageBytes)
	}
	if err != nil {
		x.m.broken.WithLabelValues("result", ReasonInvalid).Inc()
		x.deadLetter(ctx, "agent-result", err, d)
		return false, err
	}
	if ok, err := x.ownRefusal(ctx, r); err != nil {
		return true, err
	} else if !ok {
		return false, nil
	}
	if err := x.d.Results.HandleResult(ctx, r); err != nil {
		return true, err
	}
	return false, nil
}

// HasBundle reports whether r's details carry a diagnostics bundle
// (collect_diagnostics with bundle: true); only such a result may be
// larger than protocol.MaxMessageBytes.
func HasBundle(r protocol.Result) bool {
	if len(r.Details) == 0 || !bytes.Contains(r.Details, []byte(`"bundle"`)) {
		return false
	}
	var d struct {
		Bundle json.RawMessage `json:"bundle"`
	}
	return json.Unmarshal(r.Details, &d) == nil && len(d.Bundle) > 2 && d.Bundle[0] == '"'
}

func (x *Dispatcher) handleReport(ctx context.Context, d amqp.Delivery) (bool, error) {
	if !x.verified(protocol.TypeReport, d) {
		return false, nil
	}
	r, err := protocol.DecodeReport(d.Body)
	if err != nil {
		x.m.broken.WithLabelValues("report", ReasonInvalid).Inc()
		x.deadLetter(ctx, "agent-report", err, d)
		return false, err
	}
	if err := x.HandleReport(ctx, r); err != nil {
		return true, err
	}
	return false, nil
}

// deadLetter keeps a message that can never be handled.
func (x *Dispatcher) deadLetter(ctx context.Context, source string, why error, d amqp.Delivery) {
	raw := d.Body
	trunc := false
	if len(raw) > 64<<10 {
		raw, trunc = raw[:64<<10], true
	}
	if _, err := x.d.Pool.Exec(ctx, `INSERT INTO dead_letters (source, reason, detail, raw, raw_truncated) VALUES ($1, 'invalid', $2, $3, $4)`,
		source, why.Error(), raw, trunc); err != nil {
		x.log.Warn("dispatch: cannot keep a dead letter", logkey.Err, err)
	}
}
