// Package transport is the agent's RabbitMQ side (package agent/protocol): it
// declares the topic exchange "vgpu" and the durable queue
// vgpu.agent.<host> bound to agent.<host>, consumes commands with manual
// acknowledgement, hands each to the executor, publishes the result on
// result.<host> with publisher confirms and only then acknowledges the
// command. It publishes reports on report.<host> at start, when the host
// changes and every period. A lost connection is re-established with
// capped exponential backoff and jitter; an unacknowledged command is
// redelivered by RabbitMQ and answered from the journal.
package transport

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/amqpconn"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// Executor answers commands (agent/executor.Executor implements it).
// Execute returns a zero Result (no CommandID) when the command could not
// be finished now (the agent is stopping); it is then left unacknowledged.
type Executor interface {
	Execute(ctx context.Context, c protocol.Command) protocol.Result
	Refuse(c protocol.Command, code, msg string) protocol.Result
}

// Verifier checks a command's signature before anything else is done with
// it. VerifyCommand returns nil for a command that may go on to the
// executor, or an error whose protocol.SignatureCode is the refusal code.
type Verifier interface {
	VerifyCommand(body []byte) error
}

// Signer signs the results and reports the agent publishes.
type Signer interface {
	SignResult(r *protocol.Result) error
	SignReport(r *protocol.Report) error
}

// Reporter builds a report of the host (host, node, GPUs…); Seq and
// SentAt are set here.
type Reporter interface {
	Report(ctx context.Context) (protocol.Report, error)
}

// Config configures the loop.
type Config struct {
	// URLs are amqp:// or amqps:// URLs, one per broker, tried in turn
	// (conf.TransportURL.AMQPURLs()).
	URLs []string
	// Redacted names the brokers in logs, without passwords.
	Redacted  string
	TLSConfig *tls.Config
	// TLS, when set, builds the TLS configuration at each connection (so
	// certificates replaced on disk are used at the next one); it wins
	// over TLSConfig.
	TLS  func() (*tls.Config, error)
	Host string
	// Verifier, when set, checks every command before anything else;
	// a command that fails is refused with the code it gives.
	Verifier Verifier
	// Signer, when set, signs every result and report published.
	Signer Signer
	// Prefetch is how many commands may be delivered unacknowledged. Default 1.
	Prefetch int
	// MinBackoff and MaxBackoff bound the reconnection delay. Defaults 500ms, 30s.
	MinBackoff, MaxBackoff time.Duration
	// ReportInterval is the period of full reports. Default 60s.
	ReportInterval time.Duration
	// ReportCheckInterval is how often the host is looked at for a change
	// that warrants a report before the period ends. Default 10s; 0 default, <0 off.
	ReportCheckInterval time.Duration
	// StopGrace is how long a command in progress may run after ctx ends.
	// Default 30s.
	StopGrace time.Duration
	// ConfirmTimeout bounds the wait for a publisher confirm. Default 30s.
	ConfirmTimeout time.Duration
	Log            *slog.Logger
	Registerer     prometheus.Registerer
}

// Loop consumes commands and publishes results and reports.
type Loop struct {
	cfg     Config
	exec    Executor
	rep     Reporter
	changed <-chan struct{}
	log     *slog.Logger

	ready   atomic.Bool
	mu      sync.Mutex // guards pending, pub and returns
	pending []protocol.Result
	pub     *amqp.Channel
	returns <-chan amqp.Return // pub's returned (unroutable) messages
	seq     atomic.Uint64
	lastFP  string

	retMu    sync.Mutex
	returned map[string]string // message id → why the broker returned it

	reportedOnce sync.Once
	reported     chan struct{} // closed once a first report is confirmed
	lastReport   atomic.Int64  // unix nanoseconds of the last confirmed report

	connected  prometheus.Gauge
	reconnects prometheus.Counter
	published  *prometheus.CounterVec
	deliveries *prometheus.CounterVec
}

