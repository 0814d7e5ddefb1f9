package ingest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/internal/amqpconn"
	"github.com/vgpu-bridge/vgpu-bridge/internal/backoff"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/internal/wake"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

// Consumer consumes Nova's notifications into Postgres.
type Consumer struct {
	cfg  Config
	pool *pgxpool.Pool
	log  *slog.Logger
	m    *metrics

	started   time.Time
	lastMsg   atomic.Int64 // unix nanoseconds of the last delivery; 0: none yet
	connected atomic.Bool
	sessions  atomic.Int64

	failingSince atomic.Int64 // unix nanoseconds of the first failed commit since the last success; 0: none
	lastErr      atomic.Value // string: the last commit error
	// retryNow cuts a failed commit's backoff short (Ready asks for it),
	// and attempts counts commit attempts, so that Ready can wait for the
	// one it asked for.
	retryNow chan struct{}
	attempts atomic.Int64

	payloads sync.Pool // *[]byte: payload buffers of the batches (payloadBuf)
}

// New returns a Consumer. reg may be nil (no metrics exported).
func New(cfg Config, pool *pgxpool.Pool, reg prometheus.Registerer, log *slog.Logger) (*Consumer, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("notifications: %w", err)
	}
	if pool == nil {
		return nil, errors.New("notifications: no database pool")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Consumer{cfg: cfg, pool: pool, log: log, started: time.Now(), retryNow: make(chan struct{}, 1)}
	c.m = newMetrics(reg, c.sinceLast, func() float64 {
		if c.connected.Load() {
			return 1
		}
		return 0
	})
	return c, nil
}

// Connected reports whether a consuming session is up.
func (c *Consumer) Connected() bool { return c.connected.Load() }

// Sessions counts the consuming sessions started so far (1 + reconnects).
func (c *Consumer) Sessions() int64 { return c.sessions.Load() }

func (c *Consumer) sinceLast() float64 {
	t := c.lastMsg.Load()
	if t == 0 {
		return time.Since(c.started).Seconds()
	}
	return time.Since(time.Unix(0, t)).Seconds()
}

// Run consumes until ctx ends, reconnecting with capped exponential backoff
// and jitter on any connection, channel or consumer loss. It returns nil
// when ctx ends.
func (c *Consumer) Run(ctx context.Context) error {
	go c.watchSilence(ctx)
	var lastErr string
	amqpconn.Loop{
		Backoff: backoff.Policy{Min: c.cfg.ReconnectMin, Max: c.cfg.ReconnectMax},
		Healthy: c.cfg.ReconnectMax,
		Ended: func(err error, wait time.Duration) {
			c.m.reconnects.Inc()
			lvl := slog.LevelWarn
			if es := err.Error(); es != lastErr {
				lastErr = es
				lvl = slog.LevelError
			}
			c.log.Log(ctx, lvl, "notification consumer stopped; reconnecting", logkey.Err, err, logkey.Backoff, wait)
		},
	}.Run(ctx, func(ctx context.Context, n int) (bool, error) {
		defer c.connected.Store(false)
		return c.session(ctx, n)
	})
	return nil
}

