package notify

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/amqpconn"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
)

// Drivers, as oslo.messaging's [oslo_messaging_notifications] driver.
const (
	DriverMessagingV2 = "messagingv2" // publish to RabbitMQ
	DriverNoop        = "noop"        // mark sent without publishing
)

// Config is how the relay publishes.
type Config struct {
	Driver string
	// URLs are the brokers (amqp:// URLs of the notification transport).
	URLs []string
	TLS  *tls.Config
	// Exchange is the topic exchange (oslo's control_exchange), declared
	// with ExchangeDurable and ExchangeAutoDelete as oslo.messaging does
	// with amqp_durable_queues and amqp_auto_delete.
	Exchange           string
	ExchangeDurable    bool
	ExchangeAutoDelete bool
	// Topics: each notification goes to TOPIC.PRIORITY of each.
	Topics []string
	// DeclareQueues declares and binds a queue named after each routing
	// key, as oslo.messaging's notifier does, so that nothing is lost
	// before a consumer binds its own.
	DeclareQueues bool
	// PublisherID is the messages' publisher_id ("vgpu-bridge:HOST").
	PublisherID string
	// BatchSize bounds the rows read per round; Poll is the longest wait
	// between rounds when no commit signals new rows.
	BatchSize      int
	Poll           time.Duration
	ConfirmTimeout time.Duration
	ReconnectMin   time.Duration
	ReconnectMax   time.Duration
	Replica        string
}

// Relay publishes the outbox (bridge_notifications) in id order.
type Relay struct {
	cfg  Config
	pool *pgxpool.Pool
	log  *slog.Logger

	sent     *prometheus.CounterVec
	failures prometheus.Counter
	backlog  prometheus.GaugeFunc
}

// lockKey keeps the relay to one replica at a time.
const lockKey = "vgpu-bridge-notify-relay"