// New returns a loop; changed (may be nil) signals that the host changed.
func New(cfg Config, exec Executor, rep Reporter, changed <-chan struct{}) (*Loop, error) {
	if len(cfg.URLs) == 0 {
		return nil, errors.New("transport: no broker URL")
	}
	if cfg.Host == "" || exec == nil {
		return nil, errors.New("transport: Host and Executor are required")
	}
	d := defaults()
	if cfg.Prefetch <= 0 {
		cfg.Prefetch = d.Prefetch
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 500 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(d.MaxBackoff, cfg.MinBackoff)
	}
	if cfg.ReportInterval <= 0 {
		cfg.ReportInterval = d.ReportInterval
	}
	if cfg.ReportCheckInterval == 0 {
		cfg.ReportCheckInterval = d.ReportCheckInterval
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 30 * time.Second
	}
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = 30 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Redacted == "" {
		cfg.Redacted = "rabbitmq"
	}
	l := &Loop{cfg: cfg, exec: exec, rep: rep, changed: changed, log: cfg.Log, reported: make(chan struct{}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vgpu_agent_amqp_connected",
			Help: "1 while the agent is connected to RabbitMQ and consuming its command queue."}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpu_agent_amqp_reconnects_total",
			Help: "Connections to RabbitMQ lost or refused (each is followed by a backoff and a new attempt)."}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_agent_published_total",
			Help: "Messages published and confirmed by RabbitMQ, by type (result, report)."}, []string{"type"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_agent_deliveries_total",
			Help: "Command deliveries, by outcome (acked, requeued, dropped)."}, []string{"outcome"}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{l.connected, l.reconnects, l.published, l.deliveries} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("transport: metrics: %w", err)
			}
		}
	}
	return l, nil
}

// Ready reports whether the loop is connected and consuming.
func (l *Loop) Ready() bool { return l.ready.Load() }

// Reported is closed once the broker has confirmed the loop's first
// report: the agent is connected and the bridge knows its host.
func (l *Loop) Reported() <-chan struct{} { return l.reported }

// Status is the loop's state, for the SIGUSR2 report.
type Status struct {
	Connected      bool
	Broker, Queue  string // Broker without password
	PendingResults int    // results waiting for a connection
	ReportsSent    uint64 // reports built and sent (the last sequence number)
	LastReport     time.Time
}

// Status returns the loop's state now.
func (l *Loop) Status() Status {
	l.mu.Lock()
	pending := len(l.pending)
	l.mu.Unlock()
	st := Status{Connected: l.ready.Load(), Broker: l.cfg.Redacted, Queue: protocol.AgentQueue(l.cfg.Host),
		PendingResults: pending, ReportsSent: l.seq.Load()}
	if ns := l.lastReport.Load(); ns != 0 {
		st.LastReport = time.Unix(0, ns)
	}
	return st
}

// Enqueue adds results to publish as soon as connected (recovered
// commands' results).
func (l *Loop) Enqueue(rs ...protocol.Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = append(l.pending, rs...)
}

// Run connects and serves until ctx ends; it returns nil then. A command
// in progress when ctx ends gets StopGrace to finish.
func (l *Loop) Run(ctx context.Context) error {
	// hard ends StopGrace after ctx: commands run under it.
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(l.cfg.StopGrace, cancelHard)
		context.AfterFunc(hard, func() { t.Stop() })
	})
	defer stop()

	amqpconn.Loop{
		Backoff: backoff.Policy{Min: l.cfg.MinBackoff, Max: l.cfg.MaxBackoff},
		Ended: func(err error, wait time.Duration) {
			l.reconnects.Inc()
			l.log.Warn("rabbitmq connection lost; reconnecting", logkey.Err, err, "in", wait.Round(time.Millisecond))
		},
	}.Run(ctx, func(ctx context.Context, n int) (bool, error) {
		defer func() {
			l.ready.Store(false)
			l.connected.Set(0)
		}()
		return false, l.session(ctx, hard, n)
	})
	return nil
}