// session runs one connection: dial (broker n first), declare, consume,
// commit, ack. delivered tells whether any batch was committed.
func (c *Consumer) session(ctx context.Context, n int) (bool, error) {
	conn, k, err := amqpconn.Dial(c.amqp(), n)
	if err != nil {
		return false, err
	}
	u := c.cfg.URLs[k]
	defer conn.Close()
	ch, err := c.declare(conn)
	if err != nil {
		return false, err
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return false, fmt.Errorf("qos: %w", err)
	}
	tag := fmt.Sprintf("vgpu-bridge-%d", rand.Int64())
	deliveries, err := ch.Consume(c.cfg.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("consume %s: %w", c.cfg.Queue, err)
	}
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := ch.NotifyCancel(make(chan string, 1))
	c.connected.Store(true)
	c.sessions.Add(1)
	c.log.Info("consuming Nova notifications", logkey.Broker, amqpconn.Redact(u), logkey.Queue, c.cfg.Queue,
		"exchange", c.cfg.Exchange, "binding_keys", c.cfg.BindingKeys)

	// Stages: this loop gathers deliveries into batches; Committers
	// goroutines decode and commit batches concurrently (so decoding uses
	// every core); one acker acks, in delivery order, the last tag of the
	// longest run of committed batches (multiple=true), so nothing is acked
	// before it is committed.
	var committed atomic.Bool
	type seqBatch struct {
		seq        uint64
		deliveries []amqp.Delivery
	}
	type doneBatch struct{ seq, tag uint64 }
	work := make(chan seqBatch, c.cfg.Committers)
	acks := make(chan doneBatch, 2*c.cfg.Committers)
	errc := make(chan error, c.cfg.Committers+1)
	report := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	commitCtx, abortCommit := context.WithCancel(context.WithoutCancel(ctx))
	defer abortCommit()
	var committers sync.WaitGroup
	for i := 0; i < c.cfg.Committers; i++ {
		committers.Add(1)
		go func() {
			defer committers.Done()
			for b := range work {
				items := make([]*item, len(b.deliveries))
				for i := range b.deliveries {
					items[i] = c.decode(&b.deliveries[i])
				}
				if err := c.commit(commitCtx, items); err != nil {
					report(err)
					abortCommit() // the others stop too: their batches are redelivered
					return
				}
				acks <- doneBatch{b.seq, items[len(items)-1].tag}
			}
		}()
	}
	ackerDone := make(chan struct{})
	go func() {
		defer close(ackerDone)
		next, done := uint64(1), map[uint64]uint64{}
		failed := false
		for d := range acks {
			done[d.seq] = d.tag
			var last uint64
			for t, ok := done[next]; ok; t, ok = done[next] {
				delete(done, next)
				last = t
				next++
			}
			if last == 0 || failed {
				continue
			}
			if err := ch.Ack(last, true); err != nil {
				report(fmt.Errorf("ack after commit (the broker will redeliver; duplicates are ignored): %w", err))
				failed = true
				continue
			}
			committed.Store(true)
		}
	}()
	// finish lets the committers end their work: within grace on a clean
	// shutdown, at once when the session failed (unacked messages are
	// redelivered and deduplicated).
	finish := func(grace time.Duration) {
		close(work)
		all := make(chan struct{})
		go func() { committers.Wait(); close(acks); <-ackerDone; close(all) }()
		select {
		case <-all:
		case <-time.After(grace):
			abortCommit()
			<-all
		}
	}
	var seq uint64

	batch := make([]amqp.Delivery, 0, c.cfg.BatchSize)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// flush hands the batch to the committer, unless stop fires first.
	flush := func(stop <-chan struct{}) error {
		if len(batch) == 0 {
			return nil
		}
		select {
		case work <- seqBatch{seq + 1, batch}:
			seq++
		case err := <-errc:
			return err
		case <-stop:
			return errStopped
		}
		batch = make([]amqp.Delivery, 0, c.cfg.BatchSize)
		return nil
	}
	// shutdown finishes the in-flight batches within ShutdownGrace; what is
	// not acked is requeued by the broker when the channel closes.
	shutdown := func() (bool, error) {
		deadline := time.Now().Add(c.cfg.ShutdownGrace)
		sctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		err := flush(sctx.Done())
		if err == nil {
			finish(time.Until(deadline))
			select {
			case err = <-errc:
			default:
			}
		} else {
			finish(0)
		}
		if err != nil {
			c.log.Warn("in-flight batch not committed on shutdown; the broker requeues it", logkey.Err, err)
		}
		_ = ch.Cancel(tag, false)
		return committed.Load(), ctx.Err()
	}
	fail := func(err error) (bool, error) {
		finish(0)
		return committed.Load(), err
	}
	for {
		select {
		case <-ctx.Done():
			return shutdown()
		case err := <-errc:
			return fail(err)
		case e := <-connClosed:
			return fail(fmt.Errorf("connection closed: %w", amqpErr(e)))
		case e := <-chClosed:
			return fail(fmt.Errorf("channel closed: %w", amqpErr(e)))
		case q := <-cancelled:
			return fail(fmt.Errorf("broker cancelled consumer %s (queue %s deleted or node down)", q, c.cfg.Queue))
		case d, ok := <-deliveries:
			if !ok {
				return fail(errors.New("delivery channel closed"))
			}
			if len(batch) == 0 {
				timer.Reset(c.cfg.FlushInterval)
			}
			c.lastMsg.Store(time.Now().UnixNano())
			c.m.received.Inc()
			batch = append(batch, d)
			if len(batch) >= c.cfg.BatchSize {
				timer.Stop()
				if err := flush(ctx.Done()); err == errStopped {
					return shutdown()
				} else if err != nil {
					return fail(err)
				}
			}
		case <-timer.C:
			if err := flush(ctx.Done()); err == errStopped {
				return shutdown()
			} else if err != nil {
				return fail(err)
			}
		}
	}
}

