// Package ingest consumes Nova's versioned notifications from RabbitMQ into
// Postgres: it decodes each message (package nova), keeps it once in the
// inbox (events, deduplicated on message_id), dead-letters what can never be
// processed, updates the instance and flavor state out-of-order safely, and
// acknowledges a batch only after its transaction committed. It also serves
// the operator API over that state (/v1/instances, /v1/events,
// /v1/dead-letters).
package ingest

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Config configures a Consumer. Zero fields take the defaults of
// DefaultConfig.
type Config struct {
	// URLs are amqp:// or amqps:// URLs of the brokers, tried in order
	// (conf.TransportURL.AMQPURLs).
	URLs []string
	// TLS is used for amqps:// URLs; nil means the system roots.
	TLS *tls.Config
	// Source names the inbox's source column; "nova".
	Source string

	// Exchange is oslo's control exchange ("nova"), a topic exchange.
	Exchange string
	// ExchangeDurable must match oslo's [oslo_messaging_rabbit]
	// amqp_durable_queues (false by default) or the broker answers 406.
	ExchangeDurable bool
	// ExchangeAutoDelete must match oslo's amqp_auto_delete (false).
	ExchangeAutoDelete bool
	// ExchangePassive only checks that the exchange exists.
	ExchangePassive bool
	// Queue is the bridge's own durable queue; never the queue oslo names
	// like the routing key.
	Queue string
	// QuorumQueue declares Queue with x-queue-type=quorum.
	QuorumQueue bool
	// BindingKeys are the routing keys bound to Queue
	// ("versioned_notifications.info", "versioned_notifications.error").
	BindingKeys []string

	// Prefetch is the channel's QoS prefetch count.
	Prefetch int
	// BatchSize is the most messages committed in one transaction.
	BatchSize int
	// Committers is how many batches are committed concurrently (acks
	// stay in delivery order).
	Committers int
	// FlushInterval is the longest a partial batch waits.
	FlushInterval time.Duration
	// MaxMessageBytes: bigger bodies are dead letters ("oversize").
	MaxMessageBytes int
	// DeadLetterMaxBytes caps the raw body kept in dead_letters.
	DeadLetterMaxBytes int
	// SilenceWarning: when no notification arrived for this long, log the
	// Nova settings that turn versioned notifications on. 0 disables.
	SilenceWarning time.Duration
	// ReconnectMin and ReconnectMax bound the reconnect backoff.
	ReconnectMin, ReconnectMax time.Duration
	// ShutdownGrace bounds how long a stopping consumer may take to commit
	// and ack its in-flight batches.
	ShutdownGrace time.Duration
	// ConnectionName is shown in RabbitMQ's management UI.
	ConnectionName string
	// StallAfter: when commits to Postgres have failed for this long with
	// none succeeding, Ready fails (messages wait unacked on the broker).
	StallAfter time.Duration
	// ClockSkewTolerance is how far Nova's clocks may run ahead of the
	// bridge's: an event's state is ordered by its timestamp, but never by
	// a time later than this after the bridge received it.
	ClockSkewTolerance time.Duration

	// OnApplied, when set, is called for each new (non-duplicate) event
	// inside the batch's transaction, after the instance state is updated.
	// An error rolls the batch back; it is retried like a database error.
	// With Committers > 1, batches commit concurrently: events of different
	// batches may reach OnApplied out of delivery order (events.id and the
	// notification timestamp order them).
	OnApplied func(ctx context.Context, tx pgx.Tx, ev Event) error
	// OnCommitted, when set, is called after a commit that stored new
	// events, so the pipeline decides at once instead of at its next poll.
	OnCommitted func()
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	c.Source = cmp.Or(c.Source, d.Source)
	c.Exchange = cmp.Or(c.Exchange, d.Exchange)
	c.Queue = cmp.Or(c.Queue, d.Queue)
	if len(c.BindingKeys) == 0 {
		c.BindingKeys = d.BindingKeys
	}
	c.Prefetch = cmp.Or(c.Prefetch, d.Prefetch)
	c.BatchSize = cmp.Or(c.BatchSize, d.BatchSize)
	c.Committers = cmp.Or(c.Committers, d.Committers)
	c.FlushInterval = cmp.Or(c.FlushInterval, d.FlushInterval)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, d.MaxMessageBytes)
	c.DeadLetterMaxBytes = cmp.Or(c.DeadLetterMaxBytes, d.DeadLetterMaxBytes)
	c.ReconnectMin = cmp.Or(c.ReconnectMin, d.ReconnectMin)
	c.ReconnectMax = cmp.Or(c.ReconnectMax, d.ReconnectMax)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, d.ShutdownGrace)
	c.ConnectionName = cmp.Or(c.ConnectionName, d.ConnectionName)
	c.StallAfter = cmp.Or(c.StallAfter, d.StallAfter)
	c.ClockSkewTolerance = cmp.Or(c.ClockSkewTolerance, d.ClockSkewTolerance)
}

// Validate reports the first impossible setting.
func (c *Config) Validate() error {
	var errs []error
	if len(c.URLs) == 0 {
		errs = append(errs, errors.New("no broker URL"))
	}
	if c.BatchSize < 1 || c.Prefetch < 1 {
		errs = append(errs, fmt.Errorf("batch size %d and prefetch %d must be positive", c.BatchSize, c.Prefetch))
	}
	if c.Committers < 1 || c.Committers > 16 {
		errs = append(errs, fmt.Errorf("committers %d: want 1 to 16", c.Committers))
	}
	if c.Prefetch < c.BatchSize {
		errs = append(errs, fmt.Errorf("prefetch %d is smaller than the batch size %d: a batch could never fill", c.Prefetch, c.BatchSize))
	}
	for _, k := range c.BindingKeys {
		if k == c.Queue {
			errs = append(errs, fmt.Errorf("queue %q is named like a routing key: that is the queue oslo.messaging declares, which nobody must consume from; use a name of the bridge's own", c.Queue))
		}
	}
	if c.ReconnectMax < c.ReconnectMin {
		errs = append(errs, fmt.Errorf("reconnect max %v below min %v", c.ReconnectMax, c.ReconnectMin))
	}
	return errors.Join(errs...)
}