func (l *Loop) dial(attempt int) (*amqp.Connection, error) {
	tlsFor := amqpconn.StaticTLS(l.cfg.TLSConfig)
	if l.cfg.TLS != nil {
		tlsFor = l.cfg.TLS
	}
	conn, _, err := amqpconn.Dial(amqpconn.Config{URLs: l.cfg.URLs, Name: "vgpu-agent " + l.cfg.Host, Product: "vgpu-agent", TLS: tlsFor}, attempt)
	return conn, err
}

// Declare declares the exchange and the host's command queue and binding
// on ch. The bridge declares the same exchange with the same arguments.
func Declare(ch *amqp.Channel, host string) error {
	if err := ch.ExchangeDeclare(protocol.Exchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", protocol.Exchange, err)
	}
	return DeclareQueue(ch, host)
}

// EnsureExchange makes sure the exchange exists. When it does, nothing is
// declared, so an agent account needs no configure permission on it
// (etc/rabbitmq/setup-accounts.sh grants none); when it does not, it is
// declared, which only an account allowed to (the bridge's) can do.
func EnsureExchange(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	err = ch.ExchangeDeclarePassive(protocol.Exchange, "topic", true, false, false, false, nil)
	if err == nil {
		return ch.Close()
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		return fmt.Errorf("check exchange %s: %w", protocol.Exchange, err)
	}
	// The failed passive declare closed that channel.
	if ch, err = conn.Channel(); err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(protocol.Exchange, "topic", true, false, false, false, nil); err != nil {
		return fmt.Errorf("exchange %s does not exist and this account may not declare it (the bridge does): %w", protocol.Exchange, err)
	}
	return nil
}

// DeclareQueue declares host's durable command queue and binds it to
// agent.<host> on the exchange.
func DeclareQueue(ch *amqp.Channel, host string) error {
	q := protocol.AgentQueue(host)
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %s: %w", q, err)
	}
	if err := ch.QueueBind(q, protocol.CommandRoutingKey(host), protocol.Exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s: %w", q, err)
	}
	return nil
}

// session is one connection's life.
func (l *Loop) session(ctx, hard context.Context, attempt int) error {
	conn, err := l.dial(attempt)
	if err != nil {
		return err
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	if err := EnsureExchange(conn); err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := DeclareQueue(ch, l.cfg.Host); err != nil {
		return err
	}
	if err := ch.Qos(l.cfg.Prefetch, 0, false); err != nil {
		return err
	}
	pub, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := pub.Confirm(false); err != nil {
		return fmt.Errorf("publisher confirms: %w", err)
	}
	// Results and reports are mandatory: one no queue is bound for (the
	// bridge has not declared its queues yet) comes back, and is sent
	// again, instead of being dropped by the exchange.
	returns := pub.NotifyReturn(make(chan amqp.Return, 64))
	l.mu.Lock()
	l.pub, l.returns = pub, returns
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.pub, l.returns = nil, nil
		l.mu.Unlock()
	}()
	if err := l.flushPending(hard); err != nil {
		return err
	}
	tag := "vgpu-agent." + l.cfg.Host
	deliveries, err := ch.Consume(protocol.AgentQueue(l.cfg.Host), tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	l.ready.Store(true)
	l.connected.Set(1)
	l.log.Info("connected to rabbitmq; consuming commands", logkey.Broker, l.cfg.Redacted, "queue", protocol.AgentQueue(l.cfg.Host))

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	if l.rep != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.reportLoop(sctx)
		}()
	}
	defer wg.Wait()
	defer cancel()

	for {
		select {
		case <-ctx.Done():
			_ = ch.Cancel(tag, false)
			return nil
		case e := <-closed:
			if e == nil {
				return errors.New("connection closed")
			}
			return e
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("delivery channel closed")
			}
			if err := l.handle(hard, d); err != nil {
				return err
			}
		}
	}
}