var errStopped = errors.New("stopped")

func amqpErr(e *amqp.Error) error {
	if e == nil {
		return errors.New("closed normally")
	}
	return e
}

// commit applies a batch, retrying database errors with backoff until ctx
// ends. A batch Postgres refuses as data is applied one by one (see
// commitOne), so a message Postgres refuses can never hold up the others.
func (c *Consumer) commit(ctx context.Context, batch []*item) error {
	for attempt := 0; ; attempt++ {
		err := c.apply(ctx, batch)
		if err == nil {
			return nil
		}
		if isDataError(err) {
			for _, it := range batch {
				if err := c.commitOne(ctx, it); err != nil {
					return err
				}
			}
			return nil
		}
		if err := c.retryWait(ctx, err, attempt, len(batch)); err != nil {
			return err
		}
	}
}

// commitOne applies one message. Each data error Postgres answers moves the
// message one step down a ladder that always ends: the event, then a dead
// letter with its body and delivery headers, then a minimal dead letter
// (reason and cleaned detail only), then dropped and counted. Other errors
// are retried with backoff until ctx ends.
func (c *Consumer) commitOne(ctx context.Context, it *item) error {
	for attempt := 0; ; attempt++ {
		err := c.apply(ctx, []*item{it})
		if err == nil {
			return nil
		}
		if isDataError(err) {
			next := c.demote(it, err)
			if next == nil {
				c.m.dropped.Inc()
				c.log.Error("message refused by the database even as a minimal dead letter; dropped",
					logkey.MessageID, it.msgID, logkey.Reason, it.reason, logkey.Err, err)
				return nil
			}
			it = next
			attempt = -1
			continue
		}
		if err := c.retryWait(ctx, err, attempt, 1); err != nil {
			return err
		}
	}
}

// demote returns the next, simpler form of a message Postgres refused, or
// nil when it has none left.
func (c *Consumer) demote(it *item, err error) *item {
	detail := "database refused it: " + err.Error()
	switch {
	case it.ev != nil:
		c.log.Warn("message refused by the database; dead-lettered", logkey.MessageID, it.msgID, logkey.Err, err)
		return c.deadLetter(it.src, it.tag, ReasonSchema, detail, it.msgID)
	case !it.minimal:
		c.log.Warn("dead letter refused by the database; keeping a minimal one", logkey.MessageID, it.msgID, logkey.Err, err)
		return &item{tag: it.tag, reason: it.reason, minimal: true, dedupeKey: it.dedupeKey,
			detail:  cleanText("dead letter refused by the database (" + err.Error() + "); first refusal: " + it.detail),
			headers: []byte("{}")}
	}
	return nil
}

