package ingest

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/vgpu-bridge/vgpu-bridge/internal/amqpconn"
)

// ErrTopologyMismatch wraps a 406 PRECONDITION_FAILED from the broker: the
// exchange or queue exists with other arguments than configured.
var ErrTopologyMismatch = errors.New("broker topology does not match the configuration")

// IsTopologyMismatch reports whether err is a 406 mismatch.
func IsTopologyMismatch(err error) bool { return errors.Is(err, ErrTopologyMismatch) }

// CheckTopology connects to the first broker that answers, declares the
// exchange, queue and bindings as Run would, and disconnects. A mismatch
// with what the broker holds gives an error for which IsTopologyMismatch is
// true, naming the setting to change.
func (c *Consumer) CheckTopology(ctx context.Context) error {
	conn, _, err := amqpconn.Dial(c.amqp(), 0)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := c.declare(conn)
	if err != nil {
		return err
	}
	return ch.Close()
}

// amqp is how the consumer connects.
func (c *Consumer) amqp() amqpconn.Config {
	return amqpconn.Config{URLs: c.cfg.URLs, Name: c.cfg.ConnectionName, TLS: amqpconn.StaticTLS(c.cfg.TLS)}
}

// declare declares the exchange the way oslo.messaging does (or passively),
// the bridge's own durable queue and its bindings. It returns an open channel.
func (c *Consumer) declare(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	cfg := c.cfg
	if cfg.ExchangePassive {
		err = ch.ExchangeDeclarePassive(cfg.Exchange, amqp.ExchangeTopic, cfg.ExchangeDurable, cfg.ExchangeAutoDelete, false, false, nil)
	} else {
		err = ch.ExchangeDeclare(cfg.Exchange, amqp.ExchangeTopic, cfg.ExchangeDurable, cfg.ExchangeAutoDelete, false, false, nil)
	}
	if err != nil {
		return nil, explainExchange(cfg, err)
	}
	var args amqp.Table
	if cfg.QuorumQueue {
		args = amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	}
	if _, err := ch.QueueDeclare(cfg.Queue, true, false, false, false, args); err != nil {
		return nil, explainQueue(cfg, err)
	}
	for _, k := range cfg.BindingKeys {
		if err := ch.QueueBind(cfg.Queue, k, cfg.Exchange, false, nil); err != nil {
			return nil, fmt.Errorf("bind queue %q to exchange %q with %q: %w", cfg.Queue, cfg.Exchange, k, err)
		}
	}
	return ch, nil
}

func explainExchange(cfg Config, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case amqp.PreconditionFailed:
			return fmt.Errorf("%w: exchange %q exists with other arguments than durable=%v auto_delete=%v "+
				"(broker: %s). Set [notifications] exchange_durable to the value of Nova's "+
				"[oslo_messaging_rabbit] amqp_durable_queues (and exchange_auto_delete to amqp_auto_delete), "+
				"or set [notifications] exchange_passive = true", ErrTopologyMismatch, cfg.Exchange,
				cfg.ExchangeDurable, cfg.ExchangeAutoDelete, ae.Reason)
		case amqp.NotFound:
			return fmt.Errorf("exchange %q does not exist and [notifications] exchange_passive = true: "+
				"start Nova with notifications enabled, or let the bridge declare it (broker: %s)", cfg.Exchange, ae.Reason)
		case amqp.AccessRefused:
			return fmt.Errorf("no permission to declare exchange %q (broker: %s): grant configure on it, "+
				"or set [notifications] exchange_passive = true", cfg.Exchange, ae.Reason)
		}
	}
	return fmt.Errorf("declare exchange %q: %w", cfg.Exchange, err)
}

func explainQueue(cfg Config, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		kind := "classic"
		if cfg.QuorumQueue {
			kind = "quorum"
		}
		return fmt.Errorf("%w: queue %q exists with other arguments than a durable %s queue (broker: %s). "+
			"Match [notifications] quorum_queue to the existing queue, or choose another [notifications] queue",
			ErrTopologyMismatch, cfg.Queue, kind, ae.Reason)
	}
	return fmt.Errorf("declare queue %q: %w", cfg.Queue, err)
}