func (l *Loop) flushPending(ctx context.Context) error {
	l.mu.Lock()
	todo := l.pending
	l.mu.Unlock()
	for i, r := range todo {
		if err := l.publish(ctx, protocol.ResultRoutingKey(l.cfg.Host), "result", r.CommandID, r); err != nil {
			l.mu.Lock()
			l.pending = append(todo[i:], l.pending[len(todo):]...)
			l.mu.Unlock()
			return err
		}
	}
	l.mu.Lock()
	l.pending = l.pending[len(todo):]
	l.mu.Unlock()
	return nil
}

// handle executes one delivery, publishes its result and acknowledges it.
// An error means the connection is unusable; the delivery stays unacked.
func (l *Loop) handle(ctx context.Context, d amqp.Delivery) error {
	c, err := protocol.DecodeCommand(d.Body)
	var res protocol.Result
	var verr error
	if l.cfg.Verifier != nil && c.ID != "" {
		// Before anything else: the journal is not even looked at, so a
		// forged command reusing an executed id gets no recorded result.
		verr = l.cfg.Verifier.VerifyCommand(d.Body)
	}
	switch {
	case err != nil && c.ID == "":
		l.log.Error("dropping a message that is not a command", logkey.Err, err, "message_id", d.MessageId)
		l.deliveries.WithLabelValues("dropped").Inc()
		return d.Nack(false, false)
	case verr != nil:
		code := protocol.SignatureCode(verr)
		if code == "" {
			code = protocol.CodeBadSignature
		}
		l.log.Warn("refused: command signature", logkey.Command, c.ID, "reason", code, logkey.Err, verr)
		res = l.exec.Refuse(c, code, verr.Error())
		// The digest lets the bridge tell a refusal of its own command from
		// one of a forgery that borrowed the id.
		sum := sha256.Sum256(d.Body)
		res.Details, _ = json.Marshal(map[string]string{"body_sha256": hex.EncodeToString(sum[:])})
	case err != nil && c.Host != "" && c.Host != l.cfg.Host:
		res = l.exec.Refuse(c, protocol.CodeWrongHost, fmt.Sprintf("command is for host %q, this agent is %q", c.Host, l.cfg.Host))
	case err != nil:
		res = l.exec.Refuse(c, protocol.CodeInvalidCommand, err.Error())
	default:
		res = l.exec.Execute(ctx, c)
	}
	if res.CommandID == "" {
		l.deliveries.WithLabelValues("requeued").Inc()
		_ = d.Nack(false, true)
		return errors.New("command left unfinished (stopping)")
	}
	if err := l.publish(ctx, protocol.ResultRoutingKey(l.cfg.Host), "result", res.CommandID, res); err != nil {
		return fmt.Errorf("publish result of %s: %w", res.CommandID, err)
	}
	l.deliveries.WithLabelValues("acked").Inc()
	return d.Ack(false)
}

// publish signs v (a Result or Report) when a Signer is set, sends it and
// waits for the broker's confirm.
func (l *Loop) publish(ctx context.Context, key, typ, id string, v any) error {
	if s := l.cfg.Signer; s != nil {
		switch m := v.(type) {
		case protocol.Result:
			if err := s.SignResult(&m); err != nil {
				return fmt.Errorf("sign result: %w", err)
			}
			v = m
		case protocol.Report:
			if err := s.SignReport(&m); err != nil {
				return fmt.Errorf("sign report: %w", err)
			}
			v = m
		}
	}
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	l.mu.Lock()
	pub := l.pub
	if pub == nil {
		l.mu.Unlock()
		return errors.New("not connected")
	}
	returns := l.returns
	cctx, cancel := context.WithTimeout(ctx, l.cfg.ConfirmTimeout)
	defer cancel()
	dc, err := pub.PublishWithDeferredConfirmWithContext(cctx, protocol.Exchange, key, true, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Type: typ,
		AppId: "vgpu-agent", Timestamp: time.Now().UTC(), Body: body,
	})
	l.mu.Unlock()
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(cctx)
	if err != nil {
		return fmt.Errorf("confirm: %w", err)
	}
	if !ok {
		return errors.New("broker refused the message (nack)")
	}
	if why, back := l.wasReturned(returns, id); back {
		return fmt.Errorf("%w: %s %s (routing key %s): %s", ErrUnroutable, typ, id, key, why)
	}
	l.published.WithLabelValues(typ).Inc()
	return nil
}