// cleanText makes s storable as Postgres text: valid UTF-8, no NUL.
func cleanText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\ufffd"), "\x00", "\\0")
}

// retryWait waits before the next attempt: at
// once for a deadlock between concurrent batches (the first ten times),
// else with backoff. It returns err when ctx ends first.
func (c *Consumer) retryWait(ctx context.Context, err error, attempt, n int) error {
	if isConflict(err) && attempt < 10 {
		return nil
	}
	if ctx.Err() != nil {
		return err
	}
	d := backoff.Policy{Min: c.cfg.ReconnectMin, Max: c.cfg.ReconnectMax}.Delay(attempt)
	c.log.Error("commit failed; retrying", logkey.Err, err, logkey.Batch, n, logkey.Backoff, d)
	select {
	case <-ctx.Done():
		return err
	case <-time.After(d):
		return nil
	case <-c.retryNow:
		return nil
	}
}

// apply commits items once and keeps the books: metrics, readiness and
// the pipeline's wake on success, the failure count and error otherwise.
func (c *Consumer) apply(ctx context.Context, items []*item) error {
	start := time.Now()
	res, err := c.applyBatch(ctx, items)
	defer c.attempts.Add(1)
	if err != nil {
		c.failed(err)
		return err
	}
	c.committed()
	c.m.observe(res, time.Since(start))
	c.wake(res)
	return nil
}

// wake calls OnCommitted when a commit stored new events.
func (c *Consumer) wake(res batchResult) {
	if res.applied > 0 && c.cfg.OnCommitted != nil {
		c.cfg.OnCommitted()
	}
}

// committed and failed keep the state Ready reports: since when commits
// have failed without one succeeding, and the last error.
func (c *Consumer) committed() { c.failingSince.Store(0) }

func (c *Consumer) failed(err error) {
	c.m.commitErrors.Inc()
	c.failingSince.CompareAndSwap(0, time.Now().UnixNano())
	c.lastErr.Store(err.Error())
}