// New returns a relay over pool; reg may be nil.
func New(cfg Config, pool *pgxpool.Pool, reg prometheus.Registerer, log *slog.Logger) (*Relay, error) {
	switch cfg.Driver {
	case DriverMessagingV2:
		if len(cfg.URLs) == 0 {
			return nil, errors.New("notify: no transport URL")
		}
		if cfg.Exchange == "" || len(cfg.Topics) == 0 {
			return nil, errors.New("notify: an exchange and at least one topic are needed")
		}
	case DriverNoop:
	default:
		return nil, fmt.Errorf("notify: unknown driver %q (want %s or %s)", cfg.Driver, DriverMessagingV2, DriverNoop)
	}
	d := DefaultConfig()
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = d.BatchSize
	}
	if cfg.Poll <= 0 {
		cfg.Poll = d.Poll
	}
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = d.ConfirmTimeout
	}
	if cfg.ReconnectMin <= 0 {
		cfg.ReconnectMin = amqpconn.DefaultBackoff.Min
	}
	if cfg.ReconnectMax <= 0 {
		cfg.ReconnectMax = amqpconn.DefaultBackoff.Max
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Relay{cfg: cfg, pool: pool, log: log,
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpu_bridge_notifications_sent_total",
			Help: "The bridge's own notifications published (confirmed by the broker), by event type; noop: discarded."}, []string{"event_type"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpu_bridge_notifications_publish_failures_total",
			Help: "Failed rounds of publishing the bridge's own notifications (they are sent again)."}),
	}
	r.backlog = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpu_bridge_notifications_unsent",
		Help: "The bridge's own notifications committed and not yet published."}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM bridge_notifications WHERE sent_at IS NULL`).Scan(&n); err != nil {
			return -1
		}
		return float64(n)
	})
	if reg != nil {
		reg.MustRegister(r.sent, r.failures, r.backlog)
	}
	return r, nil
}

// Run publishes until ctx ends. One replica publishes at a time (a
// Postgres session lock); the others wait their turn.
func (r *Relay) Run(ctx context.Context) error {
	amqpconn.Loop{
		Backoff: backoff.Policy{Min: r.cfg.ReconnectMin, Max: r.cfg.ReconnectMax},
		Healthy: time.Minute,
		Ended: func(err error, wait time.Duration) {
			if !errors.Is(err, errNotLeader) {
				r.failures.Inc()
				r.log.Warn("notify: session ended; starting again", logkey.Err, err, "in", wait)
			}
		},
	}.Run(ctx, r.session)
	return nil
}

var errNotLeader = errors.New("another replica publishes the notifications")

// session holds the relay lock on one connection, listens there for
// commits that queued notifications and publishes on one broker
// connection until either fails.
func (r *Relay) session(ctx context.Context, attempt int) (bool, error) {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	release, ok, err := store.TryLock(ctx, conn, lockKey)
	if err != nil {
		return false, err
	}
	if !ok {
		// Another replica publishes; try again after a while.
		wake.Wait(ctx, nil, r.cfg.Poll)
		return false, errNotLeader
	}
	defer release()
	if _, err := conn.Exec(ctx, `LISTEN `+Channel); err != nil {
		return false, err
	}
	defer conn.Exec(context.WithoutCancel(ctx), `UNLISTEN `+Channel) //nolint:errcheck

	var ch *amqp.Channel
	var closed chan *amqp.Error
	if r.cfg.Driver == DriverMessagingV2 {
		ac, _, err := amqpconn.Dial(amqpconn.Config{URLs: r.cfg.URLs, Name: "vgpu-bridge notifications out " + r.cfg.Replica,
			TLS: amqpconn.StaticTLS(r.cfg.TLS)}, attempt)
		if err != nil {
			return false, err
		}
		defer ac.Close()
		closed = ac.NotifyClose(make(chan *amqp.Error, 1))
		if ch, err = ac.Channel(); err != nil {
			return false, err
		}
		if err := r.declare(ch); err != nil {
			return false, err
		}
		if err := ch.Confirm(false); err != nil {
			return false, fmt.Errorf("confirm mode: %w", err)
		}
		r.log.Info("notify: publishing", "exchange", r.cfg.Exchange, "topics", strings.Join(r.cfg.Topics, ","))
	}
	progressed := false
	for {
		n, err := r.round(ctx, conn.Conn(), ch)
		if err != nil {
			return progressed, err
		}
		if n > 0 {
			progressed = true
			continue // there may be more
		}
		select {
		case e := <-closed:
			if e == nil {
				return progressed, errors.New("broker connection closed")
			}
			return progressed, e
		default:
		}
		wctx, cancel := context.WithTimeout(ctx, r.cfg.Poll)
		_, err = conn.Conn().WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return progressed, ctx.Err()
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !pgconnTimeout(err) {
			return progressed, err
		}
	}
}

func pgconnTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

func (r *Relay) declare(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(r.cfg.Exchange, "topic", r.cfg.ExchangeDurable, r.cfg.ExchangeAutoDelete, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", r.cfg.Exchange, err)
	}
	if !r.cfg.DeclareQueues {
		return nil
	}
	for _, t := range r.cfg.Topics {
		for _, p := range []Priority{Info, Error} {
			key := RoutingKey(t, p)
			if _, err := ch.QueueDeclare(key, r.cfg.ExchangeDurable, r.cfg.ExchangeAutoDelete, false, false, nil); err != nil {
				return fmt.Errorf("declare queue %s: %w", key, err)
			}
			if err := ch.QueueBind(key, key, r.cfg.Exchange, false, nil); err != nil {
				return fmt.Errorf("bind queue %s: %w", key, err)
			}
		}
	}
	return nil
}

// RoutingKey is oslo.messaging's routing key of a notification: the
// topic, a dot and the priority in lower case.
func RoutingKey(topic string, p Priority) string { return topic + "." + strings.ToLower(string(p)) }

type outRow struct {
	id        int64
	messageID uuid.UUID
	eventType string
	priority  string
	payload   json.RawMessage
	created   time.Time
}

// round publishes up to BatchSize unsent rows in id order, waits for the
// broker's confirms and marks them sent. A row the broker refused stops
// the round: it and the rows after it go again in the next.
func (r *Relay) round(ctx context.Context, db *pgx.Conn, ch *amqp.Channel) (int, error) {
	rows, err := db.Query(ctx, `SELECT id, message_id, event_type, priority, payload, created_at FROM bridge_notifications
		WHERE sent_at IS NULL ORDER BY id LIMIT $1`, r.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("read notifications: %w", err)
	}
	var out []outRow
	var o outRow
	if _, err := pgx.ForEachRow(rows, []any{&o.id, &o.messageID, &o.eventType, &o.priority, &o.payload, &o.created}, func() error {
		out = append(out, o)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("read notifications: %w", err)
	}
	if len(out) == 0 {
		return 0, nil
	}
	sent := out
	if ch != nil {
		sent, err = r.publish(ctx, ch, out)
	}
	if len(sent) > 0 {
		ids := make([]int64, len(sent))
		for i, s := range sent {
			ids[i] = s.id
			r.sent.WithLabelValues(s.eventType).Inc()
		}
		if _, uerr := db.Exec(ctx, `UPDATE bridge_notifications SET sent_at = now(), attempts = attempts + 1, last_error = NULL
			WHERE id = ANY($1)`, ids); uerr != nil {
			return 0, fmt.Errorf("mark notifications sent: %w", uerr)
		}
	}
	if err != nil {
		if len(sent) < len(out) {
			db.Exec(ctx, `UPDATE bridge_notifications SET attempts = attempts + 1, last_error = $2 WHERE id = $1`, //nolint:errcheck
				out[len(sent)].id, err.Error())
		}
		return len(sent), err
	}
	return len(sent), nil
}

// publish sends out on every topic and returns the prefix of out the
// broker confirmed.
func (r *Relay) publish(ctx context.Context, ch *amqp.Channel, out []outRow) ([]outRow, error) {
	type pending struct {
		row int
		dc  *amqp.DeferredConfirmation
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.ConfirmTimeout)
	defer cancel()
	var ps []pending
	var perr error
	confirmed := len(out) // rows up to the first that could not be published
publish:
	for i, o := range out {
		body, err := Envelope(o.messageID, r.cfg.PublisherID, o.eventType, o.priority, o.payload, o.created)
		if err != nil {
			perr, confirmed = fmt.Errorf("notification %d: %w", o.id, err), i
			break
		}
		for _, t := range r.cfg.Topics {
			dc, err := ch.PublishWithDeferredConfirmWithContext(pctx, r.cfg.Exchange, RoutingKey(t, Priority(o.priority)), false, false,
				amqp.Publishing{ContentType: "application/json", ContentEncoding: "utf-8", DeliveryMode: amqp.Persistent,
					MessageId: o.messageID.String(), Timestamp: o.created, Body: body})
			if err != nil {
				perr, confirmed = fmt.Errorf("publish notification %d: %w", o.id, err), i
				break publish
			}
			ps = append(ps, pending{row: i, dc: dc})
		}
	}
	for _, p := range ps {
		if p.row >= confirmed {
			break
		}
		ok, err := p.dc.WaitContext(pctx)
		if err != nil || !ok {
			if err == nil {
				err = errors.New("the broker refused it (nack)")
			}
			return out[:p.row], fmt.Errorf("publish notification %d: %w", out[p.row].id, err)
		}
	}
	return out[:confirmed], perr
}

// Envelope is the AMQP body of a notification, as oslo.messaging's
// messagingv2 driver writes it: {"oslo.version": "2.0", "oslo.message":
// "<the message as a JSON string>"}, the message holding message_id,
// publisher_id, event_type, priority, payload and timestamp (UTC,
// "2006-01-02 15:04:05.000000"), and _unique_id for listeners to drop
// duplicates.
func Envelope(messageID uuid.UUID, publisherID, eventType, priority string, payload json.RawMessage, at time.Time) ([]byte, error) {
	msg, err := json.Marshal(struct {
		MessageID   string          `json:"message_id"`
		PublisherID string          `json:"publisher_id"`
		EventType   string          `json:"event_type"`
		Priority    string          `json:"priority"`
		Payload     json.RawMessage `json:"payload"`
		Timestamp   string          `json:"timestamp"`
		UniqueID    string          `json:"_unique_id"`
	}{messageID.String(), publisherID, eventType, priority, payload, at.UTC().Format("2006-01-02 15:04:05.000000"),
		strings.ReplaceAll(messageID.String(), "-", "")})
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]string{"oslo.version": "2.0", "oslo.message": string(msg)})
}

// PurgeSent deletes up to n notifications sent before cutoff (the
// retention purge); it returns how many.
func PurgeSent(ctx context.Context, q Execer, cutoff time.Time, n int) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM bridge_notifications WHERE id IN (SELECT id FROM bridge_notifications
		WHERE sent_at < $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)`, cutoff, n)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