// ErrUnroutable says the broker had no queue for a message: the bridge's
// queues are not declared yet.
var ErrUnroutable = errors.New("no queue is bound for the message yet")

// wasReturned reports whether the broker returned message id. The broker
// sends basic.return before the confirm, and the library queues it on
// returns before it resolves the confirm: once confirmed, a return is
// already waiting there.
func (l *Loop) wasReturned(returns <-chan amqp.Return, id string) (string, bool) {
	l.retMu.Lock()
	defer l.retMu.Unlock()
	if l.returned == nil {
		l.returned = map[string]string{}
	}
	for drained := false; !drained && returns != nil; {
		select {
		case r, ok := <-returns:
			if !ok {
				drained = true
				break
			}
			l.returned[r.MessageId] = fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
		default:
			drained = true
		}
	}
	why, ok := l.returned[id]
	delete(l.returned, id)
	return why, ok
}

// reportLoop publishes a report now, when the host changed, and every period.
func (l *Loop) reportLoop(ctx context.Context) {
	// A report that did not go out (no queue bound yet, a nack) is sent
	// again after a backoff, not at the next period: from 1 s up to the
	// check interval, so a bridge that binds late hears from the agent
	// within one check interval.
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	failures := 0
	send := func(force bool) {
		r, err := l.rep.Report(ctx)
		if err != nil {
			l.log.Warn("cannot build report", logkey.Err, err)
			return
		}
		fp := fingerprint(r)
		if !force && (fp == l.lastFP || failures > 0) {
			return // unchanged, or a retry is due that sends it anyway
		}
		r.V, r.Minor = protocol.Version, protocol.Minor
		r.Host = l.cfg.Host
		r.Seq = l.seq.Add(1)
		r.SentAt = time.Now().UTC()
		if err := l.publish(ctx, protocol.ReportRoutingKey(l.cfg.Host), "report", fmt.Sprintf("%s-%d", l.cfg.Host, r.Seq), r); err != nil {
			if ctx.Err() == nil {
				wait := backoff.Policy{Min: time.Second, Max: max(time.Second, min(l.cfg.ReportCheckInterval, l.cfg.ReportInterval))}.Delay(failures)
				failures++
				l.log.Warn("cannot publish report; sending it again", logkey.Err, err, "in", wait.Round(time.Millisecond))
				retry.Reset(wait)
			}
			return
		}
		failures = 0
		l.lastFP = fp
		l.lastReport.Store(time.Now().UnixNano())
		l.reportedOnce.Do(func() { close(l.reported) })
	}
	send(true)
	period := time.NewTicker(l.cfg.ReportInterval)
	defer period.Stop()
	var check <-chan time.Time
	if l.cfg.ReportCheckInterval > 0 {
		t := time.NewTicker(l.cfg.ReportCheckInterval)
		defer t.Stop()
		check = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-period.C:
			send(true)
		case <-retry.C:
			send(true)
		case <-check:
			send(false)
		case <-l.changed:
			send(false)
		}
	}
}

// fingerprint is what makes a report different: everything but the
// timestamp, the sequence and the volatile measurements.
func fingerprint(r protocol.Report) string {
	r.SentAt, r.Seq = time.Time{}, 0
	gpus := make([]protocol.GPU, len(r.GPUs))
	for i, g := range r.GPUs {
		g.UtilPercent, g.MemoryUsedMiB, g.TemperatureC, g.PowerW = nil, nil, nil, nil
		gpus[i] = g
	}
	r.GPUs = gpus
	b, _ := json.Marshal(r)
	return string(b)
}