// Ready fails while commits to Postgres have failed, none succeeding, for
// longer than StallAfter: messages are then held on the broker, unacked.
// While they fail it does not report a stale state: it cuts the retry's
// backoff short and waits (as long as ctx allows) for that attempt, so
// the first check after Postgres is back is ready.
func (c *Consumer) Ready(ctx context.Context) error {
	since := c.failingSince.Load()
	if since == 0 {
		return nil
	}
	if time.Since(time.Unix(0, since)) < c.cfg.StallAfter {
		return nil
	}
	n := c.attempts.Load()
	select {
	case c.retryNow <- struct{}{}:
	default:
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for c.attempts.Load() == n && c.failingSince.Load() != 0 {
		select {
		case <-ctx.Done():
		case <-t.C:
			continue
		}
		break
	}
	if since = c.failingSince.Load(); since == 0 {
		return nil
	}
	d := time.Since(time.Unix(0, since))
	msg, _ := c.lastErr.Load().(string)
	return fmt.Errorf("notification commits failing for %s: %s", d.Round(time.Second), msg)
}

// decode turns a delivery into an event or a dead letter.
func (c *Consumer) decode(d *amqp.Delivery) *item {
	it := &item{tag: d.DeliveryTag, src: d}
	dead := func(reason, detail string) *item {
		c.log.Warn("dead letter", logkey.Reason, reason, "detail", detail, "routing_key", d.RoutingKey)
		return c.deadLetter(d, d.DeliveryTag, reason, detail, it.msgID)
	}
	if len(d.Body) > c.cfg.MaxMessageBytes {
		return dead(ReasonOversize, fmt.Sprintf("%d bytes, more than max_message_bytes %d", len(d.Body), c.cfg.MaxMessageBytes))
	}
	m, err := nova.Decode(d.Body)
	if err != nil {
		return dead(string(nova.KindOf(err)), err.Error())
	}
	if err := storable(m); err != nil {
		return dead(ReasonSchema, err.Error())
	}
	if len(m.MessageID) <= 255 {
		it.msgID = m.MessageID
	}
	ev := &Event{Source: c.cfg.Source, Message: m}
	p, err := m.Decode()
	switch {
	case err == nil:
		ev.Payload = p
	case nova.KindOf(err) == nova.KindUnknownVersion:
		ev.Status, ev.Detail = statusUnrecognized, err.Error()
	default:
		return dead(ReasonSchema, err.Error())
	}
	if !m.Event.KnownEvent() && ev.Status == "" {
		ev.Status, ev.Detail = statusUnrecognized, "unknown event type "+m.EventType
	}
	switch p := ev.Payload.(type) {
	case *nova.InstanceAction:
		ev.InstanceUUID = p.UUID
	case *nova.InstanceUpdate:
		ev.InstanceUUID = p.UUID
	case *nova.ComputeTask:
		ev.InstanceUUID = p.InstanceUUID
	}
	it.ev = ev
	return it
}

// deadLetter makes the dead letter of delivery d: its body (capped at
// DeadLetterMaxBytes, tokens redacted) and delivery headers.
func (c *Consumer) deadLetter(d *amqp.Delivery, tag uint64, reason, detail, msgID string) *item {
	it := &item{tag: tag, reason: reason, detail: cleanText(detail), msgID: msgID, src: d, dedupeKey: dedupeKey(msgID, d.Body)}
	it.raw = d.Body
	if len(it.raw) > c.cfg.DeadLetterMaxBytes {
		it.raw, it.truncated = it.raw[:c.cfg.DeadLetterMaxBytes], true
	}
	it.raw = redactTokens(append([]byte(nil), it.raw...))
	it.headers, _ = json.Marshal(map[string]any{
		"exchange": d.Exchange, "routing_key": d.RoutingKey, "redelivered": d.Redelivered,
		"content_type": d.ContentType, "size": len(d.Body),
	})
	return it
}

// dedupeKey is a dead letter's key of uniqueness within its source: its
// message_id when it decoded far enough to have one, else the SHA-256 of
// the body as delivered (a redelivery carries the same bytes).
func dedupeKey(msgID string, body []byte) string {
	if msgID != "" {
		return "id:" + msgID
	}
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// watchSilence logs a hint naming Nova's settings when no notification
// arrived for SilenceWarning, once per silent period.
func (c *Consumer) watchSilence(ctx context.Context) {
	if c.cfg.SilenceWarning <= 0 {
		return
	}
	period := c.cfg.SilenceWarning / 4
	if period < 10*time.Millisecond {
		period = 10 * time.Millisecond
	}
	var warnedAt int64 = -1
	wake.Every(ctx, period, func(context.Context) {
		last := c.lastMsg.Load()
		silent := time.Duration(c.sinceLast() * float64(time.Second))
		if silent >= c.cfg.SilenceWarning && last != warnedAt {
			warnedAt = last
			c.log.Warn("no Nova notification received; check that Nova sends versioned notifications: "+
				"nova.conf [notifications] notification_format = versioned (or both) and "+
				"[oslo_messaging_notifications] driver = messagingv2, with the same transport_url and "+
				"topics "+fmt.Sprint(c.cfg.BindingKeys),
				logkey.SilentFor, silent.Round(time.Second), logkey.Queue, c.cfg.Queue)
		}
	})
}

// tokenRE finds the value of oslo's flattened _context_auth_token (also
// inside the JSON-encoded oslo.message string, where quotes are escaped).
var tokenRE = regexp.MustCompile(`(_context_auth_token\\?"\s*:\s*\\?")[^"\\]+`)

// redactTokens blanks Keystone tokens out of a raw body before it is kept.
func redactTokens(b []byte) []byte {
	if !bytes.Contains(b, []byte("_context_auth_token")) {
		return b
	}
	return tokenRE.ReplaceAll(b, []byte("${1}***"))
}
